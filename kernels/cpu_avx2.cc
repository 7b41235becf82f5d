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
