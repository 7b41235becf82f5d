#include "zrt/runtime/engine_config.h"

#include <gtest/gtest.h>

#include <vector>

namespace zrt {
namespace {

// Reference values computed with PyTorch 1.13 (Debian's python3-torch) by
// scripts/reference/lr_schedules.py: transformers' schedules as torch runs them (LambdaLR over
// get_constant_schedule_with_warmup's, get_linear_schedule_with_warmup's,
// get_cosine_schedule_with_warmup's and get_cosine_with_min_lr_schedule_with_warmup's lambdas), and
// torch's own CosineAnnealingLR and LinearLR, read with get_last_lr() before each optimizer step.
// At steps 0, 1, 5, 9, 10, 11, 37, 50, 99, 100 with W = 10, T = 100.
const std::vector<int64_t> kSteps = {0, 1, 5, 9, 10, 11, 37, 50, 99, 100};
const std::vector<double> kWarmupConstant = {0.0, 0.1, 0.5, 0.9, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0};
const std::vector<double> kLinear = {0.0, 0.1, 0.5, 0.9, 1.0, 0.9888888888888889, 0.7, 0.5555555555555556, 0.011111111111111112, 0.0};
const std::vector<double> kCosine = {0.0, 0.1, 0.5, 0.9, 1.0, 0.9996954135095479, 0.7938926261462366, 0.5868240888334653,
                                     0.00030458649045211894, 0.0};
const std::vector<double> kCosineMin = {0.0, 0.1, 0.5, 0.9, 1.0, 0.9997258721585931, 0.8145033635316129, 0.6281416799501187,
                                        0.10027412784140691, 0.1};
// Steps 0..7: CosineAnnealingLR(T_max = 7, eta_min = 0 and 0.25), LinearLR(1 -> 0 over 7).
const std::vector<double> kCosineAnnealing = {1.0, 0.9504844339512095, 0.8117449009293668, 0.6112604669781572, 0.38873953302184283,
                                              0.18825509907063326, 0.04951556604879048, 0.0};
const std::vector<double> kCosineAnnealingMin = {1.0, 0.9628633254634071, 0.858808675697025, 0.7084453502336179, 0.5415546497663821,
                                                 0.39119132430297493, 0.28713667453659286, 0.25};
const std::vector<double> kLinearLR = {1.0, 0.8571428571428572, 0.7142857142857144, 0.5714285714285715, 0.4285714285714286,
                                       0.28571428571428575, 0.14285714285714288, 0.0};

void ExpectValues(const LrSchedule& s, const std::vector<int64_t>& steps, const std::vector<double>& want) {
  ASSERT_TRUE(s.Validate().ok()) << s.Validate();
  for (size_t i = 0; i < steps.size(); ++i) {
    EXPECT_NEAR(s.Factor(steps[i]), want[i], 1e-15) << LrScheduleKindName(s.kind) << " at step " << steps[i];
  }
}

TEST(LrSchedule, MatchesTorchAndTransformersSchedulesValueForValue) {
  ExpectValues(LrSchedule::WarmupConstant(10), kSteps, kWarmupConstant);
  ExpectValues(LrSchedule::Linear(10, 100), kSteps, kLinear);
  ExpectValues(LrSchedule::Cosine(10, 100), kSteps, kCosine);
  ExpectValues(LrSchedule::Cosine(10, 100, 0.1), kSteps, kCosineMin);
  const std::vector<int64_t> seven = {0, 1, 2, 3, 4, 5, 6, 7};
  ExpectValues(LrSchedule::Cosine(0, 7), seven, kCosineAnnealing);
  ExpectValues(LrSchedule::Cosine(0, 7, 0.25), seven, kCosineAnnealingMin);
  ExpectValues(LrSchedule::Linear(0, 7), seven, kLinearLR);
  for (int64_t t : {0, 1, 1000000}) EXPECT_EQ(LrSchedule::Constant().Factor(t), 1.0);
}

TEST(LrSchedule, PastTheEndHoldsTheLastValue) {
  EXPECT_EQ(LrSchedule::Linear(10, 100).Factor(150), 0.0);
  EXPECT_EQ(LrSchedule::Cosine(10, 100).Factor(150), 0.0);  // HF's cosine would climb back to 0.5 here
  EXPECT_NEAR(LrSchedule::Cosine(10, 100, 0.25).Factor(1000), 0.25, 1e-15);
}

TEST(LrSchedule, BadSchedulesAreRefused) {
  EXPECT_FALSE(LrSchedule::Linear(10, 10).Validate().ok());
  EXPECT_FALSE(LrSchedule::Cosine(5, 0).Validate().ok());
  EXPECT_FALSE(LrSchedule::Cosine(0, 10, 1.5).Validate().ok());
  EXPECT_FALSE(LrSchedule::Cosine(0, 10, -0.1).Validate().ok());
  EXPECT_FALSE(LrSchedule::WarmupConstant(-1).Validate().ok());
  LrSchedule floor_on_linear = LrSchedule::Linear(0, 10);
  floor_on_linear.min_lr_ratio = 0.1;
  EXPECT_FALSE(floor_on_linear.Validate().ok());
  EXPECT_TRUE(LrSchedule::WarmupConstant(0).Validate().ok());
  for (auto k : {LrSchedule::Kind::kConstant, LrSchedule::Kind::kWarmupConstant, LrSchedule::Kind::kLinear, LrSchedule::Kind::kCosine}) {
    EXPECT_EQ(ParseLrScheduleKind(LrScheduleKindName(k)).value(), k);
  }
  EXPECT_FALSE(ParseLrScheduleKind("cosine_annealing").ok());
}

}  // namespace
}  // namespace zrt
