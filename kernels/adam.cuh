// Device code of the fused multi-tensor Adam/AdamW kernel. The per-element math is kernels/adam_math.h,
// the same definition the CPU kernels use.
#pragma once

#include "zrt/kernels/adam_math.h"
#include "zrt/kernels/cuda_common.cuh"

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
