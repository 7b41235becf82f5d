// Adam/AdamW hyperparameters as a trainer states them (EngineConfig::adam; torch.optim's names). The
// math is kernels/adam_math.h (not installed).
#pragma once

#include <cstdint>

#include "zrt/core/state_view.h"
#include "zrt/core/status.h"

namespace zrt::kernels {

enum class AdamMode : uint8_t {
  kAdamW = 0,  // decoupled weight decay (Loshchilov & Hutter)
  kAdamL2 = 1,  // weight decay added to the gradient (torch.optim.Adam)
};

// How an Adam moment is stored: the state precision (core/state_view.h), by its 0.1 name.
using MomentFormat = zrt::Precision;

// Hyperparameters, in double as the trainer states them (PyTorch keeps Python floats).
struct AdamConfig {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  AdamMode mode = AdamMode::kAdamW;
  bool amsgrad = false;
  bool bias_correction = true;
};

}  // namespace zrt::kernels
