// Device code of the fused multi-tensor Adam/AdamW kernel. The per-element math is kernels/adam_math.h,
// the same definition the CPU kernels use.
#pragma once

#include "zrt/kernels/adam_math.h"
#include "zrt/kernels/cuda_common.cuh"
#include "zrt/core/quant_math.h"

namespace zrt::kernels::cuda {

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

}  // namespace zrt::kernels::cuda

// ---- Adam over compact state (core/quant_math.h) ----------------------------------------------
namespace zrt::kernels::cuda {

struct CompactTensor {
  void* p;
  const void* g;
  void* m;
  float* ms;
  void* v;
  float* vs;
  void* copy;
  int64_t n;
  int64_t index;
  int m_kind, v_kind;  // MomentFormat as int: 0 f32, 1 bf16, 2 q8, 3 q4 (uniform over the grid)
  uint32_t seed;
};

// The largest magnitude over the thread block (every thread gets it). Max is exact in any order.
__device__ __forceinline__ float BlockMax(float x) {
  __shared__ float warp_max[kThreads / 32];
  __shared__ float result;
  for (int off = 16; off > 0; off /= 2) x = Max(x, __shfl_down_sync(0xffffffffu, x, off));
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x / 32] = x;
  __syncthreads();
  if (threadIdx.x < 32) {
    x = threadIdx.x < kThreads / 32 ? warp_max[threadIdx.x] : 0.0f;
    for (int off = 16; off > 0; off /= 2) x = Max(x, __shfl_down_sync(0xffffffffu, x, off));
    if (threadIdx.x == 0) result = x;
  }
  __syncthreads();
  return result;
}

__device__ __forceinline__ float LoadMoment(const void* base, int kind, float scale, int64_t i, bool is_signed) {
  if (kind == 3) return Q4Value(Q4CodeAt(static_cast<const uint8_t*>(base), i), is_signed) * scale;
  if (kind == 2) return Q8Value(static_cast<const uint8_t*>(base)[i], is_signed) * scale;
  if (kind == 1) return Bf16ToFloat(static_cast<const uint16_t*>(base)[i]);
  return static_cast<const float*>(base)[i];
}
__device__ __forceinline__ void StoreMoment(void* base, int kind, int64_t i, float x) {
  if (kind == 1) {
    static_cast<uint16_t*>(base)[i] = FloatToBf16(x);
  } else {
    static_cast<float*>(base)[i] = x;
  }
}

// q4 codes of element i (held by this thread) and i + 1 (the next thread's: i is even on even threads,
// blocks are whole and even) packed into one byte by the even thread. Every thread of the warp calls it.
__device__ __forceinline__ void StoreQ4(void* base, int64_t i, bool in, uint32_t code) {
  const uint32_t c = in ? code : 0u;
  const uint32_t hi = __shfl_down_sync(0xffffffffu, c, 1);
  if (in && (threadIdx.x & 1u) == 0) static_cast<uint8_t*>(base)[i / 2] = static_cast<uint8_t>(c | hi << 4);
}

