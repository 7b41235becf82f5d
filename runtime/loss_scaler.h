// Loss scaling for fp16 training: static, or dynamic with growth, backoff, hysteresis and a minimum.
//
// Dynamic (torch.cuda.amp.GradScaler semantics when hysteresis = 1): an overflow step is skipped and
// the scale multiplied by `backoff` (not below `min_scale`); after `growth_interval` consecutive good
// steps it is multiplied by `growth`. With hysteresis h > 1, the first h-1 overflows of a run only
// count down (DeepSpeed's delayed shift); the scale backs off at the h-th. Not thread-safe.
#pragma once

#include <cstdint>
#include <string_view>

#include "zrt/core/status.h"
#include "zrt/runtime/engine_config.h"

namespace zrt {

class LossScaler {
 public:
  static Result<LossScaler> Create(const LossScaleConfig& c);
  double scale() const { return scale_; }
  // Records the outcome of a step (overflow = some gradient was inf/NaN); updates the scale.
  void Update(bool overflow);
  // For checkpoints: the whole state.
  struct State {
    double scale;
    int64_t good_steps;
    int hysteresis_left;
  };
  State state() const { return {scale_, good_steps_, hysteresis_left_}; }
  void set_state(const State& s);

 private:
  LossScaleConfig c_;
  double scale_ = 1.0;
  int64_t good_steps_ = 0;
  int hysteresis_left_ = 1;
};

}  // namespace zrt
