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




#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>

#include "zrt/kernels/adam_math.h"
#include "zrt/kernels/cpu_table.h"

namespace zrt::kernels::internal {

// Software prefetch distance of the Adam loop, in elements (1 KiB ahead per fp32 stream). Measured with
// bench/adam on 64M-element shards, 2 threads, as a fraction of the same-traffic probe: no prefetch 0.84,
// 256 0.98, 1024 0.95, 4096 0.82. The kernel is divider-bound in cache (2 divides + 1 sqrt per element,
// kept for bit-exactness with PyTorch), so the loads must be in flight before the divides need them.
inline constexpr int64_t kPrefetchElements = 256;
// The compact step's (CompactLoop), whose streams are narrower (bf16 and q8: 1 KiB and 512 bytes
// ahead). Measured with bench/adam's compact table (64M elements, 2 threads, bf16 gradients, four
// alternations on an Intel Xeon with AVX512-BF16), as a fraction of the same-traffic probe: bf16
// moments without a master 0.90-0.91 at 256, 0.94-0.95 at 512, 0.91-0.95 at 1024; q8 with a master
// 0.81-0.82, 0.83, 0.78-0.82.
inline constexpr int64_t kCompactPrefetchElements = 512;

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

  // ---- Adam over compact state (quant_math.h) ----
  // Moments are decoded to f32, updated by CompactAdamElement (AdamElement for f32 state with a master),
  // and stored back: f32 and bf16 (round to nearest even) at once; when a moment is q8 or q4, both are
  // kept for the block in two stack buffers and stored after it (a block's scale is its largest stored magnitude, and the coupling needs
  // the second moment's codes before the first moment is stored). q4 codes are decoded into those
  // buffers before the block and encoded from them after it, with the arithmetic of Q4Value and
  // Q4Encode, so every unit stores the same bits.
  static constexpr bool Blockwise(int m) { return m == kMomQ8 || m == kMomQ4; }

  // An ISA unit may bring its own (AVX-512: a table permute); the same values and codes either way.
  template <bool kSigned>
  static void DecodeQ4(const void* bytes, int64_t n, float scale, float* out) {
    if constexpr (requires { Isa::template DecodeQ4<kSigned>(bytes, n, scale, out); }) {
      Isa::template DecodeQ4<kSigned>(bytes, n, scale, out);
    } else {
      const auto* b = static_cast<const uint8_t*>(bytes);
      const float* value = Q4Table(kSigned);
      for (int64_t j = 0; j < n; ++j) out[j] = value[Q4CodeAt(b, j)] * scale;
    }
  }
  template <bool kSigned>
  static void EncodeQ4(const float* x, int64_t n, float recip, void* bytes) {
    if constexpr (requires { Isa::template EncodeQ4<kSigned>(x, n, recip, bytes); }) {
      Isa::template EncodeQ4<kSigned>(x, n, recip, bytes);
    } else {
      Q4EncodeCodes(x, n, recip, kSigned, static_cast<uint8_t*>(bytes));
    }
  }
  template <int M, bool kSigned, class Tag>
  static V LoadMoment(const void* base, float scale, int64_t i, Tag tag) {
    if constexpr (M == kMomQ4) return Isa::template Load<kElemF32>(base, i, tag);  // decoded before the block
    if constexpr (M == kMomQ8) return Isa::template DecodeQ8<kSigned>(base, i, tag) * V(scale);
    if constexpr (M == kMomBf16) return Isa::template Load<kElemBf16>(base, i, tag);
    if constexpr (M == kMomF32) return Isa::template Load<kElemF32>(base, i, tag);
  }
  template <int M, class Tag>
  static void StoreMoment(void* base, int64_t i, V x, Tag tag) {
    Isa::template Store<M == kMomBf16 ? kElemBf16 : kElemF32>(base, i, x, tag);
  }