// One thread block per segment of `seg` elements: a q8 or q4 block when a moment is one (its codes need the
// block's largest magnitude: kept in registers, at most kMaxQuantBlock / kThreads per thread), else
// any length. The same CompactAdamElement (AdamElement) and quant_math.h definitions as the CPU path.
template <int G, int C, bool kSr>
__global__ void __launch_bounds__(kThreads) AdamCompactKernel(CompactTensor t, AdamStepScalars s, uint64_t step, int64_t seg,
                                                               const int* skip, const float* scale) {
  constexpr int kPer = kMaxQuantBlock / kThreads;
  if (skip != nullptr && *skip != 0) return;
  if (scale != nullptr) s.grad_scale = s.grad_scale * *scale;
  const bool q = t.m_kind >= 2 || t.v_kind >= 2;
  const int64_t b0 = static_cast<int64_t>(blockIdx.x) * seg, n = min(seg, t.n - b0);
  const float ms = t.m_kind >= 2 ? t.ms[blockIdx.x] : 0.0f, vs = t.v_kind >= 2 ? t.vs[blockIdx.x] : 0.0f;
  const uint64_t g0 = static_cast<uint64_t>(t.index + b0);
  const uint32_t hi0 = static_cast<uint32_t>(g0 >> 32);
  const uint32_t key0 = kSr ? RoundingKey(t.seed, step, hi0) : 0, key1 = kSr ? RoundingKey(t.seed, step, hi0 + 1) : 0;
  float mk[kPer], vk[kPer];
  float av = 0.0f;
  for (int k = 0;; ++k) {
    const int64_t i = b0 + threadIdx.x + static_cast<int64_t>(k) * kThreads;
    if (i >= b0 + n || (q && k >= kPer)) break;
    float p = kSr ? Bf16ToFloat(static_cast<const uint16_t*>(t.p)[i]) : static_cast<const float*>(t.p)[i];
    float m = LoadMoment(t.m, t.m_kind, ms, i, true), v = LoadMoment(t.v, t.v_kind, vs, i, false);
    if (t.m_kind == 0 && t.v_kind == 0 && !kSr) {
      AdamElement<float>(s, p, LoadElem<G>(t.g, i), m, v, nullptr);
    } else {
      CompactAdamElement<float>(s, p, LoadElem<G>(t.g, i), m, v);
    }
    if constexpr (kSr) {
      const uint64_t gi = static_cast<uint64_t>(t.index + i);
      static_cast<uint16_t*>(t.p)[i] = FloatToBf16Stochastic(p, static_cast<uint32_t>(gi >> 32) == hi0 ? key0 : key1, static_cast<uint32_t>(gi));
    } else {
      static_cast<float*>(t.p)[i] = p;
    }
    if constexpr (C != kNone) StoreElem<C>(t.copy, i, p);
    if (q) {
      mk[k] = m;
      vk[k] = v;
      av = Max(av, fabsf(v));
    } else {
      StoreMoment(t.m, t.m_kind, i, m);
      StoreMoment(t.v, t.v_kind, i, v);
    }
  }
  if (!q) return;
  // The second moment's scale and codes, the coupling, then the first moment's scale (of what is
  // stored) and codes: the CPU's order.
  av = BlockMax(av);
  const float vr = Q8Recip(av);
  if (threadIdx.x == 0 && t.v_kind >= 2) t.vs[blockIdx.x] = av;
  float am = 0.0f;
  for (int k = 0; k < kPer; ++k) {  // no early exit: q4's pairs are packed across threads
    const int64_t i = b0 + threadIdx.x + static_cast<int64_t>(k) * kThreads;
    const bool in = i < b0 + n;
    if (t.v_kind == 3) {
      StoreQ4(t.v, i, in, in ? Q4Encode(vk[k], vr, false) : 0u);
      if (in) mk[k] = vr > 0.0f ? mk[k] : 0.0f;  // no q4 code is zero: only a zero scale decodes to 0
    }
    if (!in) continue;
    if (t.v_kind == 2) {
      static_cast<uint8_t*>(t.v)[i] = Q8Encode(vk[k], vr, false);
      mk[k] = vk[k] * vr > kQ8UnsignedZero ? mk[k] : 0.0f;
    } else if (t.v_kind != 3) {
      StoreMoment(t.v, t.v_kind, i, vk[k]);
    }
    if (t.m_kind >= 2) {
      am = Max(am, fabsf(mk[k]));
    } else {
      StoreMoment(t.m, t.m_kind, i, mk[k]);
    }
  }
  if (t.m_kind < 2) return;
  am = BlockMax(am);
  if (threadIdx.x == 0) t.ms[blockIdx.x] = am;
  const float mr = Q8Recip(am);
  for (int k = 0; k < kPer; ++k) {
    const int64_t i = b0 + threadIdx.x + static_cast<int64_t>(k) * kThreads;
    const bool in = i < b0 + n;
    if (t.m_kind == 3) {
      StoreQ4(t.m, i, in, in ? Q4Encode(mk[k], mr, true) : 0u);
    } else if (in) {
      static_cast<uint8_t*>(t.m)[i] = Q8Encode(mk[k], mr, true);
    }
  }
}

}  // namespace zrt::kernels::cuda
