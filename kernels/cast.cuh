// Device code of the bulk cast kernel.
#pragma once

#include "zrt/kernels/cuda_common.cuh"

namespace zrt::kernels::cuda {

// dst[i] = src[i] converted (grid-stride; same rounding as the CPU casts). S == D copies.
template <int S, int D>
__global__ void __launch_bounds__(kThreads) CastKernel(const void* src, void* dst, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n; i += stride) {
    StoreElem<D>(dst, i, LoadElem<S>(src, i));
  }
}

}  // namespace zrt::kernels::cuda