  template <int G, int C, bool kSr, int M1, int M2, class Tag>
  static void CompactAt(const AdamStepScalars& s, const CompactRange& r, float ms, float vs, int64_t b0, float* mt, float* vt,
                        V& vmax, V& mmax, int64_t i, Tag tag) {
    V p = Isa::template Load<kSr ? kElemBf16 : kElemF32>(r.param, i, tag);
    V g = Isa::template Load<G>(r.grad, i, tag);
    // q4: decoded into mt / vt before the block (CompactLoop), updated in place there.
    V m = LoadMoment<M1, true>(M1 == kMomQ4 ? mt : r.exp_avg, ms, M1 == kMomQ4 ? i - b0 : i, tag);
    V v = LoadMoment<M2, false>(M2 == kMomQ4 ? vt : r.exp_avg_sq, vs, M2 == kMomQ4 ? i - b0 : i, tag);
    if constexpr (M1 == kMomF32 && M2 == kMomF32 && !kSr) {
      AdamElement<V>(s, p, g, m, v, nullptr);  // f32 state with a master: AdamCpu's step, bit for bit
    } else {
      CompactAdamElement<V>(s, p, g, m, v);
    }
    if constexpr (kSr) {
      Isa::StoreBf16Stochastic(r.param, i, p, r.key, r.index_lo + static_cast<uint32_t>(i), tag);
    } else {
      Isa::template Store<kElemF32>(r.param, i, p, tag);
    }
    if constexpr (C != kElemNone) Isa::template Store<C>(r.param_copy, i, p, tag);
    if constexpr (Blockwise(M1) || Blockwise(M2)) {
      Isa::template Store<kElemF32>(mt, i - b0, m, tag);
      Isa::template Store<kElemF32>(vt, i - b0, v, tag);
      if constexpr (Blockwise(M2)) vmax = Max(vmax, Isa::Abs(v));  // a tail's missing lanes are 0
      if constexpr (Blockwise(M1)) mmax = Max(mmax, Isa::Abs(m));  // the first moment's scale before the coupling (StoreBlock)
    } else {
      StoreMoment<M1>(r.exp_avg, i, m, tag);
      StoreMoment<M2>(r.exp_avg_sq, i, v, tag);
    }
  }

