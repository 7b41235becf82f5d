// Adam/AdamW over fp32 master shards: the SIMD CPU kernel and the fused multi-tensor CUDA kernel (CUDA
// builds), host declarations only (no CUDA headers). The per-element math is adam_math.h.
//
// Buffers: caller-owned; the kernels keep no pointer after returning. Elements need no particular
// alignment (aligned data is faster). Thread-safety: calls are independent; a CPU call may use the
// given ThreadPool's workers and the calling thread.
#pragma once

#include <cstdint>
#include <span>

#include "zrt/core/dtype.h"
#include "zrt/core/status.h"
#include "zrt/kernels/adam_math.h"
#include "zrt/kernels/cpu.h"

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

}  // namespace zrt::kernels
