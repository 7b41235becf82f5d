// Device code of the fused multi-tensor Adam and the gradient sum-of-squares kernels.
// The per-element math is kernels/adam_math.h, the same definition the CPU kernels use.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "zrt/kernels/adam_math.h"
#include "zrt/core/dtype.h"

namespace zrt::kernels::cuda {

constexpr int kThreads = 512;
constexpr int64_t kChunk = 65536;  // elements per block
constexpr int kMaxTensors = 24;    // per launch: the argument struct stays under the 4 KiB limit
constexpr int kMaxBlocks = 320;

enum Kind : int { kF32 = 0, kBf16 = 1, kF16 = 2, kNone = 3 };

struct AdamBatch {
  float* p[kMaxTensors];
  const void* g[kMaxTensors];
  float* m[kMaxTensors];
  float* v[kMaxTensors];
  float* vmax[kMaxTensors];
  void* copy[kMaxTensors];
  int64_t n[kMaxTensors];
  uint8_t block_tensor[kMaxBlocks];
  int32_t block_chunk[kMaxBlocks];
};

struct NormBatch {
  const void* g[kMaxTensors];
  int64_t n[kMaxTensors];
  uint8_t block_tensor[kMaxBlocks];
  int32_t block_chunk[kMaxBlocks];
  int32_t partial_offset;  // where this launch's per-block partials start in the workspace
};

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

template <int G, int C, bool kAms>
__global__ void __launch_bounds__(kThreads) AdamKernel(AdamBatch b, AdamStepScalars s, const int* skip,
                                                        const float* scale) {
  if (skip != nullptr && *skip != 0) return;
  if (scale != nullptr) s.grad_scale = s.grad_scale * *scale;
  const int t = b.block_tensor[blockIdx.x];
  const int64_t start = static_cast<int64_t>(b.block_chunk[blockIdx.x]) * kChunk;
  const int64_t n = min(kChunk, b.n[t] - start);
  float* p = b.p[t] + start;
  float* m = b.m[t] + start;
  float* v = b.v[t] + start;
  float* vm = kAms ? b.vmax[t] + start : nullptr;
  const unsigned gsize = G == kF32 ? 4 : 2;
  const void* g = static_cast<const char*>(b.g[t]) + start * gsize;
  void* cp = C == kNone ? nullptr : static_cast<void*>(static_cast<char*>(b.copy[t]) + start * 2);

  const bool vec = Aligned(p, 16) && Aligned(m, 16) && Aligned(v, 16) && (!kAms || Aligned(vm, 16)) &&
                   Aligned(g, 4 * gsize) && (C == kNone || Aligned(cp, 8));
  int64_t done = 0;
  if (vec) {
    const int64_t n4 = n / 4 * 4;
    for (int64_t i = 4 * static_cast<int64_t>(threadIdx.x); i < n4; i += 4 * kThreads) {
      float4 P = Load4<kF32>(p, i), M = Load4<kF32>(m, i), V = Load4<kF32>(v, i), Gr = Load4<G>(g, i);
      float4 VM = kAms ? Load4<kF32>(vm, i) : make_float4(0, 0, 0, 0);
      AdamElement<float>(s, P.x, Gr.x, M.x, V.x, kAms ? &VM.x : nullptr);
      AdamElement<float>(s, P.y, Gr.y, M.y, V.y, kAms ? &VM.y : nullptr);
      AdamElement<float>(s, P.z, Gr.z, M.z, V.z, kAms ? &VM.z : nullptr);
      AdamElement<float>(s, P.w, Gr.w, M.w, V.w, kAms ? &VM.w : nullptr);
      Store4<kF32>(p, i, P);
      Store4<kF32>(m, i, M);
      Store4<kF32>(v, i, V);
      if constexpr (kAms) Store4<kF32>(vm, i, VM);
      if constexpr (C != kNone) Store4<C>(cp, i, P);
    }
    done = n4;
  }
  for (int64_t i = done + threadIdx.x; i < n; i += kThreads) {
    float P = p[i], M = m[i], V = v[i], Gr = LoadElem<G>(g, i);
    float VM = kAms ? vm[i] : 0.0f;
    AdamElement<float>(s, P, Gr, M, V, kAms ? &VM : nullptr);
    p[i] = P;
    m[i] = M;
    v[i] = V;
    if constexpr (kAms) vm[i] = VM;
    if constexpr (C != kNone) StoreElem<C>(cp, i, P);
  }
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

// dst[i] = src[i] converted (grid-stride; same rounding as the CPU casts). S == D copies.
template <int S, int D>
__global__ void __launch_bounds__(kThreads) CastKernel(const void* src, void* dst, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n; i += stride) {
    StoreElem<D>(dst, i, LoadElem<S>(src, i));
  }
}

__global__ void GradMultiplierKernel(const double* sum_squares, float loss_scale, float max_norm, float* multiplier,
                                     float* norm) {
  if (threadIdx.x == 0 && blockIdx.x == 0) *multiplier = GradMultiplier(*sum_squares, loss_scale, max_norm, norm);
}

}  // namespace zrt::kernels::cuda