  // The second moment stored (q4: after the block); the first moment coupled to it and then stored,
  // encoded (kEncodeFirst: q8, with the multiplier mr), or (q8, q4) kept for its scale.
  template <int M1, int M2, bool kEncodeFirst, class Tag>
  static void CoupleAt(const CompactRange& r, float* mt, const float* vt, int64_t b0, int64_t j, float vr, float mr, V& am,
                       Tag tag) {
    V m = Isa::template Load<kElemF32>(mt, j, tag);
    const V v = Isa::template Load<kElemF32>(vt, j, tag);
    if constexpr (M2 == kMomQ8) {
      Isa::template EncodeQ8<false>(r.exp_avg_sq, b0 + j, v, V(vr), tag);
      m = Isa::ZeroUnlessAbove(m, v * V(vr), kQ8UnsignedZero);
    } else if constexpr (M2 == kMomQ4) {
      if (vr == 0.0f) m = V(0.0f);  // no q4 code is zero: only a block whose scale is 0 decodes to 0
    } else {
      StoreMoment<M2>(r.exp_avg_sq, b0 + j, v, tag);
    }
    if constexpr (kEncodeFirst) {
      am = Max(am, Isa::Abs(m));
      Isa::template EncodeQ8<true>(r.exp_avg, b0 + j, m, V(mr), tag);
    } else if constexpr (Blockwise(M1)) {
      Isa::template Store<kElemF32>(mt, j, m, tag);
      am = Max(am, Isa::Abs(m));  // a tail's missing lanes loaded as 0 and stay 0
    } else {
      StoreMoment<M1>(r.exp_avg, b0 + j, m, tag);
    }
  }
  // The coupling's pass over a block; returns the first moment's largest magnitudes, lane by lane.
  template <int M1, int M2, bool kEncodeFirst = false>
  static V CoupleBlock(const CompactRange& r, float* mt, const float* vt, int64_t b0, int64_t n, float vr, float mr = 0.0f) {
    V am(0.0f);
    int64_t j = 0;
    for (; j + W <= n; j += W) CoupleAt<M1, M2, kEncodeFirst>(r, mt, vt, b0, j, vr, mr, am, typename Isa::Full{});
    if (j < n) CoupleAt<M1, M2, kEncodeFirst>(r, mt, vt, b0, j, vr, mr, am, Isa::MakeTail(n - j));
    return am;
  }
  template <class Tag>
  static void EncodeFirstAt(const CompactRange& r, const float* mt, int64_t b0, int64_t j, float mr, Tag tag) {
    Isa::template EncodeQ8<true>(r.exp_avg, b0 + j, Isa::template Load<kElemF32>(mt, j, tag), V(mr), tag);
  }
  // The first moment's q8 scale and codes from mt (coupled), in a pass of their own.
  static void EncodeFirst(const CompactRange& r, const float* mt, int64_t b0, int64_t n, float mr) {
    int64_t j = 0;
    for (; j + W <= n; j += W) EncodeFirstAt(r, mt, b0, j, mr, typename Isa::Full{});
    if (j < n) EncodeFirstAt(r, mt, b0, j, mr, Isa::MakeTail(n - j));
  }
  // The q8 or q4 block [b0, b1) held in mt/vt (`vmax`, `mmax`: the moments' largest magnitudes, lane
  // by lane): the second moment's scale and codes, the coupling, then the first moment's scale (of what
  // is stored: the largest magnitude after the coupling) and codes.
  //
  // A q8 first moment is encoded in the coupling's pass, with the scale it had before the coupling
  // (`mmax`'s). The coupling only zeroes, so that is almost always the scale after it; where it is not
  // (in any bit), the block is coupled again and its first moment encoded in a pass of its own: the
  // stored bits are those of the three passes either way.
  template <int M1, int M2>
  static void StoreBlock(const CompactRange& r, float* mt, const float* vt, V vmax, V mmax, int64_t b0, int64_t b1) {
    const int64_t n = b1 - b0, q = b0 / r.block;
    float vr = 0;
    if constexpr (Blockwise(M2)) vr = Q8Recip(r.exp_avg_sq_scale[q] = Isa::LaneMax(vmax));
    if constexpr (M2 == kMomQ4) EncodeQ4<false>(vt, n, vr, static_cast<uint8_t*>(r.exp_avg_sq) + b0 / 2);
    if constexpr (M1 == kMomQ8) {
      const float guess = Isa::LaneMax(mmax);
      const float scale = r.exp_avg_scale[q] = Isa::LaneMax(CoupleBlock<M1, M2, true>(r, mt, vt, b0, n, vr, Q8Recip(guess)));
      if (std::bit_cast<uint32_t>(scale) != std::bit_cast<uint32_t>(guess)) [[unlikely]] {
        CoupleBlock<M1, M2>(r, mt, vt, b0, n, vr);
        EncodeFirst(r, mt, b0, n, Q8Recip(scale));
      }
      return;
    }
    if constexpr (M1 == kMomQ4 && M2 == kMomQ4) {
      // A q4 second moment has no zero code: the coupling zeroes the whole block's first moments where
      // vr is 0 and nothing otherwise, so the first moment's scale is mmax's, with no coupling pass.
      if (vr == 0.0f) {
        r.exp_avg_scale[q] = 0.0f;
        std::memset(static_cast<uint8_t*>(r.exp_avg) + b0 / 2, 0, static_cast<size_t>((n + 1) / 2));
      } else {
        EncodeQ4<true>(mt, n, Q8Recip(r.exp_avg_scale[q] = Isa::LaneMax(mmax)), static_cast<uint8_t*>(r.exp_avg) + b0 / 2);
      }
      return;
    }
    const V am = CoupleBlock<M1, M2>(r, mt, vt, b0, n, vr);
    if constexpr (M1 == kMomQ4) {
      const float mr = Q8Recip(r.exp_avg_scale[q] = Isa::LaneMax(am));
      EncodeQ4<true>(mt, n, mr, static_cast<uint8_t*>(r.exp_avg) + b0 / 2);
    }
  }

  // Prefetches the line of element i of a moment kept as M (q8: byte i, reached as a float's index; q4:
  // decoded a block ahead of its use, nothing to prefetch).
  template <int M>
  static void PrefetchMoment(const void* base, int64_t i) {
    if constexpr (M == kMomQ4) {
      return;
    } else if constexpr (M == kMomQ8) {
      Isa::template Prefetch<kElemF32>(base, i >> 2);  // i >= 0
    } else {
      Isa::template Prefetch<M == kMomBf16 ? kElemBf16 : kElemF32>(base, i);
    }
  }

  // What the compact step reads kCompactPrefetchElements after element i.
  template <int G, bool kSr, int M1, int M2>
  static void PrefetchAhead(const CompactRange& r, int64_t i) {
    Isa::template Prefetch<kSr ? kElemBf16 : kElemF32>(r.param, i + kCompactPrefetchElements);
    Isa::template Prefetch<G>(r.grad, i + kCompactPrefetchElements);
    PrefetchMoment<M1>(r.exp_avg, i + kCompactPrefetchElements);
    PrefetchMoment<M2>(r.exp_avg_sq, i + kCompactPrefetchElements);
  }

