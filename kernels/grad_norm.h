// Gradient norms: a fused sum of squares with inf/NaN detection over many gradient buffers, on the CPU
// (SIMD) and on a GPU (CUDA builds; host declarations only). The clip multiplier derived from it is
// GradMultiplier in adam_math.h, shared by both.
//
// Thread-safety: calls are independent; a CPU call may use the given ThreadPool's workers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "zrt/core/dtype.h"
#include "zrt/core/status.h"
#include "zrt/kernels/adam_math.h"  // GradMultiplier
#include "zrt/kernels/cpu.h"

namespace zrt::kernels {

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

// CUDA builds (device pointers, `stream` a cudaStream_t; asynchronous).
// Bytes of device workspace GradSumSquaresCuda needs for these gradients.
size_t GradSumSquaresCudaWorkspace(std::span<const GradRef> grads);

// Multi-tensor sum of squares into *sum_squares (device double; deterministic: fixed per-block
// partials summed in order by one block) and *found_inf = 1 when any element is inf/NaN (never
// cleared here: zero it before the first call of a step).
Status GradSumSquaresCuda(std::span<const GradRef> grads, DType dtype, void* workspace, size_t workspace_bytes,
                          double* sum_squares, int* found_inf, void* stream);

// *multiplier = GradMultiplier(*sum_squares, loss_scale, max_norm) and *norm = the pre-clip norm, on
// the device (after the caller all-reduced *sum_squares across ranks), for AdamCudaOptions::grad_scale.
Status GradMultiplierCuda(const double* sum_squares, float loss_scale, float max_norm, float* multiplier, float* norm,
                          void* stream);

}  // namespace zrt::kernels
