// AVX2 + FMA-capable CPUs (F16C for halves): 8 floats per vector; tails go through a stack buffer.
// Built with -mavx2 -mfma -mf16c -ffp-contract=off: FMA only where adam_math.h says Fma, so results
// equal the scalar path's.
#include <immintrin.h>

#include <cstring>

#include "zrt/kernels/cpu_loops.h"

namespace zrt::kernels::avx2 {
namespace {

using internal::kElemBf16;
using internal::kElemF16;

struct Vec {
  __m256 v;
  Vec() = default;
  Vec(__m256 x) : v(x) {}                   // NOLINT: implicit by design
  Vec(float f) : v(_mm256_set1_ps(f)) {}  // NOLINT
};
inline Vec operator+(Vec a, Vec b) { return _mm256_add_ps(a.v, b.v); }
inline Vec operator-(Vec a, Vec b) { return _mm256_sub_ps(a.v, b.v); }
inline Vec operator*(Vec a, Vec b) { return _mm256_mul_ps(a.v, b.v); }
inline Vec operator/(Vec a, Vec b) { return _mm256_div_ps(a.v, b.v); }
inline Vec Sqrt(Vec a) { return _mm256_sqrt_ps(a.v); }
inline Vec Max(Vec a, Vec b) { return _mm256_max_ps(a.v, b.v); }
inline Vec Fma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a.v, b.v, c.v); }

inline __m128i ToBf16(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i nanbits = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  r = _mm256_blendv_epi8(r, nanbits, nan);
  // Pack 8 x u32 (each < 2^16) into 8 x u16: packus works per 128-bit lane, so fix the order after.
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  return _mm256_castsi256_si128(packed);
}
inline __m256 FromBf16(__m128i h) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); }