  // A block's update, then (q8 or q4 moments) its StoreBlock. Running block k's update in one loop with
  // block k-1's StoreBlock pass measured slower in memory (docs/kernels.md).
  template <int G, int C, bool kSr, int M1, int M2>
  static void CompactLoop(const AdamStepScalars& s, const CompactRange& range) {
    constexpr bool kQ = Blockwise(M1) || Blockwise(M2);
    const CompactRange r = range;  // a copy the code stores cannot alias
    alignas(64) float mt[kQ ? kMaxQuantBlock : 1];
    alignas(64) float vt[kQ ? kMaxQuantBlock : 1];
    const int64_t blk = kQ ? r.block : r.end - r.begin;
    for (int64_t b0 = r.begin; b0 < r.end; b0 += blk) {
      const int64_t b1 = std::min(b0 + blk, r.end);
      const float ms = Blockwise(M1) ? r.exp_avg_scale[b0 / blk] : 0.0f, vs = Blockwise(M2) ? r.exp_avg_sq_scale[b0 / blk] : 0.0f;
      if constexpr (M1 == kMomQ4) DecodeQ4<true>(static_cast<const uint8_t*>(r.exp_avg) + b0 / 2, b1 - b0, ms, mt);
      if constexpr (M2 == kMomQ4) DecodeQ4<false>(static_cast<const uint8_t*>(r.exp_avg_sq) + b0 / 2, b1 - b0, vs, vt);
      V vmax(0.0f), mmax(0.0f);
      int64_t i = b0;
      for (; i + W <= b1; i += W) {
        PrefetchAhead<G, kSr, M1, M2>(r, i);
        CompactAt<G, C, kSr, M1, M2>(s, r, ms, vs, b0, mt, vt, vmax, mmax, i, typename Isa::Full{});
      }
      if (i < b1) CompactAt<G, C, kSr, M1, M2>(s, r, ms, vs, b0, mt, vt, vmax, mmax, i, Isa::MakeTail(b1 - i));
      if constexpr (kQ) StoreBlock<M1, M2>(r, mt, vt, vmax, mmax, b0, b1);
    }
  }

  template <int G, int C, bool kSr, int M1>
  static void CompactM2(const AdamStepScalars& s, const CompactRange& r, int m2) {
    switch (m2) {
      case kMomQ4: return CompactLoop<G, C, kSr, M1, kMomQ4>(s, r);
      case kMomQ8: return CompactLoop<G, C, kSr, M1, kMomQ8>(s, r);
      case kMomBf16: return CompactLoop<G, C, kSr, M1, kMomBf16>(s, r);
      default: return CompactLoop<G, C, kSr, M1, kMomF32>(s, r);
    }
  }
  template <int G, int C, bool kSr>
  static void CompactM1(const AdamStepScalars& s, const CompactRange& r, const CompactKinds& k) {
    switch (k.exp_avg) {
      case kMomQ4: return CompactM2<G, C, kSr, kMomQ4>(s, r, k.exp_avg_sq);
      case kMomQ8: return CompactM2<G, C, kSr, kMomQ8>(s, r, k.exp_avg_sq);
      case kMomBf16: return CompactM2<G, C, kSr, kMomBf16>(s, r, k.exp_avg_sq);
      default: return CompactM2<G, C, kSr, kMomF32>(s, r, k.exp_avg_sq);
    }
  }
  template <int G>
  static void CompactCopy(const AdamStepScalars& s, const CompactRange& r, const CompactKinds& k) {
    if (k.sr) return CompactM1<G, kElemNone, true>(s, r, k);
    switch (k.copy) {
      case kElemBf16: return CompactM1<G, kElemBf16, false>(s, r, k);
      case kElemF16: return CompactM1<G, kElemF16, false>(s, r, k);
      default: return CompactM1<G, kElemNone, false>(s, r, k);
    }
  }
  static void AdamCompact(const AdamStepScalars& s, const CompactRange& r, const CompactKinds& k) {
    switch (k.grad) {
      case kElemBf16: return CompactCopy<kElemBf16>(s, r, k);
      case kElemF16: return CompactCopy<kElemF16>(s, r, k);
      default: return CompactCopy<kElemF32>(s, r, k);
    }
  }

  static constexpr CpuKernelTable kTable = {&Adam, &SumSquares, &Cast, &AdamCompact};
};

}  // namespace zrt::kernels::internal
