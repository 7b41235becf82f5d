// Host declarations of the CUDA optimizer kernels (built with ZRT_WITH_CUDA). No CUDA headers: streams
// are passed as `void*` (a cudaStream_t; null = the legacy default stream). All pointers in the
// argument structs are device pointers. Launches are asynchronous: results are ready when the stream
// reaches them; the host never waits (no cudaStreamSynchronize inside).
#pragma once

#include <cstddef>
#include <span>

#include "zrt/kernels/adam.h"

namespace zrt::kernels {

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

// dst[i] = src[i] converted (f32/bf16/f16, as CastCpu: narrowing rounds to nearest even), on `stream`.
// src and dst are device (or mapped) pointers and must not overlap.
Status CastCuda(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n, void* stream);

}  // namespace zrt::kernels
