#include "zrt/runtime/engine_config.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace zrt {

std::string_view LrScheduleKindName(LrSchedule::Kind k) {
  switch (k) {
    case LrSchedule::Kind::kConstant: return "constant";
    case LrSchedule::Kind::kWarmupConstant: return "warmup_constant";
    case LrSchedule::Kind::kLinear: return "linear";
    case LrSchedule::Kind::kCosine: return "cosine";
  }
  return "?";
}

Result<LrSchedule::Kind> ParseLrScheduleKind(std::string_view s) {
  for (auto k : {LrSchedule::Kind::kConstant, LrSchedule::Kind::kWarmupConstant, LrSchedule::Kind::kLinear, LrSchedule::Kind::kCosine}) {
    if (s == LrScheduleKindName(k)) return k;
  }
  return InvalidArgumentError("lr schedule must be constant, warmup_constant, linear or cosine, got '", s, "'");
}

Status LrSchedule::Validate() const {
  if (warmup_steps < 0) return InvalidArgumentError("lr schedule: warmup_steps must be >= 0, got ", warmup_steps);
  if (kind == Kind::kLinear || kind == Kind::kCosine) {
    if (total_steps <= warmup_steps) {
      return InvalidArgumentError("lr schedule ", LrScheduleKindName(kind), ": total_steps (", total_steps,
                                  ") must be greater than warmup_steps (", warmup_steps, ")");
    }
  }
  if (!(min_lr_ratio >= 0 && min_lr_ratio <= 1)) {
    return InvalidArgumentError("lr schedule: min_lr_ratio must be in [0, 1], got ", min_lr_ratio);
  }
  if (min_lr_ratio != 0 && kind != Kind::kCosine) return InvalidArgumentError("lr schedule: min_lr_ratio applies to cosine only");
  return Status();
}

double LrSchedule::Factor(int64_t step) const {
  if (kind == Kind::kConstant) return 1.0;
  if (step < warmup_steps) return static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, warmup_steps));
  if (kind == Kind::kWarmupConstant) return 1.0;
  const double t = static_cast<double>(std::min(step, total_steps) - warmup_steps);
  const double span = static_cast<double>(total_steps - warmup_steps);
  if (kind == Kind::kLinear) return std::max(0.0, (span - t) / span);
  const double cosine = 0.5 * (1.0 + std::cos(std::numbers::pi * t / span));
  return min_lr_ratio + (1.0 - min_lr_ratio) * cosine;
}

}  // namespace zrt
