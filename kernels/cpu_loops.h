// Internal: the CPU kernel loops, written once over an instruction-set traits type `Isa`:
//   Isa::V                      value type (float or a SIMD vector) with + - * /, Sqrt, Max
//   Isa::kWidth                 elements per V
//   Isa::Full, Isa::Tail        tags for a full vector / the last partial one (Isa::MakeTail(n))
//   Isa::Load<Kind>(base, i, tag), Isa::Store<Kind>(base, i, v, tag)   kind = ElemKind
//   Isa::LaneSumF64(v)         the lanes of v summed in double
//   Isa::Prefetch<Kind>(base, i) hint that element i is needed soon (may be a no-op)
// Included only by the ISA translation units (cpu_scalar.cc, cpu_avx2.cc, cpu_avx512.cc); each
// instantiates Kernels<its Isa>, whose types live in that unit's namespace.
#pragma once




#include <cstdint>

#include "zrt/kernels/adam_math.h"
#include "zrt/kernels/cpu_table.h"

namespace zrt::kernels::internal {

// Software prefetch distance of the Adam loop, in elements (1 KiB ahead per fp32 stream). Measured with
// bench/adam on 64M-element shards, 2 threads, as a fraction of the same-traffic probe: no prefetch 0.84,
// 256 0.98, 1024 0.95, 4096 0.82. The kernel is divider-bound in cache (2 divides + 1 sqrt per element,
// kept for bit-exactness with PyTorch), so the loads must be in flight before the divides need them.
inline constexpr int64_t kPrefetchElements = 256;

template <class Isa>
struct Kernels {
  using V = typename Isa::V;
  static constexpr int W = Isa::kWidth;

  template <int G, int C, bool kAms, class Tag>
  static void AdamAt(const AdamStepScalars& s, const AdamRange& r, int64_t i, Tag tag) {
    V p = Isa::template Load<kElemF32>(r.param, i, tag);
    V g = Isa::template Load<G>(r.grad, i, tag);
    V m = Isa::template Load<kElemF32>(r.exp_avg, i, tag);
    V v = Isa::template Load<kElemF32>(r.exp_avg_sq, i, tag);
    if constexpr (kAms) {
      V vmax = Isa::template Load<kElemF32>(r.max_exp_avg_sq, i, tag);
      AdamElement<V>(s, p, g, m, v, &vmax);
      Isa::template Store<kElemF32>(r.max_exp_avg_sq, i, vmax, tag);
    } else {
      AdamElement<V>(s, p, g, m, v, nullptr);
    }
    Isa::template Store<kElemF32>(r.param, i, p, tag);
    Isa::template Store<kElemF32>(r.exp_avg, i, m, tag);
    Isa::template Store<kElemF32>(r.exp_avg_sq, i, v, tag);
    if constexpr (C != kElemNone) Isa::template Store<C>(r.param_copy, i, p, tag);
  }

  template <int G, int C, bool kAms>
  static void AdamLoop(const AdamStepScalars& s, const AdamRange& r) {
    int64_t i = r.begin;
    for (; i + W <= r.end; i += W) {
      Isa::template Prefetch<kElemF32>(r.param, i + kPrefetchElements);
      Isa::template Prefetch<G>(r.grad, i + kPrefetchElements);
      Isa::template Prefetch<kElemF32>(r.exp_avg, i + kPrefetchElements);
      Isa::template Prefetch<kElemF32>(r.exp_avg_sq, i + kPrefetchElements);
      AdamAt<G, C, kAms>(s, r, i, typename Isa::Full{});
    }
    if (i < r.end) AdamAt<G, C, kAms>(s, r, i, Isa::MakeTail(r.end - i));
  }

  template <int G, int C>
  static void AdamAms(const AdamStepScalars& s, const AdamRange& r) {
    if (s.amsgrad) {
      AdamLoop<G, C, true>(s, r);
    } else {
      AdamLoop<G, C, false>(s, r);
    }
  }

