// AVX-512 CPU kernels (F, BW, VL, DQ + F16C): 16 floats per vector, masked tails.
// Built with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mf16c -ffp-contract=off; called only when
// DetectCpuIsa() says the CPU and OS support it. Built a second time with -mavx512bf16 as
// cpu_avx512_bf16.cc (CpuIsa::kAvx512Bf16): the same unit, its bf16 narrowing by that instruction.
//
// bf16 narrowing uses the integer round-to-nearest-even trick; built with AVX512-BF16, its
// vcvtneps2bf16 for vectors without a subnormal input (which that instruction reads as zero, so they
// keep the integer form: the bits stay the scalar path's and PyTorch's).
#include <immintrin.h>

#include "zrt/kernels/cpu_loops.h"

namespace zrt::kernels::avx512 {
namespace {

using internal::kElemBf16;
using internal::kElemF16;

struct Vec {
  __m512 v;
  Vec() = default;
  Vec(__m512 x) : v(x) {}                   // NOLINT: implicit by design
  Vec(float f) : v(_mm512_set1_ps(f)) {}  // NOLINT
};
inline Vec operator+(Vec a, Vec b) { return _mm512_add_ps(a.v, b.v); }
inline Vec operator-(Vec a, Vec b) { return _mm512_sub_ps(a.v, b.v); }
inline Vec operator*(Vec a, Vec b) { return _mm512_mul_ps(a.v, b.v); }
inline Vec operator/(Vec a, Vec b) { return _mm512_div_ps(a.v, b.v); }
inline Vec Sqrt(Vec a) { return _mm512_sqrt_ps(a.v); }
inline Vec Max(Vec a, Vec b) { return _mm512_max_ps(a.v, b.v); }
inline Vec Fma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a.v, b.v, c.v); }

// float -> bf16 bits (RNE, NaN quieted), one 16-bit result per 32-bit lane.
inline __m256i ToBf16Int(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(r);
}
#if defined(__AVX512BF16__)
// AVX512-BF16's conversion rounds the same way and quiets a NaN the same way, but reads a subnormal
// input as zero: a vector holding one (below 2^-126, rare) takes the integer path.
inline __m256i ToBf16(__m512 x) {
  if (_mm512_fpclass_ps_mask(x, 0x20) != 0) [[unlikely]] return ToBf16Int(x);
  return reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x));
}
#else
inline __m256i ToBf16(__m512 x) { return ToBf16Int(x); }
#endif
#if defined(__AVX512BF16__)
// The BF16 unit's CPUs (Zen 4 measured) permute words in one operation, where a zero-extension and a
// shift, or a shift and a narrowing, cost two: bf16 loads (each into the high half of its lane, the low
// halves zeroed) and the stochastic rounding's narrowing (the high halves of 16 lanes) take a permute.
// Without BF16 (Intel's AVX-512 cores, where a word permute is two micro-ops) the shifts stay.
inline __m512 FromBf16(__m256i h) {
  const __m512i to_high = _mm512_set_epi16(15, 0, 14, 0, 13, 0, 12, 0, 11, 0, 10, 0, 9, 0, 8, 0, 7, 0, 6, 0, 5, 0, 4, 0, 3, 0, 2, 0, 1, 0, 0, 0);
  return _mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(0xaaaaaaaau, to_high, _mm512_castsi256_si512(h)));
}
inline __m256i HighHalves(__m512i x) {
  const __m512i odd = _mm512_set_epi16(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1, 31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  return _mm512_castsi512_si256(_mm512_permutexvar_epi16(odd, x));
}
#else
inline __m512 FromBf16(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }
inline __m256i HighHalves(__m512i x) { return _mm512_cvtepi32_epi16(_mm512_srli_epi32(x, 16)); }
#endif

// The low byte of each 32-bit lane, in lane order. The BF16 unit is built with AVX512-VBMI too (every
// CPU with AVX512-BF16 but Cooper Lake has it; DetectCpuIsa asks for both): one byte permute, where
// the narrowing vpmovdb is two operations on Intel's cores.
#if defined(__AVX512VBMI__)
inline __m128i LowBytes(__m512i x) {
  const __m512i low = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x3c383430, 0x2c282420, 0x1c181410, 0x0c080400);
  return _mm512_castsi512_si128(_mm512_permutexvar_epi8(low, x));
}
#else
inline __m128i LowBytes(__m512i x) { return _mm512_cvtepi32_epi8(x); }
#endif