// ---- compact state (quant_math.h): the scalar definitions' integer and float operations, 8 lanes ----
inline __m256i Set(uint32_t x) { return _mm256_set1_epi32(static_cast<int>(x)); }
// Fmix32(key ^ index) >> 16 (quant_math.h), the stochastic rounding's bits: Fmix32's last xor-shift
// leaves the high half as it is, so it is left out.
inline __m256i RoundingBits(uint32_t key, __m256i index) {
  __m256i h = _mm256_xor_si256(Set(key), index);
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
  h = _mm256_mullo_epi32(h, Set(0x85ebca6bu));
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 13));
  h = _mm256_mullo_epi32(h, Set(0xc2b2ae35u));
  return _mm256_srli_epi32(h, 16);
}
// As cpu_avx512.cc's: an unsigned code's bits shifted into a float's top bits are its value for e > 0,
// and for e = 0 that reads 2^-31 (1 + f/8), from which 2 x - 2^-30 is f 2^-33 exactly.
inline __m256 Q8DecodeUnsigned(__m256i c) {
  const __m256 v = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_slli_epi32(c, 20), Set((127u - 31u) << 23)));
  const __m256 sub = _mm256_castsi256_ps(_mm256_cmpgt_epi32(Set(8), c));
  return _mm256_blendv_ps(v, _mm256_fmsub_ps(v, _mm256_set1_ps(2.0f), _mm256_set1_ps(0x1p-30f)), sub);
}
// As cpu_avx512.cc's: a signed code, sign-extended to 16 bits and shifted left by 7, is an IEEE half
// once bit 14 is cleared (its 4-bit exponent in the half's 5, the same bias; exponent 0: the half's
// subnormals), converted exactly by F16C.
inline __m256 Q8DecodeSigned(__m128i bytes) {
  const __m128i t = _mm_slli_epi16(_mm_cvtepi8_epi16(bytes), 7);
  return _mm256_cvtph_ps(_mm_and_si128(t, _mm_set1_epi16(static_cast<short>(0xbfff))));
}
template <bool kSigned>
inline __m256i Q8Encode(__m256 x, __m256 recip) {
  constexpr uint32_t kBias = kSigned ? 15 : 31;
  // A second moment is >= 0 or NaN: its magnitude is itself (a NaN's r is 1 either way).
  const __m256 ax = kSigned ? _mm256_and_ps(x, _mm256_castsi256_ps(Set(0x7fffffffu))) : x;
  const __m256 r = _mm256_min_ps(_mm256_mul_ps(ax, recip), _mm256_set1_ps(1.0f));
  const __m256i u = _mm256_castps_si256(r);
  // Round to nearest even on 3 fraction bits with the exponent's rebias folded in (no wrap for r at
  // or above the smallest normal code's value; smaller r take the branch below): the magnitude's code
  // in bits 20-26, 0 above.
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 20), Set(1));
  __m256i t = _mm256_add_epi32(_mm256_add_epi32(u, Set(0x7ffffu - ((127u - kBias) << 23))), lsb);
  // A signed code's sign (x's bit 31) in bit 27, code bit 7: a magnitude code of exponent > 0 is not 0.
  if constexpr (kSigned) t = _mm256_or_si256(t, _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(x), 4), Set(1u << 27)));
  __m256i code = _mm256_srli_epi32(t, 20);
  // Codes of exponent 0 are rare (a value below 2^-14 of its block's largest): computed only when a lane has one.
  const __m256 is_sub = _mm256_cmp_ps(r, _mm256_set1_ps(kSigned ? 0x1p-14f : 0x1p-30f), _CMP_LT_OQ);
  if (_mm256_movemask_ps(is_sub) != 0) [[unlikely]] {
    __m256i mag = _mm256_cvtps_epi32(_mm256_mul_ps(r, _mm256_set1_ps(kSigned ? 0x1p17f : 0x1p33f)));
    if constexpr (kSigned) {  // the sign bit where the magnitude's code is not 0
      const __m256i neg = _mm256_srai_epi32(_mm256_castps_si256(x), 31);
      const __m256i zero = _mm256_cmpeq_epi32(mag, _mm256_setzero_si256());
      mag = _mm256_or_si256(mag, _mm256_andnot_si256(zero, _mm256_and_si256(neg, Set(0x80))));
    }
    code = _mm256_blendv_epi8(code, mag, _mm256_castps_si256(is_sub));
  }
  return code;
}
// The low byte of each 32-bit lane, in order, in the low 8 bytes: a byte shuffle within each 128-bit
// half, then one lane permute joins the halves' four bytes.
inline __m128i LowBytes(__m256i v) {
  const __m256i shuf = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                        0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  return _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(v, shuf), _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0)));
}
// Stochastic rounding to bf16 of 8 elements whose indices' low halves start at lo.
inline __m128i Bf16Stochastic(__m256 x, uint32_t key, uint32_t lo) {
  const __m256i idx = _mm256_add_epi32(Set(lo), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_castps_si256(x), RoundingBits(key, idx)), 16);
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08));
}

struct Isa {
  using V = Vec;
  static constexpr int kWidth = 8;
  struct Full {};
  struct Tail {
    int n;
  };
  static Tail MakeTail(int64_t n) { return Tail{static_cast<int>(n)}; }

