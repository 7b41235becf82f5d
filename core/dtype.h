// Element types and scalar conversions.
//
// float -> bf16/f16 rounds to nearest even, keeps NaN a (quiet) NaN and overflows to inf, bit-exact
// with PyTorch's Tensor.to (tested against ../shared/reference/dtype_conversion). The scalar
// conversions are ZRT_HD so the CUDA kernels use the very same definitions; bulk SIMD versions live
// in kernels/.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>
#include <type_traits>

#include "zrt/core/status.h"

// ZRT_HD marks free functions that compile for both host and device (per-element math shared by the
// CPU and CUDA paths, ../shared/STYLE.md item 3).
//
// Host side they have internal linkage (`static inline`): kernels/ compiles the same header in
// translation units built with different -m flags (scalar, AVX2, AVX-512), and an `inline` function
// emitted out of line in an AVX-512 unit could otherwise be picked by the linker for every caller.
// Use it on free functions and function templates only.

#if defined(__CUDACC__)
#define ZRT_HD static __host__ __device__ __forceinline__
#define ZRT_HD_MEMBER __host__ __device__ __forceinline__
#else
#define ZRT_HD static inline
// Members cannot be static: always inlined instead, so no out-of-line copy is called.
#define ZRT_HD_MEMBER inline __attribute__((always_inline))
#endif

namespace zrt {

enum class DType : uint8_t {
  kF32 = 0,
  kBF16 = 1,
  kF16 = 2,
  kBytes = 3,  // raw bytes: copied and gathered, never reduced
};

// Bytes per element (kBytes: 1).
constexpr size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kBF16: return 2;
    case DType::kF16: return 2;
    case DType::kBytes: return 1;
  }
  return 0;
}

// "f32", "bf16", "f16", "bytes".
std::string_view DTypeName(DType t);

// Accepts the canonical names and the usual aliases (float32/fp32/float, bfloat16, float16/fp16/half,
// bytes/u8/uint8); case-insensitive. Unknown names give InvalidArgument listing the valid ones.
Result<DType> ParseDType(std::string_view name);

// Whether values of this type are floating point (reducible).
constexpr bool IsFloating(DType t) { return t != DType::kBytes; }

// ---- scalar conversions ----------------------------------------------------------------------------
ZRT_HD uint32_t FloatBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

ZRT_HD float BitsToFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

// float -> bf16 bit pattern, round to nearest even.
ZRT_HD uint16_t FloatToBf16(float f) {
  uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((u >> 16) | 0x0040u);  // NaN: keep sign/payload top, force quiet
  }
  u += 0x7fffu + ((u >> 16) & 1u);  // carries into the exponent, and to inf, as RNE requires
  return static_cast<uint16_t>(u >> 16);
}

ZRT_HD float Bf16ToFloat(uint16_t h) { return BitsToFloat(static_cast<uint32_t>(h) << 16); }

// float -> IEEE binary16 bit pattern, round to nearest even, subnormals exact.
ZRT_HD uint16_t FloatToF16(float f) {
  uint32_t x = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x > 0x7f800000u) {  // NaN: quiet, keep the top payload bits
    return static_cast<uint16_t>(sign | 0x7e00u | ((x >> 13) & 0x3ffu));
  }
  if (x >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (x >= 0x38800000u) {  // normal half (>= 2^-14): rebias the exponent, round the 13 dropped bits
    x = x - 0x38000000u + 0x0fffu + ((x >> 13) & 1u);
    return static_cast<uint16_t>(sign | (x >> 13));
  }
  // Subnormal half: value = mant * 2^(e-150), result unit 2^-24, so result = mant >> (126 - e).
  const uint32_t e = x >> 23;
  const int shift = 126 - static_cast<int>(e);
  if (shift > 24) return sign;  // below half of the smallest subnormal (or exactly half: even = 0)
  const uint32_t mant = (x & 0x7fffffu) | 0x800000u;
  uint32_t r = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (r & 1u))) ++r;  // may carry into the smallest normal: correct
  return static_cast<uint16_t>(sign | r);
}

ZRT_HD float F16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return BitsToFloat(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  if (exp != 0) return BitsToFloat(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return BitsToFloat(sign);
  // Subnormal: normalise.
  uint32_t e = 113;
  while ((mant & 0x400u) == 0) {
    mant <<= 1;
    --e;
  }
  return BitsToFloat(sign | (e << 23) | ((mant & 0x3ffu) << 13));
}

// ---- element types a trainer reads and writes directly -------------------------------------------
// bf16 and f16 hold the bit pattern; converting from float rounds to nearest even (as
// StoreFromFloat), to float is exact. TensorView::as<bf16>() hands out spans of them.
struct bf16 {
  uint16_t bits = 0;
  bf16() = default;
  ZRT_HD_MEMBER bf16(float f) : bits(FloatToBf16(f)) {}  // NOLINT: implicit, like a float
  ZRT_HD_MEMBER operator float() const { return Bf16ToFloat(bits); }  // NOLINT
  static constexpr bf16 FromBits(uint16_t b) {
    bf16 h;
    h.bits = b;
    return h;
  }
};

struct f16 {
  uint16_t bits = 0;
  f16() = default;
  ZRT_HD_MEMBER f16(float f) : bits(FloatToF16(f)) {}  // NOLINT
  ZRT_HD_MEMBER operator float() const { return F16ToFloat(bits); }  // NOLINT
  static constexpr f16 FromBits(uint16_t b) {
    f16 h;
    h.bits = b;
    return h;
  }
};
static_assert(sizeof(bf16) == 2 && sizeof(f16) == 2);

// The DType of an element type: DTypeOf<float> = kF32, DTypeOf<bf16> = kBF16, DTypeOf<f16> = kF16.
template <typename T>
inline constexpr DType DTypeOf = [] {
  using U = std::remove_const_t<T>;
  static_assert(std::is_same_v<U, float> || std::is_same_v<U, bf16> || std::is_same_v<U, f16>,
                "zrt element types are float, zrt::bf16 and zrt::f16");
  return std::is_same_v<U, float> ? DType::kF32 : std::is_same_v<U, bf16> ? DType::kBF16 : DType::kF16;
}();

// Loads element i of a buffer of dtype t (f32/bf16/f16) as float.
ZRT_HD float LoadAsFloat(const void* p, int64_t i, DType t) {
  switch (t) {
    case DType::kBF16: return Bf16ToFloat(static_cast<const uint16_t*>(p)[i]);
    case DType::kF16: return F16ToFloat(static_cast<const uint16_t*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

// Stores a float into element i of a buffer of dtype t (f32/bf16/f16), rounding to nearest even.
ZRT_HD void StoreFromFloat(void* p, int64_t i, DType t, float v) {
  switch (t) {
    case DType::kBF16: static_cast<uint16_t*>(p)[i] = FloatToBf16(v); break;
    case DType::kF16: static_cast<uint16_t*>(p)[i] = FloatToF16(v); break;
    default: static_cast<float*>(p)[i] = v; break;
  }
}

}  // namespace zrt
