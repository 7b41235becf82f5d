// Host API of the optimizer kernels: Adam/AdamW over fp32 master shards (SIMD CPU; CUDA in
// adam_cuda.h), fused gradient sum-of-squares + inf/nan detection, and bulk dtype casts.
//
// Buffers: caller-owned; the kernels keep no pointer after returning. Elements need no particular
// alignment (aligned data is faster). Thread-safety: calls are independent; a call may use the given
// ThreadPool's workers and the calling thread.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "zrt/kernels/adam_math.h"
#include "zrt/core/dtype.h"
#include "zrt/core/status.h"

namespace zrt {
class ThreadPool;
}

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

// Which instruction set the CPU kernels use. kAuto picks the best the CPU (and OS) supports.
enum class CpuIsa : uint8_t { kAuto, kScalar, kAvx2, kAvx512 };
std::string_view CpuIsaName(CpuIsa isa);
// The best ISA this machine supports (never kAuto).
CpuIsa DetectCpuIsa();
bool CpuSupports(CpuIsa isa);

struct CpuKernelOptions {
  ThreadPool* pool = nullptr;  // null: run on the calling thread only
  int threads = 0;             // at most this many threads including the caller; <= 0: pool workers + 1
  CpuIsa isa = CpuIsa::kAuto;  // forcing an unsupported ISA is an Unavailable error
  int64_t chunk = 1 << 15;     // elements per work item (a multiple of 64 is kept aligned)
};

// Adam/AdamW step over `tensors`. grad_dtype: f32, bf16 or f16; copy_dtype: bf16 or f16 (used for the
// tensors whose param_copy is set). Errors name the offending tensor index; nothing is modified then.
Status AdamCpu(const AdamStepScalars& s, std::span<const AdamTensorArgs> tensors, DType grad_dtype,
               DType copy_dtype, const CpuKernelOptions& options = {});

// Sum of squares of gradients (accumulated in double across blocks) and whether any is inf/NaN.
// The result does not depend on the thread count (fixed chunking, ordered final sum).
struct GradStats {
  double sum_squares = 0;
  bool nonfinite = false;
};
struct GradRef {
  const void* data = nullptr;
  int64_t numel = 0;
};
Result<GradStats> GradSumSquaresCpu(std::span<const GradRef> grads, DType dtype, const CpuKernelOptions& options = {});

// dst[i] = src[i] converted (f32/bf16/f16 in any direction; narrowing rounds to nearest even, NaN
// stays NaN; widening is exact). src and dst must not overlap unless equal with equal dtypes.
Status CastCpu(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n,
               const CpuKernelOptions& options = {});

}  // namespace zrt::kernels
