// Compact optimizer state, one element at a time: the single definition of the 8-bit block-wise code
// and of stochastic rounding that the scalar CPU kernel and the CUDA kernel share, and that the AVX2 and
// AVX-512 kernels reproduce bit for bit (kernels/quant_test.cc checks every path against these and
// against an independent NumPy implementation of the rule). docs/kernels.md "Compact state" says the
// same in prose.
//
// 8-bit block-wise moments. A moment is cut into blocks of B elements (B a power of two, 256 by
// default; the blocks of a tensor's shard start at its element 0, which lies at a multiple of B in the
// group's flat buffer, so resharding moves whole blocks and never re-quantizes). A block is stored as B
// one-byte codes and one f32 scale s: the largest magnitude in the block (0 for an all-zero block).
// A code is a small floating-point number relative to s, non-linear as 8-bit Adam's (more codes near
// zero), signed for the first moment and unsigned for the second:
//   unsigned (exp_avg_sq): code = e << 3 | f, e in 0..31, f in 0..7
//                          value = 2^(e - 31) (1 + f/8) for e >= 1, 2^-30 f/8 for e = 0
//   signed   (exp_avg):    code = sign << 7 | e << 3 | f, e in 0..15, f in 0..7
//                          value = (-1)^sign 2^(e - 15) (1 + f/8) for e >= 1, (-1)^sign 2^-14 f/8 for e = 0
// (1.0, the block's largest magnitude, is code 248 resp. 120; larger codes are never written.)
//   decode: x = value(code) * s, one f32 multiply.
//   encode: r = min(|x| * (1 / s), 1) with 1/s one f32 division (r = 0 when s = 0); the code whose value
//           is nearest r, ties to the even code: round to nearest even on 3 fraction bits (carrying into
//           the exponent) at or above the smallest normal value (2^-30 resp. 2^-14), below it
//           f = nearest even integer to r * 2^33 resp. r * 2^17. The sign bit is x's sign bit when the
//           magnitude's code is not 0 (no negative zero).
// A second moment that encodes to 0 cannot carry its element's update: that element's first moment is
// stored as 0 too (in any format), so the next step does not divide a surviving first moment by eps.
// The first moment's scale is then the largest magnitude of what is stored (after this coupling): a
// block's scale is always the largest magnitude its codes decode to (divided by the scale: 1.0), so
// decoding and encoding again gives back the very same codes and scale.
//
// Stochastic rounding of a 16-bit (bf16) parameter updated without an fp32 master: the f32 result's
// bits plus 16 random bits, truncated to the upper 16 (an unbiased rounding of the magnitude). The bits
// come from a counter-based hash of (seed, step, global element index), so a resumed or resharded run
// draws the very same bits: the 32-bit finalizer of MurmurHash3 (fmix32), keyed as
//   key(seed, step, hi) = fmix32(fmix32(fmix32(fmix32(seed ^ 0x5bd1e995) ^ step_lo) ^ step_hi) ^ hi)
//   bits(index)         = fmix32(key ^ lo) >> 16     (lo, hi: the index's low and high 32 bits)
#pragma once

#include <cstdint>

#include "zrt/core/dtype.h"