  template <int G>
  static void AdamCopy(const AdamStepScalars& s, const AdamRange& r, int copy_kind) {
    switch (copy_kind) {
      case kElemBf16: return AdamAms<G, kElemBf16>(s, r);
      case kElemF16: return AdamAms<G, kElemF16>(s, r);
      default: return AdamAms<G, kElemNone>(s, r);
    }
  }

  static void Adam(const AdamStepScalars& s, const AdamRange& r, int grad_kind, int copy_kind) {
    switch (grad_kind) {
      case kElemBf16: return AdamCopy<kElemBf16>(s, r, copy_kind);
      case kElemF16: return AdamCopy<kElemF16>(s, r, copy_kind);
      default: return AdamCopy<kElemF32>(s, r, copy_kind);
    }
  }

  // Squares accumulate in float lanes for kFlush vectors, then move into a double: the float
  // partial sums stay short (<= kFlush terms per lane), the long sum is double.
  template <int G>
  static void SumSquaresOf(const void* g, int64_t begin, int64_t end, double* sum, bool* nonfinite) {
    constexpr int kFlush = 256 / W > 0 ? 256 / W : 1;
    double total = 0;
    V acc(0.0f), nf(0.0f);  // nf stays 0 unless some x*0 is NaN (x inf or NaN)
    int k = 0;
    int64_t i = begin;
    for (; i + W <= end; i += W) {
      const V x = Isa::template Load<G>(g, i, typename Isa::Full{});
      acc = acc + x * x;
      nf = nf + x * V(0.0f);
      if (++k == kFlush) {
        total += Isa::LaneSumF64(acc);
        acc = V(0.0f);
        k = 0;
      }
    }
    if (i < end) {
      const V x = Isa::template Load<G>(g, i, Isa::MakeTail(end - i));  // missing lanes load as 0
      acc = acc + x * x;
      nf = nf + x * V(0.0f);
    }
    total += Isa::LaneSumF64(acc);
    const double nfsum = Isa::LaneSumF64(nf);
    *sum = total;
    *nonfinite = nfsum != nfsum;
  }

  static void SumSquares(const void* g, int kind, int64_t begin, int64_t end, double* sum, bool* nonfinite) {
    switch (kind) {
      case kElemBf16: return SumSquaresOf<kElemBf16>(g, begin, end, sum, nonfinite);
      case kElemF16: return SumSquaresOf<kElemF16>(g, begin, end, sum, nonfinite);
      default: return SumSquaresOf<kElemF32>(g, begin, end, sum, nonfinite);
    }
  }

  template <int S, int D>
  static void CastOf(const void* src, void* dst, int64_t begin, int64_t end) {
    int64_t i = begin;
    for (; i + W <= end; i += W) {
      Isa::template Store<D>(dst, i, Isa::template Load<S>(src, i, typename Isa::Full{}), typename Isa::Full{});
    }
    if (i < end) {
      const auto tail = Isa::MakeTail(end - i);
      Isa::template Store<D>(dst, i, Isa::template Load<S>(src, i, tail), tail);
    }
  }

  template <int S>
  static void CastFrom(const void* src, void* dst, int dst_kind, int64_t begin, int64_t end) {
    switch (dst_kind) {
      case kElemBf16: return CastOf<S, kElemBf16>(src, dst, begin, end);
      case kElemF16: return CastOf<S, kElemF16>(src, dst, begin, end);
      default: return CastOf<S, kElemF32>(src, dst, begin, end);
    }
  }

  static void Cast(const void* src, int src_kind, void* dst, int dst_kind, int64_t begin, int64_t end) {
    switch (src_kind) {
      case kElemBf16: return CastFrom<kElemBf16>(src, dst, dst_kind, begin, end);
      case kElemF16: return CastFrom<kElemF16>(src, dst, dst_kind, begin, end);
      default: return CastFrom<kElemF32>(src, dst, dst_kind, begin, end);
    }
  }

  static constexpr CpuKernelTable kTable = {&Adam, &SumSquares, &Cast};
};

}  // namespace zrt::kernels::internal
