#include "zrt/runtime/loss_scaler.h"

#include <algorithm>
#include <cmath>

namespace zrt {

Result<LossScaleMode> ParseLossScaleMode(std::string_view s) {
  if (s == "none") return LossScaleMode::kNone;
  if (s == "static") return LossScaleMode::kStatic;
  if (s == "dynamic") return LossScaleMode::kDynamic;
  return InvalidArgumentError("unknown loss scale mode '", s, "' (none, static, dynamic)");
}

Result<LossScaler> LossScaler::Create(const LossScaleConfig& c) {
  if (c.mode != LossScaleMode::kNone) {
    if (!(c.init_scale > 0) || !std::isfinite(c.init_scale)) {
      return InvalidArgumentError("loss scale: init_scale must be finite and > 0, got ", c.init_scale);
    }
  }
  if (c.mode == LossScaleMode::kDynamic) {
    if (!(c.growth >= 1)) return InvalidArgumentError("loss scale: growth must be >= 1, got ", c.growth);
    if (!(c.backoff > 0 && c.backoff < 1)) return InvalidArgumentError("loss scale: backoff must be in (0, 1), got ", c.backoff);
    if (c.growth_interval < 1) return InvalidArgumentError("loss scale: growth_interval must be >= 1");
    if (c.hysteresis < 1) return InvalidArgumentError("loss scale: hysteresis must be >= 1");
    if (!(c.min_scale > 0) || c.min_scale > c.init_scale) {
      return InvalidArgumentError("loss scale: min_scale must be in (0, init_scale], got ", c.min_scale);
    }
  }
  LossScaler s;
  s.c_ = c;
  s.scale_ = c.mode == LossScaleMode::kNone ? 1.0 : c.init_scale;
  s.hysteresis_left_ = c.hysteresis;
  return s;
}

void LossScaler::Update(bool overflow) {
  if (c_.mode != LossScaleMode::kDynamic) return;
  if (overflow) {
    good_steps_ = 0;
    if (--hysteresis_left_ <= 0) {
      scale_ = std::max(c_.min_scale, scale_ * c_.backoff);
      hysteresis_left_ = c_.hysteresis;
    }
    return;
  }
  if (++good_steps_ >= c_.growth_interval) {
    scale_ *= c_.growth;
    good_steps_ = 0;
    hysteresis_left_ = c_.hysteresis;
  }
}

void LossScaler::set_state(const State& s) {
  scale_ = s.scale;
  good_steps_ = s.good_steps;
  hysteresis_left_ = s.hysteresis_left;
}

}  // namespace zrt
