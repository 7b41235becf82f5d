// Adam/AdamW over fp32 master shards: the SIMD CPU kernel and the fused multi-tensor CUDA kernel (CUDA
// builds), host declarations only (no CUDA headers). The per-element math is adam_math.h.
//
// Buffers: caller-owned; the kernels keep no pointer after returning. Elements need no particular
// alignment (aligned data is faster). Thread-safety: calls are independent; a CPU call may use the
// given ThreadPool's workers and the calling thread.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "zrt/core/dtype.h"
#include "zrt/core/status.h"
#include "zrt/kernels/adam_math.h"
#include "zrt/kernels/cpu.h"
#include "zrt/core/quant_math.h"

namespace zrt::kernels {

// Computes the step's scalars (step >= 1 counts from 1, as PyTorch). grad_scale multiplies every
// gradient before use: 1 / (loss_scale * clip_coef). InvalidArgument for nonsense hyperparameters
// (negative lr or eps, betas outside [0, 1), step < 1, non-finite or non-positive grad_scale).
Result<AdamStepScalars> MakeAdamStepScalars(const AdamConfig& config, int64_t step, double grad_scale = 1.0);

// One tensor (or shard range) to update. `grad` has the dtype given to the call (f32, bf16 or f16);
// `param_copy`, when not null, receives the updated parameter rounded to nearest even in the copy
// dtype (bf16 or f16) in the same pass; `max_exp_avg_sq` is required with amsgrad, else ignored.
struct AdamTensorArgs {
  float* param = nullptr;
  const void* grad = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  float* max_exp_avg_sq = nullptr;
  void* param_copy = nullptr;
  int64_t numel = 0;
};

// Adam/AdamW step over `tensors`. grad_dtype: f32, bf16 or f16; copy_dtype: bf16 or f16 (used for the
// tensors whose param_copy is set). Errors name the offending tensor index; nothing is modified then.
Status AdamCpu(const AdamStepScalars& s, std::span<const AdamTensorArgs> tensors, DType grad_dtype,
               DType copy_dtype, const CpuKernelOptions& options = {});

// ---- compact state (docs/kernels.md "Compact state"; core/quant_math.h has the exact rule) ----
// Each moment in f32, bf16 (round to nearest even), or 8- or 4-bit block-wise codes with an f32 scale
// per block; the parameters updated through an fp32 master, or (bf16 models) directly, rounded
// stochastically with bits keyed by (seed, step, global element index).
struct CompactFormat {
  Precision exp_avg = Precision::kF32;
  Precision exp_avg_sq = Precision::kF32;
  bool master = true;    // false: AdamCompactArgs::param is the bf16 parameters themselves
  int64_t block = 256;   // q8, q4: elements per block, a power of two in [8, kMaxQuantBlock]
  uint32_t seed = 0;     // stochastic rounding (without a master)
  bool compact() const { return exp_avg != Precision::kF32 || exp_avg_sq != Precision::kF32 || !master; }
  // How each moment is stored (the first moment's codes signed).
  StateFormat exp_avg_format() const { return StateFormat::Of(exp_avg, "exp_avg", block); }
  StateFormat exp_avg_sq_format() const { return StateFormat::Of(exp_avg_sq, "exp_avg_sq", block); }
};
// q8, q4: the scales of `numel` elements (one per block, the last one maybe partial).
inline int64_t Q8Blocks(int64_t numel, int64_t block) { return (numel + block - 1) / block; }
// InvalidArgument naming what is wrong (a block that is not a power of two in range).
Status CheckCompactFormat(const CompactFormat& f);

struct AdamCompactArgs {
  void* param = nullptr;            // the f32 master, or (format.master false) the bf16 parameters
  const void* grad = nullptr;
  void* exp_avg = nullptr;          // numel f32 or bf16 values, numel q8 codes, or (numel + 1) / 2 bytes of q4 codes
  float* exp_avg_scale = nullptr;   // q8, q4: Q8Blocks(numel, block) scales
  void* exp_avg_sq = nullptr;
  float* exp_avg_sq_scale = nullptr;
  void* param_copy = nullptr;       // with a master: the 16-bit copy (copy dtype), or null; null without
  int64_t numel = 0;
  // Element 0's index in the group's flat buffer: keys its stochastic rounding; with a q8 or q4 moment a
  // multiple of format.block (blocks start there).
  int64_t index = 0;
  CompactFormat format;
};

// The fused step over compact state: the same AdamElement (unscale, L2 or decoupled decay) on the
// decoded moments, then each stored back in its format. `step` (>= 1) keys the stochastic rounding.
// amsgrad is not supported here (its running maximum would need a format too): InvalidArgument.
// Results do not depend on the ISA, the thread count or the chunk.
Status AdamCompactCpu(const AdamStepScalars& s, int64_t step, std::span<const AdamCompactArgs> tensors, DType grad_dtype,
                      DType copy_dtype, const CpuKernelOptions& options = {});

// CUDA builds. Streams are passed as `void*` (a cudaStream_t; null = the legacy default stream); every
// pointer is a device pointer. Launches are asynchronous: results are ready when the stream reaches
// them; the host never waits.
struct AdamCudaOptions {
  void* stream = nullptr;
  // Device int: when nonzero (set by GradSumSquaresCuda on inf/NaN) every block returns before
  // touching any state, so an overflow step is skipped with no host synchronisation.
  const int* skip_flag = nullptr;
  // Device float multiplied into s.grad_scale (the clip/unscale multiplier from GradMultiplierCuda).
  const float* grad_scale = nullptr;
};

// Fused multi-tensor Adam/AdamW: blocks map to (tensor, 64K-element chunk); 16-byte vector accesses
// when the tensor's pointers allow; fused cast into param_copy. Same arguments and math as AdamCpu.
Status AdamCuda(const AdamStepScalars& s, std::span<const AdamTensorArgs> tensors, DType grad_dtype, DType copy_dtype,
                const AdamCudaOptions& options = {});
// AdamCompactCpu on the device: one thread block per q8 block (or per 4096 elements); bit-identical
// to the CPU path.
Status AdamCompactCuda(const AdamStepScalars& s, int64_t step, std::span<const AdamCompactArgs> tensors, DType grad_dtype,
                       DType copy_dtype, const AdamCudaOptions& options = {});

}  // namespace zrt::kernels