  // Prefetches element i (may lie past the end: prefetches never fault).
  template <int K>
  static void Prefetch(const void* base, int64_t i) {
    __builtin_prefetch(static_cast<const char*>(base) + i * ((K == kElemBf16 || K == kElemF16) ? 2 : 4), 1, 3);
  }
  template <int K>
  static Vec Load(const void* base, int64_t i, Full) {
    if constexpr (K == kElemBf16 || K == kElemF16) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + i));
      if constexpr (K == kElemBf16) return FromBf16(h);
      if constexpr (K == kElemF16) return _mm256_cvtph_ps(h);
    } else {
      return _mm256_loadu_ps(static_cast<const float*>(base) + i);
    }
  }
  template <int K>
  static Vec Load(const void* base, int64_t i, Tail t) {
    // Copy the n valid elements into a zeroed full vector's worth of storage.
    alignas(32) float buf[8] = {};
    const size_t elem = (K == kElemBf16 || K == kElemF16) ? 2 : 4;
    std::memcpy(buf, static_cast<const char*>(base) + static_cast<size_t>(i) * elem, static_cast<size_t>(t.n) * elem);
    return Load<K>(buf, 0, Full{});
  }
  template <int K>
  static void Store(void* base, int64_t i, Vec x, Full) {
    if constexpr (K == kElemBf16) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(base) + i), ToBf16(x.v));
    } else if constexpr (K == kElemF16) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(base) + i),
                       _mm256_cvtps_ph(x.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    } else {
      _mm256_storeu_ps(static_cast<float*>(base) + i, x.v);
    }
  }
  template <int K>
  static void Store(void* base, int64_t i, Vec x, Tail t) {
    alignas(32) float buf[8];
    Store<K>(buf, 0, x, Full{});
    const size_t elem = (K == kElemBf16 || K == kElemF16) ? 2 : 4;
    std::memcpy(static_cast<char*>(base) + static_cast<size_t>(i) * elem, buf, static_cast<size_t>(t.n) * elem);
  }
  static Vec Abs(Vec x) { return _mm256_and_ps(x.v, _mm256_castsi256_ps(Set(0x7fffffffu))); }
  static float LaneMax(Vec x) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(x.v), _mm256_extractf128_ps(x.v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
  }
  template <bool kSigned>
  static Vec DecodeQ8(const void* base, int64_t i, Full) {
    return DecodeQ8Bytes<kSigned>(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(static_cast<const uint8_t*>(base) + i)));
  }
  template <bool kSigned>
  static Vec DecodeQ8(const void* base, int64_t i, Tail t) {
    uint64_t buf = 0;
    std::memcpy(&buf, static_cast<const uint8_t*>(base) + i, static_cast<size_t>(t.n));
    return DecodeQ8Bytes<kSigned>(_mm_cvtsi64_si128(static_cast<long long>(buf)));
  }
  template <bool kSigned>
  static Vec DecodeQ8Bytes(__m128i bytes) {  // 8 codes in the low bytes
    if constexpr (kSigned) return Q8DecodeSigned(bytes);
    return Q8DecodeUnsigned(_mm256_cvtepu8_epi32(bytes));
  }
  template <bool kSigned>
  static void EncodeQ8(void* base, int64_t i, Vec x, Vec recip, Full) {
    _mm_storel_epi64(reinterpret_cast<__m128i*>(static_cast<uint8_t*>(base) + i), LowBytes(Q8Encode<kSigned>(x.v, recip.v)));
  }
  template <bool kSigned>
  static void EncodeQ8(void* base, int64_t i, Vec x, Vec recip, Tail t) {
    const auto b = static_cast<uint64_t>(_mm_cvtsi128_si64(LowBytes(Q8Encode<kSigned>(x.v, recip.v))));
    std::memcpy(static_cast<uint8_t*>(base) + i, &b, static_cast<size_t>(t.n));
  }
  // q4 (quant_math.h), a block at a time, 8 codes a vector: decoded by a 16-entry table (two 8-entry
  // permutes, the code's bit 3 choosing), encoded with the scalar rule's arithmetic (the unsigned code
  // in one fused operation, exactly), then packed.
  template <bool kSigned>
  static void DecodeQ4(const void* bytes, int64_t n, float scale, float* out) {
    const auto* b = static_cast<const uint8_t*>(bytes);
    const float* value = Q4Table(kSigned);
    const __m256 s = _mm256_set1_ps(scale);
    const __m256 lo_table = _mm256_mul_ps(_mm256_loadu_ps(value), s), hi_table = _mm256_mul_ps(_mm256_loadu_ps(value + 8), s);
    const __m128i low = _mm_set1_epi8(0x0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      int32_t four;
      std::memcpy(&four, b + i / 2, 4);
      const __m128i v = _mm_cvtsi32_si128(four);
      const __m128i c = _mm_unpacklo_epi8(_mm_and_si128(v, low), _mm_and_si128(_mm_srli_epi16(v, 4), low));  // in element order
      const __m256i idx = _mm256_cvtepu8_epi32(c);
      const __m256 high = _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28));  // sign bit: codes 8..15
      _mm256_storeu_ps(out + i, _mm256_blendv_ps(_mm256_permutevar8x32_ps(lo_table, idx), _mm256_permutevar8x32_ps(hi_table, idx), high));
    }
    for (; i < n; ++i) out[i] = value[Q4CodeAt(b, i)] * scale;
  }
  template <bool kSigned>
  static void EncodeQ4(const float* x, int64_t n, float recip, void* bytes) {
    auto* b = static_cast<uint8_t*>(bytes);
    const __m256 rv = _mm256_set1_ps(recip), one = _mm256_set1_ps(1.0f), abs = _mm256_castsi256_ps(Set(0x7fffffffu));
    const __m256i pick = _mm256_setr_epi8(0, 8, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                          0, 8, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      const __m256 xv = _mm256_loadu_ps(x + i);
      // A second moment is >= 0 or NaN: its magnitude is itself. NaN: r = 1, as the scalar min.
      const __m256 r = _mm256_min_ps(_mm256_mul_ps(kSigned ? _mm256_and_ps(xv, abs) : xv, rv), one);
      __m256i code;
      if constexpr (kSigned) {
        __m256i m = _mm256_setzero_si256();
        for (int k = 0; k < 7; ++k) m = _mm256_sub_epi32(m, _mm256_castps_si256(_mm256_cmp_ps(r, _mm256_set1_ps(Q4SignedMid(k)), _CMP_GE_OQ)));
        const __m256i neg = _mm256_andnot_si256(_mm256_cmpeq_epi32(m, _mm256_setzero_si256()), _mm256_srai_epi32(_mm256_castps_si256(xv), 31));
        code = _mm256_or_si256(m, _mm256_and_si256(neg, Set(8)));
      } else {
        // max(floor(r * 16 + 1/2), 1) - 1, as AVX-512's: the fused r * 16 - 1/2 (exact) truncated.
        code = _mm256_cvttps_epi32(_mm256_fmadd_ps(r, _mm256_set1_ps(16.0f), _mm256_set1_ps(-0.5f)));
      }
      // Each 64-bit pair (even, odd code) to even | odd << 4 in its low byte, then the four bytes gathered.
      const __m256i pairs = _mm256_shuffle_epi8(_mm256_or_si256(code, _mm256_srli_epi64(code, 28)), pick);
      const auto four = static_cast<uint32_t>(_mm256_extract_epi16(pairs, 0)) | static_cast<uint32_t>(_mm256_extract_epi16(pairs, 8)) << 16;
      std::memcpy(b + i / 2, &four, 4);
    }
    Q4EncodeCodes(x + i, n - i, recip, kSigned, b + i / 2);  // i is even
  }
  static Vec ZeroUnlessAbove(Vec m, Vec r, float t) { return _mm256_and_ps(m.v, _mm256_cmp_ps(r.v, _mm256_set1_ps(t), _CMP_GT_OQ)); }
  static void StoreBf16Stochastic(void* base, int64_t i, Vec x, uint32_t key, uint32_t lo, Full) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(base) + i), Bf16Stochastic(x.v, key, lo));
  }
  static void StoreBf16Stochastic(void* base, int64_t i, Vec x, uint32_t key, uint32_t lo, Tail t) {
    alignas(16) uint16_t buf[8];
    _mm_store_si128(reinterpret_cast<__m128i*>(buf), Bf16Stochastic(x.v, key, lo));
    std::memcpy(static_cast<uint16_t*>(base) + i, buf, static_cast<size_t>(t.n) * 2);
  }

  static double LaneSumF64(Vec x) {
    const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x.v));
    const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x.v, 1));
    const __m256d s = _mm256_add_pd(lo, hi);
    const __m128d s2 = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
    return _mm_cvtsd_f64(_mm_add_sd(s2, _mm_unpackhi_pd(s2, s2)));
  }
};

}  // namespace
}  // namespace zrt::kernels::avx2

namespace zrt::kernels::internal {
const CpuKernelTable& Avx2Kernels() { return Kernels<avx2::Isa>::kTable; }
}  // namespace zrt::kernels::internal
