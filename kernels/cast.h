// Bulk dtype casts (f32/bf16/f16 in any direction; narrowing rounds to nearest even, NaN stays NaN,
// widening is exact), on the CPU (SIMD) and on a GPU (CUDA builds; host declarations only).
#pragma once

#include <cstdint>

#include "zrt/core/dtype.h"
#include "zrt/core/status.h"
#include "zrt/kernels/cpu.h"

namespace zrt::kernels {

// dst[i] = src[i] converted. src and dst must not overlap unless equal with equal dtypes.
Status CastCpu(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n,
               const CpuKernelOptions& options = {});

// The same on `stream` (a cudaStream_t); src and dst are device (or mapped) pointers and must not overlap.
Status CastCuda(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n, void* stream);

}  // namespace zrt::kernels