// 16 q4 codes (one per 32-bit lane, each < 16) packed two a byte, element 2k in byte k's low nibble:
// 8 bytes. A 64-bit lane's high code shifted down by 28 lands on its low byte's high nibble.
inline __m128i PackNibbles(__m512i code) {
  const __m512i pairs = _mm512_or_si512(code, _mm512_srli_epi64(code, 28));
#if defined(__AVX512VBMI__)
  const __m512i low = _mm512_set_epi64(0, 0, 0, 0, 0, 0, 0, 0x3830282018100800);
  return _mm512_castsi512_si128(_mm512_permutexvar_epi8(low, pairs));
#else
  return _mm512_cvtepi64_epi8(pairs);
#endif
}

// The signed q4 encoder's tables over k, the integer nearest r * 24 (0..24 used of 32): below[k] counts
// the thresholds (Q4SignedMid, each the f32 nearest j / 24 for an integer j) at j < k, and at[k] is the
// threshold at j = k, or infinity where there is none. r * 24 rounded is within 24 * 2^-24 of r * 24,
// k within 1/2 of that, and 24 times a threshold within 20 * 2^-24 of its j: a threshold at j != k is
// on its side of r with at least 1/2 - 2^-18 to spare.
struct Q4Thresholds {
  alignas(64) int32_t below[32];
  alignas(64) float at[32];
};
constexpr Q4Thresholds MakeQ4SignedThresholds() {
  Q4Thresholds x{};
  for (int k = 0; k < 32; ++k) {
    x.at[k] = __builtin_inff();
    for (int j = 0; j < 7; ++j) {
      const auto at = static_cast<int>(Q4SignedMid(j) * 24.0f + 0.5f);
      x.below[k] += at < k ? 1 : 0;
      if (at == k) x.at[k] = Q4SignedMid(j);
    }
  }
  return x;
}
inline constexpr Q4Thresholds kQ4SignedThresholds = MakeQ4SignedThresholds();