namespace zrt {

// The largest elements in a q8 block (the CPU kernel keeps a block's moments in two stack buffers).
inline constexpr int kMaxQuantBlock = 4096;
// A second moment whose r is at most this encodes to 0 (r * 2^33 <= 1/2 rounds to the even 0).
inline constexpr float kQ8UnsignedZero = 0x1p-34f;

ZRT_HD float Q8Value(uint8_t code, bool is_signed) {
  const uint32_t f = code & 7u;
  const uint32_t e = is_signed ? (code >> 3) & 15u : code >> 3;
  const int bias = is_signed ? 15 : 31;
  float v;
  if (e == 0) {
    v = static_cast<float>(f) * (is_signed ? 0x1p-17f : 0x1p-33f);  // exact: f < 8
  } else {
    v = BitsToFloat((e + 127u - static_cast<uint32_t>(bias)) << 23 | f << 20);
  }
  return is_signed && (code & 0x80u) ? -v : v;
}

// The f32 multiplier of an encode: 1 / scale, or 0 for an all-zero block.
ZRT_HD float Q8Recip(float scale) { return scale > 0.0f ? 1.0f / scale : 0.0f; }

ZRT_HD uint8_t Q8Encode(float x, float recip, bool is_signed) {
  float r = (x < 0.0f ? -x : x) * recip;
  r = r < 1.0f ? r : 1.0f;
  const int bias = is_signed ? 15 : 31;
  const float smallest_normal = is_signed ? 0x1p-14f : 0x1p-30f;
  uint32_t mag;
  if (r < smallest_normal) {
    // r * 2^k is exact; rint rounds to nearest even in the default rounding mode.
#if defined(__CUDA_ARCH__)
    mag = static_cast<uint32_t>(__float2int_rn(r * (is_signed ? 0x1p17f : 0x1p33f)));
#else
    mag = static_cast<uint32_t>(__builtin_rintf(r * (is_signed ? 0x1p17f : 0x1p33f)));
#endif
  } else {
    const uint32_t u = FloatBits(r);
    const uint32_t t = (u + 0x7ffffu + ((u >> 20) & 1u)) >> 20;  // exponent << 3 | 3 fraction bits, rounded
    mag = t - ((127u - static_cast<uint32_t>(bias)) << 3);
  }
  const uint32_t sign = is_signed && mag != 0 && (FloatBits(x) >> 31) ? 0x80u : 0u;
  return static_cast<uint8_t>(mag | sign);
}

// A whole q8 block of n (<= its block size) f32 values: their codes and the scale (the largest
// magnitude). What a load's values and a checkpoint's stored form go through.
ZRT_HD float Q8EncodeBlock(const float* x, int64_t n, bool is_signed, uint8_t* codes) {
  float amax = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float a = x[i] < 0 ? -x[i] : x[i];
    amax = amax < a ? a : amax;
  }
  const float r = Q8Recip(amax);
  for (int64_t i = 0; i < n; ++i) codes[i] = Q8Encode(x[i], r, is_signed);
  return amax;
}

#if !defined(__CUDA_ARCH__)
// Q8Value of every code, for host loops that decode many (one load instead of the bit work). Internal
// linkage, as ZRT_HD's: no TU built with other -m flags lends its copy.
static inline const float* Q8Table(bool is_signed) {
  struct Tables {
    float v[2][256];
  };
  static const Tables t = [] {
    Tables x{};
    for (int c = 0; c < 256; ++c) {
      x.v[0][c] = Q8Value(static_cast<uint8_t>(c), false);
      x.v[1][c] = Q8Value(static_cast<uint8_t>(c), true);
    }
    return x;
  }();
  return t.v[is_signed ? 1 : 0];
}
#endif

// The largest code a q8 block holds (value 1.0: the block's largest magnitude), per signedness.
inline constexpr uint8_t kQ8MaxCode[2] = {248, 120};  // [unsigned, signed]

// ---- 4-bit block-wise moments (q4) ----
// Blocks as q8's (B a power of two, a shard's blocks at multiples of B in the group's flat buffer), but
// two codes a byte: element i of a buffer is in byte i / 2, the low nibble for even i and the high one
// for odd i (a part of odd length, which only the API can ask for, ends with a high nibble of 0). Each
// block has one f32 scale s, its largest magnitude (0 for an all-zero block).
//   signed   (exp_avg):    code = sign << 3 | m, m in 0..7, value = (-1)^sign T[m] with
//                          T = {0, 1/12, 1/6, 1/4, 1/3, 1/2, 2/3, 1} (FP4 E2M1's magnitudes
//                          {0, .5, 1, 1.5, 2, 3, 4, 6} over 6: finer near zero), each the f32 nearest
//   unsigned (exp_avg_sq): value = (c + 1) / 16, c in 0..15: no code is zero, the smallest value is s/16
//                          (a second moment stored as zero makes its element's update blow up: Li,
//                          Chen, Zhu, NeurIPS 2023, "Memory efficient optimizers with 4-bit states")
// (1.0 is code 7 resp. 15: every code is written but the signed negative zero, 8.)
//   decode: x = value(code) * s, one f32 multiply.
//   encode: r = min(|x| * (1 / s), 1) as q8's (r = 0 when s = 0);
//           signed: m = how many of the f32 thresholds {1/24, 1/8, 5/24, 7/24, 5/12, 7/12, 5/6} (the
//           midpoints of T, each the f32 nearest) are <= r: the nearest value, ties away from zero; the
//           sign bit is x's when m is not 0;
//           unsigned: c = max(floor(r * 16 + 1/2), 1) - 1, exact: the nearest value, ties up.
// The coupling is q8's: where a block's second moment decodes to 0 (its scale is 0), the first moment
// is stored as 0. Decoding and encoding again gives back the same codes and scale, as q8's.

inline constexpr uint8_t kQ4MaxCode[2] = {15, 7};  // [unsigned, signed]: the code of 1.0

