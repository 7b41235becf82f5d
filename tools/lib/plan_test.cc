#include <gtest/gtest.h>

#include <sstream>

#include <nlohmann/json.hpp>

#include "tools/lib/plan.h"

namespace zrt::tools {
namespace {

nlohmann::json PlanJson(const PlanInput& in) {
  std::ostringstream os;
  Status s = Plan(in, true, os);
  EXPECT_TRUE(s.ok()) << s;
  return nlohmann::json::parse(os.str());
}

TEST(Plan, ZeroFormulas) {
  PlanInput in;
  in.params = 7.5e9;  // the ZeRO paper's example: 7.5B parameters on 64 GPUs
  in.gpus = 64;
  const double expect[] = {120e9, 31.4e9, 16.6e9, 1.88e9};  // paper, Figure 1 (GB)
  for (int stage = 0; stage <= 3; ++stage) {
    in.stage = stage;
    const auto j = PlanJson(in);
    EXPECT_NEAR(j["device"]["model_states"].get<double>(), expect[stage], 0.01 * expect[stage]) << "stage " << stage;
  }
  in.stage = 2;
  EXPECT_NEAR(PlanJson(in)["comm_bytes_per_step"].get<double>(), 2 * 7.5e9 * 2 * 63 / 64, 1e3);
  in.stage = 3;
  EXPECT_NEAR(PlanJson(in)["comm_bytes_per_step"].get<double>(), 3 * 7.5e9 * 2 * 63 / 64, 1e3);
  in.offload = "cpu";
  EXPECT_EQ(PlanJson(in)["device"]["optimizer"].get<double>(), 0);
  EXPECT_GT(PlanJson(in)["host"].get<double>(), 0);
}

TEST(Plan, TransformerShapeActivationsAndTime) {
  PlanInput in;  // GPT-3 175B-like shape
  in.layers = 96;
  in.hidden = 12288;
  in.heads = 96;
  in.seq = 2048;
  in.vocab = 51200;
  in.batch = 1;
  in.gpus = 1024;
  in.tokens = 300e9;
  in.tflops = 140;
  in.power_watts = 400;
  const auto j = PlanJson(in);
  EXPECT_NEAR(j["params"].get<double>(), 175e9, 0.02 * 175e9);
  // Per layer s*b*h*(34 + 5*a*s/h); full recomputation keeps 2*s*b*h per layer.
  EXPECT_NEAR(j["device"]["activations"].get<double>(), 96.0 * 2048 * 12288 * (34 + 5.0 * 96 * 2048 / 12288), 1e6);
  EXPECT_NEAR(j["device"]["activations_recompute"].get<double>(), 96.0 * 2 * 2048 * 12288, 1e3);
  const double p = j["params"].get<double>();
  EXPECT_NEAR(j["train_seconds"]["with_recompute"].get<double>(), 8 * p * 300e9 / (1024 * 140e12), 1);
  EXPECT_GT(j["energy_kwh"]["with_recompute"].get<double>(), 0);
}

TEST(Plan, NonsenseIsRejected) {
  std::ostringstream os;
  PlanInput in;
  EXPECT_EQ(Plan(in, false, os).code(), StatusCode::kInvalidArgument);  // no size
  in.params = 1e9;
  in.gpus = 0;
  EXPECT_EQ(Plan(in, false, os).code(), StatusCode::kInvalidArgument);
  in.gpus = 8;
  in.stage = 7;
  EXPECT_EQ(Plan(in, false, os).code(), StatusCode::kInvalidArgument);
  in.stage = 1;
  in.offload = "nvme";
  EXPECT_EQ(Plan(in, false, os).code(), StatusCode::kInvalidArgument);
  in.offload = "tape";
  in.stage = 3;
  EXPECT_EQ(Plan(in, false, os).code(), StatusCode::kInvalidArgument);
  PlanInput shape;
  shape.layers = 2;
  shape.hidden = 10;
  shape.heads = 3;
  shape.seq = 8;
  shape.vocab = 10;
  EXPECT_EQ(Plan(shape, false, os).code(), StatusCode::kInvalidArgument);  // hidden % heads
}

}  // namespace
}  // namespace zrt::tools
