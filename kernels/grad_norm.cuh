// Device code of the multi-tensor gradient sum of squares (deterministic partials, then one block
// sums them in order) and of the clip multiplier (GradMultiplier from adam_math.h).
#pragma once

#include "zrt/kernels/adam_math.h"
#include "zrt/kernels/cuda_common.cuh"

namespace zrt::kernels::cuda {

struct NormBatch {
  const void* g[kMaxTensors];
  int64_t n[kMaxTensors];
  uint8_t block_tensor[kMaxBlocks];
  int32_t block_chunk[kMaxBlocks];
  int32_t partial_offset;  // where this launch's per-block partials start in the workspace
};

template <int G>
__global__ void __launch_bounds__(kThreads) SumSquaresKernel(NormBatch b, double* partials, int* found_inf) {
  const int t = b.block_tensor[blockIdx.x];
  const int64_t start = static_cast<int64_t>(b.block_chunk[blockIdx.x]) * kChunk;
  const int64_t n = min(kChunk, b.n[t] - start);
  const void* g = static_cast<const char*>(b.g[t]) + start * (G == kF32 ? 4 : 2);
  float acc = 0.0f;  // <= kChunk / kThreads = 128 terms per thread
  bool bad = false;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) {
    const float x = LoadElem<G>(g, i);
    acc += x * x;
    bad |= !isfinite(x);
  }
  if (bad) *found_inf = 1;  // benign race: every writer stores 1
  const double sum = BlockSum(static_cast<double>(acc));
  if (threadIdx.x == 0) partials[b.partial_offset + blockIdx.x] = sum;
}

// One block sums `count` partials in a fixed order.
__global__ void __launch_bounds__(kThreads) SumPartialsKernel(const double* partials, int count, double* out) {
  double acc = 0.0;
  for (int i = threadIdx.x; i < count; i += kThreads) acc += partials[i];
  const double sum = BlockSum(acc);
  if (threadIdx.x == 0) *out = sum;
}

__global__ void GradMultiplierKernel(const double* sum_squares, float loss_scale, float max_norm, float* multiplier,
                                     float* norm) {
  if (threadIdx.x == 0 && blockIdx.x == 0) *multiplier = GradMultiplier(*sum_squares, loss_scale, max_norm, norm);
}

}  // namespace zrt::kernels::cuda
