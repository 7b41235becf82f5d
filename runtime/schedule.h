// LrSchedule: the learning-rate multiplier at each optimizer step, as the usual schedules define it
// (transformers' get_*_schedule_with_warmup, which torch runs as LambdaLR; without warmup, torch's
// CosineAnnealingLR and LinearLR; values checked against PyTorch in schedule_test.cc):
//
//   kind              factor(t), t = optimizer steps taken before this one (0 at the first step)
//   constant          1
//   warmup_constant   t < W ? t / W : 1
//   linear            t < W ? t / W : max(0, (T - t) / (T - W))                      (HF "linear")
//   cosine            t < W ? t / W : f + (1 - f) * (1 + cos(pi * p)) / 2,  p = (t - W) / (T - W)
//                       (HF "cosine" with f = min_lr_ratio = 0; "cosine_with_min_lr" otherwise)
//
// W = warmup_steps, T = total_steps. With W = 0 the warmup is absent (factor(0) = 1, as HF's max(1, W)
// denominators give). Past T, linear stays 0 and cosine stays at f (HF's cosine would climb back up:
// training past the schedule's end holds its last value instead). The engine applies it at Step:
// lr = adam.lr * factor(steps()) * the tensor's lr_scale. Skipped steps (fp16 overflow) do not advance
// t, as in DeepSpeed.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "zrt/core/status.h"

namespace zrt {

struct LrSchedule {
  enum class Kind { kConstant, kWarmupConstant, kLinear, kCosine };
  Kind kind = Kind::kConstant;
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;    // linear and cosine: the step at which the decay ends (> warmup_steps)
  double min_lr_ratio = 0;    // cosine: the floor, as a fraction of the peak lr (0..1)

  static LrSchedule Constant() { return {}; }
  static LrSchedule WarmupConstant(int64_t warmup) { return {Kind::kWarmupConstant, warmup, 0, 0}; }
  static LrSchedule Linear(int64_t warmup, int64_t total) { return {Kind::kLinear, warmup, total, 0}; }
  static LrSchedule Cosine(int64_t warmup, int64_t total, double min_lr_ratio = 0) {
    return {Kind::kCosine, warmup, total, min_lr_ratio};
  }

  Status Validate() const;
  double Factor(int64_t step) const;  // precondition: Validate() is OK, step >= 0

  friend bool operator==(const LrSchedule&, const LrSchedule&) = default;
};

// "constant", "warmup_constant", "linear", "cosine".
std::string_view LrScheduleKindName(LrSchedule::Kind k);
Result<LrSchedule::Kind> ParseLrScheduleKind(std::string_view s);

}  // namespace zrt