// ---- compact state (quant_math.h): the scalar definitions' integer and float operations, 16 lanes ----
inline __m512i Set(uint32_t x) { return _mm512_set1_epi32(static_cast<int>(x)); }
// Fmix32(key ^ index) >> 16 (quant_math.h), the stochastic rounding's bits: Fmix32's last xor-shift
// leaves the high half as it is, so it is left out.
inline __m512i RoundingBits(uint32_t key, __m512i index) {
  __m512i h = _mm512_xor_si512(Set(key), index);
  h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
  h = _mm512_mullo_epi32(h, Set(0x85ebca6bu));
  h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 13));
  h = _mm512_mullo_epi32(h, Set(0xc2b2ae35u));
  return _mm512_srli_epi32(h, 16);
}
// An unsigned code's bits shifted into a float's top bits are its value (exponent e + 127 - 31, 3
// mantissa bits) for e > 0; for e = 0 that reads 2^-31 (1 + f/8), and the value f 2^-33 is twice that
// less 2^-30, exactly (one fused multiply-subtract).
inline __m512 Q8DecodeUnsigned(__m512i c) {
  const __m512 v = _mm512_castsi512_ps(_mm512_add_epi32(_mm512_slli_epi32(c, 20), Set((127u - 31u) << 23)));
  const __mmask16 sub = _mm512_cmplt_epu32_mask(c, Set(8));
  return _mm512_mask_fmsub_ps(v, sub, _mm512_set1_ps(2.0f), _mm512_set1_ps(0x1p-30f));
}
template <bool kSigned>
inline __m128i Q8Encode(__m512 x, __m512 recip) {
  constexpr uint32_t kBias = kSigned ? 15 : 31;
  // A second moment is >= 0 or NaN: its magnitude is itself (a NaN's r is 1 either way).
  const __m512 ax = kSigned ? _mm512_and_ps(x, _mm512_castsi512_ps(Set(0x7fffffffu))) : x;
  const __m512 r = _mm512_min_ps(_mm512_mul_ps(ax, recip), _mm512_set1_ps(1.0f));
  const __m512i u = _mm512_castps_si512(r);
  // Round to nearest even on 3 fraction bits with the exponent's rebias folded in (no wrap for r at
  // or above the smallest normal code's value; smaller r take the branch below): the magnitude's code
  // in bits 20-26, 0 above.
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 20), Set(1));
  __m512i t = _mm512_add_epi32(_mm512_add_epi32(u, Set(0x7ffffu - ((127u - kBias) << 23))), lsb);
  // A signed code's sign (x's bit 31) in bit 27, code bit 7: a magnitude code of exponent > 0 is not 0.
  if constexpr (kSigned) t = _mm512_ternarylogic_epi32(t, _mm512_srli_epi32(_mm512_castps_si512(x), 4), Set(1u << 27), 0xd8);
  __m512i code = _mm512_srli_epi32(t, 20);
  // Codes of exponent 0 are rare (a value below 2^-14 of its block's largest): computed only when a lane has one.
  const __mmask16 is_sub = _mm512_cmp_ps_mask(r, _mm512_set1_ps(kSigned ? 0x1p-14f : 0x1p-30f), _CMP_LT_OQ);
  if (is_sub != 0) [[unlikely]] {
    __m512i mag = _mm512_cvtps_epi32(_mm512_mul_ps(r, _mm512_set1_ps(kSigned ? 0x1p17f : 0x1p33f)));
    if constexpr (kSigned) {  // the sign bit where the magnitude's code is not 0
      const __mmask16 neg_nonzero = _mm512_mask_test_epi32_mask(_mm512_movepi32_mask(_mm512_castps_si512(x)), mag, mag);
      mag = _mm512_mask_or_epi32(mag, neg_nonzero, mag, Set(0x80));
    }
    code = _mm512_mask_blend_epi32(is_sub, code, mag);
  }
  return LowBytes(code);
}
// Stochastic rounding to bf16 of 16 elements whose indices' low halves start at lo.
inline __m256i Bf16Stochastic(__m512 x, uint32_t key, uint32_t lo) {
  const __m512i idx = _mm512_add_epi32(Set(lo), _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  return HighHalves(_mm512_add_epi32(_mm512_castps_si512(x), RoundingBits(key, idx)));
}

struct Isa {
  using V = Vec;
  static constexpr int kWidth = 16;
  struct Full {};
  struct Tail {
    __mmask16 m;
  };
  static Tail MakeTail(int64_t n) { return Tail{static_cast<__mmask16>((1u << n) - 1u)}; }

  // Prefetches element i (may lie past the end: prefetches never fault).
  template <int K>
  static void Prefetch(const void* base, int64_t i) {
    __builtin_prefetch(static_cast<const char*>(base) + i * ((K == kElemBf16 || K == kElemF16) ? 2 : 4), 1, 3);
  }
  template <int K>
  static Vec Load(const void* base, int64_t i, Full) {
    if constexpr (K == kElemBf16 || K == kElemF16) {
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(base) + i));
      if constexpr (K == kElemBf16) return FromBf16(h);
      if constexpr (K == kElemF16) return _mm512_cvtph_ps(h);
    } else {
      return _mm512_loadu_ps(static_cast<const float*>(base) + i);
    }
  }
  template <int K>
  static Vec Load(const void* base, int64_t i, Tail t) {
    if constexpr (K == kElemBf16 || K == kElemF16) {
      const __m256i h = _mm256_maskz_loadu_epi16(t.m, static_cast<const uint16_t*>(base) + i);
      if constexpr (K == kElemBf16) return FromBf16(h);
      if constexpr (K == kElemF16) return _mm512_cvtph_ps(h);
    } else {
      return _mm512_maskz_loadu_ps(t.m, static_cast<const float*>(base) + i);
    }
  }
  template <int K>
  static void Store(void* base, int64_t i, Vec x, Full) {
    if constexpr (K == kElemBf16) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(base) + i), ToBf16(x.v));
    } else if constexpr (K == kElemF16) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(base) + i),
                          _mm512_cvtps_ph(x.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    } else {
      _mm512_storeu_ps(static_cast<float*>(base) + i, x.v);
    }
  }
  template <int K>
  static void Store(void* base, int64_t i, Vec x, Tail t) {
    if constexpr (K == kElemBf16) {
      _mm256_mask_storeu_epi16(static_cast<uint16_t*>(base) + i, t.m, ToBf16(x.v));
    } else if constexpr (K == kElemF16) {
      _mm256_mask_storeu_epi16(static_cast<uint16_t*>(base) + i, t.m,
                               _mm512_cvtps_ph(x.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    } else {
      _mm512_mask_storeu_ps(static_cast<float*>(base) + i, t.m, x.v);
    }
  }
  static Vec Abs(Vec x) { return _mm512_and_ps(x.v, _mm512_castsi512_ps(Set(0x7fffffffu))); }
  static float LaneMax(Vec x) { return _mm512_reduce_max_ps(x.v); }
  template <bool kSigned>
  static Vec DecodeQ8(const void* base, int64_t i, Full) {
    return DecodeQ8Bytes<kSigned>(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint8_t*>(base) + i)));
  }
  template <bool kSigned>
  static Vec DecodeQ8(const void* base, int64_t i, Tail t) {
    return DecodeQ8Bytes<kSigned>(_mm_maskz_loadu_epi8(t.m, static_cast<const uint8_t*>(base) + i));
  }
  // A signed code is an IEEE half's bits with the 4-bit exponent in the half's 5 (the same bias, 15)
  // and its 3 mantissa bits on top of the half's 10 (exponent 0: the half's subnormals, f 2^-17):
  // converted exactly by F16C. The unsigned code's exponent reaches 31, a half's infinities.
  // Sign-extended to 16 bits and shifted left by 7, the code's bits 0-6 land on the half's 7-13 and
  // its sign on bits 14 and 15: bit 14 (the half exponent's top bit, 0 here) is cleared.
  template <bool kSigned>
  static Vec DecodeQ8Bytes(__m128i bytes) {
    if constexpr (kSigned) {
      const __m256i t = _mm256_slli_epi16(_mm256_cvtepi8_epi16(bytes), 7);
      return _mm512_cvtph_ps(_mm256_and_si256(t, _mm256_set1_epi16(static_cast<short>(0xbfff))));
    } else {
      return Q8DecodeUnsigned(_mm512_cvtepu8_epi32(bytes));
    }
  }
  template <bool kSigned>
  static void EncodeQ8(void* base, int64_t i, Vec x, Vec recip, Full) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint8_t*>(base) + i), Q8Encode<kSigned>(x.v, recip.v));
  }
  template <bool kSigned>
  static void EncodeQ8(void* base, int64_t i, Vec x, Vec recip, Tail t) {
    _mm_mask_storeu_epi8(static_cast<uint8_t*>(base) + i, t.m, Q8Encode<kSigned>(x.v, recip.v));
  }
  // q4 (quant_math.h), a block at a time: 16 codes decoded by a 16-entry table (one permute), and 16
  // encoded with the scalar rule's arithmetic (r's compares, or r * 16 + 1/2 truncated), then packed.
  template <bool kSigned>
  static void DecodeQ4(const void* bytes, int64_t n, float scale, float* out) {
    const auto* b = static_cast<const uint8_t*>(bytes);
    const __m512 table = _mm512_mul_ps(_mm512_loadu_ps(Q4Table(kSigned)), _mm512_set1_ps(scale));  // value * scale, per code
    // Byte k in lanes 2k and 2k + 1, its high nibble shifted down in the odd lane: the permute reads
    // only an index's low 4 bits, so the even lane's high nibble needs no mask.
    const __m512i nibble = _mm512_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
      const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + i / 2));
      const __m512i c = _mm512_srlv_epi32(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(v, v)), nibble);
      _mm512_storeu_ps(out + i, _mm512_permutexvar_ps(c, table));
    }
    for (; i < n; ++i) out[i] = Q4Value(Q4CodeAt(b, i), kSigned) * scale;
  }
  template <bool kSigned>
  static void EncodeQ4(const float* x, int64_t n, float recip, void* bytes) {
    auto* b = static_cast<uint8_t*>(bytes);
    const __m512 rv = _mm512_set1_ps(recip), one = _mm512_set1_ps(1.0f);
    const Q4Thresholds& t = kQ4SignedThresholds;
    const __m512i below_lo = _mm512_load_si512(t.below), below_hi = _mm512_load_si512(t.below + 16);
    const __m512 at_lo = _mm512_load_ps(t.at), at_hi = _mm512_load_ps(t.at + 16);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
      const __m512 xv = _mm512_loadu_ps(x + i);
      // A second moment is >= 0 or NaN: its magnitude is itself. NaN: r = 1, as the scalar min.
      const __m512 r = _mm512_min_ps(_mm512_mul_ps(kSigned ? _mm512_abs_ps(xv) : xv, rv), one);
      __m512i code;
      if constexpr (kSigned) {
        // The thresholds lie within an ulp of multiples of 1/24 (kQ4SignedThresholds): with k the integer
        // nearest r * 24, every threshold but the one at k is below or above r for certain, and that one
        // is compared exactly. The thresholds' count is then below[k] + (r >= at[k]).
        const __m512i k = _mm512_cvt_roundps_epi32(_mm512_mul_ps(r, _mm512_set1_ps(24.0f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m512i below = _mm512_permutex2var_epi32(below_lo, k, below_hi);
        const __mmask16 at = _mm512_cmp_ps_mask(r, _mm512_permutex2var_ps(at_lo, k, at_hi), _CMP_GE_OQ);
        const __m512i m = _mm512_mask_add_epi32(below, at, below, Set(1));
        const __mmask16 neg = _mm512_movepi32_mask(_mm512_castps_si512(xv)) & _mm512_test_epi32_mask(m, m);
        code = _mm512_mask_or_epi32(m, neg, m, Set(8));
      } else {
        // max(floor(r * 16 + 1/2), 1) - 1 is floor(r * 16 - 1/2) for r * 16 >= 1/2 and 0 below, where
        // r * 16 - 1/2 lies in (-1, 0): truncated, it is that. r * 16 - 1/2 is exact (one fused operation).
        code = _mm512_cvttps_epi32(_mm512_fmadd_ps(r, _mm512_set1_ps(16.0f), _mm512_set1_ps(-0.5f)));
      }
      _mm_storel_epi64(reinterpret_cast<__m128i*>(b + i / 2), PackNibbles(code));
    }
    Q4EncodeCodes(x + i, n - i, recip, kSigned, b + i / 2);  // i is even
  }
  static Vec ZeroUnlessAbove(Vec m, Vec r, float t) { return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(r.v, _mm512_set1_ps(t), _CMP_GT_OQ), m.v); }
  static void StoreBf16Stochastic(void* base, int64_t i, Vec x, uint32_t key, uint32_t lo, Full) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(base) + i), Bf16Stochastic(x.v, key, lo));
  }
  static void StoreBf16Stochastic(void* base, int64_t i, Vec x, uint32_t key, uint32_t lo, Tail t) {
    _mm256_mask_storeu_epi16(static_cast<uint16_t*>(base) + i, t.m, Bf16Stochastic(x.v, key, lo));
  }

  static double LaneSumF64(Vec x) {
    const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(x.v));
    const __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x.v), 1)));
    return _mm512_reduce_add_pd(_mm512_add_pd(lo, hi));
  }
};

}  // namespace
}  // namespace zrt::kernels::avx512

namespace zrt::kernels::internal {
#if defined(__AVX512BF16__)
const CpuKernelTable& Avx512Bf16Kernels() { return Kernels<avx512::Isa>::kTable; }
#else
const CpuKernelTable& Avx512Kernels() { return Kernels<avx512::Isa>::kTable; }
#endif
}  // namespace zrt::kernels::internal