ZRT_HD float Q4Magnitude(uint32_t m) {  // T[m], m in 0..7
  switch (m) {
    case 0: return 0.0f;
    case 1: return 1.0f / 12.0f;
    case 2: return 1.0f / 6.0f;
    case 3: return 0.25f;
    case 4: return 1.0f / 3.0f;
    case 5: return 0.5f;
    case 6: return 2.0f / 3.0f;
    default: return 1.0f;
  }
}

// The signed code's thresholds, k in 0..6: the midpoint of T[k] and T[k + 1], the f32 nearest.
ZRT_HD constexpr float Q4SignedMid(int k) {
  switch (k) {
    case 0: return 1.0f / 24.0f;
    case 1: return 0.125f;
    case 2: return 5.0f / 24.0f;
    case 3: return 7.0f / 24.0f;
    case 4: return 5.0f / 12.0f;
    case 5: return 7.0f / 12.0f;
    default: return 5.0f / 6.0f;
  }
}

ZRT_HD float Q4Value(uint8_t code, bool is_signed) {
  if (!is_signed) return static_cast<float>((code & 15u) + 1u) * 0.0625f;  // exact
  const float v = Q4Magnitude(code & 7u);
  return code & 8u ? -v : v;
}

ZRT_HD uint8_t Q4Encode(float x, float recip, bool is_signed) {
  float r = (x < 0.0f ? -x : x) * recip;
  r = r < 1.0f ? r : 1.0f;
  if (!is_signed) {
    // r * 16 is exact and adding 1/2 never rounds across an integer: floor is the exact one.
    const int k = static_cast<int>(r * 16.0f + 0.5f);
    return static_cast<uint8_t>((k > 1 ? k : 1) - 1);
  }
  uint32_t m = 0;
  for (int k = 0; k < 7; ++k) m += r >= Q4SignedMid(k) ? 1u : 0u;
  return static_cast<uint8_t>(m | (m != 0 && (FloatBits(x) >> 31) ? 8u : 0u));
}

// n f32 values into q4 codes with the multiplier `recip` (Q8Recip of the block's scale), packed two a
// byte from a low nibble: (n + 1) / 2 bytes.
ZRT_HD void Q4EncodeCodes(const float* x, int64_t n, float recip, bool is_signed, uint8_t* bytes) {
  for (int64_t i = 0; i < n; i += 2) {
    const uint8_t hi = i + 1 < n ? Q4Encode(x[i + 1], recip, is_signed) : 0;
    bytes[i / 2] = static_cast<uint8_t>(Q4Encode(x[i], recip, is_signed) | hi << 4);
  }
}

// A whole q4 block of n (<= its block size) f32 values: its packed codes and the scale.
ZRT_HD float Q4EncodeBlock(const float* x, int64_t n, bool is_signed, uint8_t* bytes) {
  float amax = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float a = x[i] < 0 ? -x[i] : x[i];
    amax = amax < a ? a : amax;
  }
  Q4EncodeCodes(x, n, Q8Recip(amax), is_signed, bytes);
  return amax;
}

// The code of element i of q4 bytes.
ZRT_HD uint8_t Q4CodeAt(const uint8_t* bytes, int64_t i) { return static_cast<uint8_t>(bytes[i / 2] >> (4 * (i & 1)) & 15u); }

#if !defined(__CUDA_ARCH__)
// Q4Value of every code, per signedness (16 each).
static inline const float* Q4Table(bool is_signed) {
  struct Tables {
    float v[2][16];
  };
  static const Tables t = [] {
    Tables x{};
    for (int c = 0; c < 16; ++c) {
      x.v[0][c] = Q4Value(static_cast<uint8_t>(c), false);
      x.v[1][c] = Q4Value(static_cast<uint8_t>(c), true);
    }
    return x;
  }();
  return t.v[is_signed ? 1 : 0];
}
#endif

ZRT_HD uint32_t Fmix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return h;
}

ZRT_HD uint32_t RoundingKey(uint32_t seed, uint64_t step, uint32_t index_hi) {
  uint32_t k = Fmix32(seed ^ 0x5bd1e995u);
  k = Fmix32(k ^ static_cast<uint32_t>(step));
  k = Fmix32(k ^ static_cast<uint32_t>(step >> 32));
  return Fmix32(k ^ index_hi);
}

// x rounded stochastically to bf16 with the bits of element `index_lo` under `key`.
ZRT_HD uint16_t FloatToBf16Stochastic(float x, uint32_t key, uint32_t index_lo) {
  const uint32_t u = FloatBits(x) + (Fmix32(key ^ index_lo) >> 16);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace zrt
