// Internal device and host helpers shared by the CUDA kernels (adam.cu, grad_norm.cu, cast.cu): the
// launch shape, element loads/stores (same rounding as the CPU, from core/dtype.h), a deterministic
// block sum, and the host-side packing of (tensor, chunk) pairs into launches passed by value.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <span>

#include "zrt/core/dtype.h"
#include "zrt/core/status.h"

namespace zrt::kernels::cuda {

constexpr int kThreads = 512;
constexpr int64_t kChunk = 65536;  // elements per block
constexpr int kMaxTensors = 24;    // per launch: the argument struct stays under the 4 KiB limit
constexpr int kMaxBlocks = 320;

enum Kind : int { kF32 = 0, kBf16 = 1, kF16 = 2, kNone = 3 };

template <int K>
__device__ __forceinline__ float LoadElem(const void* base, int64_t i) {
  if constexpr (K == kBf16) return Bf16ToFloat(static_cast<const uint16_t*>(base)[i]);
  if constexpr (K == kF16) return F16ToFloat(static_cast<const uint16_t*>(base)[i]);
  if constexpr (K == kF32) return static_cast<const float*>(base)[i];
  return 0.0f;
}

template <int K>
__device__ __forceinline__ void StoreElem(void* base, int64_t i, float x) {
  if constexpr (K == kBf16) static_cast<uint16_t*>(base)[i] = FloatToBf16(x);
  if constexpr (K == kF16) static_cast<uint16_t*>(base)[i] = FloatToF16(x);
  if constexpr (K == kF32) static_cast<float*>(base)[i] = x;
}

// Four consecutive elements (i is a multiple of 4 and the base suitably aligned).
template <int K>
__device__ __forceinline__ float4 Load4(const void* base, int64_t i) {
  if constexpr (K == kF32) {
    return reinterpret_cast<const float4*>(static_cast<const float*>(base) + i)[0];
  } else {
    const uint2 h = reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(base) + i)[0];
    const uint16_t e[4] = {static_cast<uint16_t>(h.x & 0xffffu), static_cast<uint16_t>(h.x >> 16),
                           static_cast<uint16_t>(h.y & 0xffffu), static_cast<uint16_t>(h.y >> 16)};
    if constexpr (K == kBf16) return make_float4(Bf16ToFloat(e[0]), Bf16ToFloat(e[1]), Bf16ToFloat(e[2]), Bf16ToFloat(e[3]));
    return make_float4(F16ToFloat(e[0]), F16ToFloat(e[1]), F16ToFloat(e[2]), F16ToFloat(e[3]));
  }
}

template <int K>
__device__ __forceinline__ void Store4(void* base, int64_t i, float4 x) {
  if constexpr (K == kF32) {
    reinterpret_cast<float4*>(static_cast<float*>(base) + i)[0] = x;
  } else if constexpr (K == kBf16 || K == kF16) {
    auto cvt = [](float f) -> uint32_t { return K == kBf16 ? FloatToBf16(f) : FloatToF16(f); };
    const uint2 h = make_uint2(cvt(x.x) | (cvt(x.y) << 16), cvt(x.z) | (cvt(x.w) << 16));
    reinterpret_cast<uint2*>(static_cast<uint16_t*>(base) + i)[0] = h;
  }
}

__device__ __forceinline__ bool Aligned(const void* p, unsigned bytes) {
  return (reinterpret_cast<uintptr_t>(p) & (bytes - 1)) == 0;
}

// Block-wide sum in double (fixed reduction tree: deterministic).
__device__ __forceinline__ double BlockSum(double x) {
  __shared__ double warp_sums[kThreads / 32];
  for (int off = 16; off > 0; off /= 2) x += __shfl_down_sync(0xffffffffu, x, off);
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x / 32] = x;
  __syncthreads();
  x = threadIdx.x < kThreads / 32 ? warp_sums[threadIdx.x] : 0.0;
  if (threadIdx.x < 32) {
    for (int off = 16; off > 0; off /= 2) x += __shfl_down_sync(0xffffffffu, x, off);
  }
  return x;  // valid in thread 0
}

// ---- host side ----------------------------------------------------------------------------------
inline Result<int> KindOf(DType t, const char* what) {
  switch (t) {
    case DType::kF32: return int{kF32};
    case DType::kBF16: return int{kBf16};
    case DType::kF16: return int{kF16};
    default: return InvalidArgumentError(what, " dtype ", DTypeName(t), " unsupported (f32, bf16 or f16)");
  }
}

inline int64_t Chunks(int64_t n) { return (n + kChunk - 1) / kChunk; }

// Walks (tensor, chunk) pairs and calls flush(blocks) whenever a batch is
// full; `add(slot, tensor)` fills a tensor slot, `block(b, slot, chunk)` a block entry.
template <class AddTensor, class AddBlock, class Flush>
Status Batch(std::span<const int64_t> numels, AddTensor add, AddBlock block, Flush flush) {
  int slots = 0, blocks = 0;
  for (size_t t = 0; t < numels.size(); ++t) {
    const int64_t chunks = Chunks(numels[t]);
    if (chunks == 0) continue;
    if (chunks > INT32_MAX) return InvalidArgumentError("tensor ", t, " is too large for one launch");
    int64_t c = 0;
    while (c < chunks) {
      if (slots == kMaxTensors || blocks == kMaxBlocks) {
        RETURN_IF_ERROR(flush(blocks));
        slots = blocks = 0;
      }
      const int slot = slots++;
      add(slot, t);
      for (; c < chunks && blocks < kMaxBlocks; ++c) block(blocks++, slot, static_cast<int32_t>(c));
    }
  }
  if (blocks > 0) RETURN_IF_ERROR(flush(blocks));
  return Status();
}

}  // namespace zrt::kernels::cuda
