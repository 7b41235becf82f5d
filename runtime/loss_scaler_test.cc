#include "zrt/runtime/loss_scaler.h"

#include <gtest/gtest.h>

namespace zrt {
namespace {

TEST(LossScaler, DynamicLikeTorchGradScaler) {
  LossScaleConfig c;
  c.mode = LossScaleMode::kDynamic;
  c.init_scale = 1024;
  c.growth_interval = 3;
  auto s = LossScaler::Create(c);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->scale(), 1024);
  s->Update(true);  // overflow: back off at once (hysteresis 1)
  EXPECT_EQ(s->scale(), 512);
  s->Update(false);
  s->Update(false);
  EXPECT_EQ(s->scale(), 512);
  s->Update(false);  // third good step in a row: grow
  EXPECT_EQ(s->scale(), 1024);
  s->Update(false);
  s->Update(true);  // an overflow resets the growth count
  s->Update(false);
  s->Update(false);
  EXPECT_EQ(s->scale(), 512);
}

TEST(LossScaler, HysteresisAndMinimum) {
  LossScaleConfig c;
  c.mode = LossScaleMode::kDynamic;
  c.init_scale = 4;
  c.hysteresis = 2;
  c.min_scale = 2;
  auto s = LossScaler::Create(c);
  ASSERT_TRUE(s.ok());
  s->Update(true);  // first overflow only counts down
  EXPECT_EQ(s->scale(), 4);
  s->Update(true);
  EXPECT_EQ(s->scale(), 2);
  s->Update(true);
  s->Update(true);
  EXPECT_EQ(s->scale(), 2);  // clamped at min_scale
  auto st = s->state();
  LossScaler other = *LossScaler::Create(c);
  other.set_state(st);
  EXPECT_EQ(other.scale(), 2);
}

TEST(LossScaler, StaticAndNoneNeverChange) {
  LossScaleConfig c;
  c.mode = LossScaleMode::kStatic;
  c.init_scale = 128;
  auto s = LossScaler::Create(c);
  s->Update(true);
  EXPECT_EQ(s->scale(), 128);
  auto none = LossScaler::Create(LossScaleConfig{});
  EXPECT_EQ(none->scale(), 1);
}

TEST(LossScaler, BadConfigIsRejected) {
  LossScaleConfig c;
  c.mode = LossScaleMode::kDynamic;
  c.backoff = 1.5;
  EXPECT_EQ(LossScaler::Create(c).status().code(), StatusCode::kInvalidArgument);
  c.backoff = 0.5;
  c.init_scale = -1;
  EXPECT_EQ(LossScaler::Create(c).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseLossScaleMode("sometimes").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(*ParseLossScaleMode("dynamic"), LossScaleMode::kDynamic);
}

}  // namespace
}  // namespace zrt
