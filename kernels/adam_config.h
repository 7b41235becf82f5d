// Adam/AdamW hyperparameters as a trainer states them (EngineConfig::adam; torch.optim's names). The
// math is kernels/adam_math.h (not installed).
#pragma once

#include <cstdint>
#include <string_view>

#include "zrt/core/status.h"

namespace zrt::kernels {

enum class AdamMode : uint8_t {
  kAdamW = 0,  // decoupled weight decay (Loshchilov & Hutter)
  kAdamL2 = 1,  // weight decay added to the gradient (torch.optim.Adam)
};

// How an Adam moment is stored (docs/kernels.md "Compact state"): f32, bf16 (round to nearest even) or
// q8 (8-bit codes per block with an f32 scale; the rule is core/quant_math.h).
enum class MomentFormat : uint8_t { kF32 = 0, kBf16 = 1, kQ8 = 2 };
std::string_view MomentFormatName(MomentFormat f);  // "f32", "bf16", "q8"
// The names above; InvalidArgument listing them otherwise.
Result<MomentFormat> ParseMomentFormat(std::string_view name);

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
