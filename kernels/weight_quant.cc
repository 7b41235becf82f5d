// qwZ's and qgZ's block quantizer (weight_quant.h): plain loops over one dtype each, which the compiler
// vectorizes (-O3 for this file); the rounding is the FPU's round to nearest even.
#include "zrt/kernels/weight_quant.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace zrt::kernels {

namespace {

template <DType T>
float Load(const void* p, int64_t i) {
  if constexpr (T == DType::kBF16) return Bf16ToFloat(static_cast<const uint16_t*>(p)[i]);
  if constexpr (T == DType::kF16) return F16ToFloat(static_cast<const uint16_t*>(p)[i]);
  if constexpr (T == DType::kF32) return static_cast<const float*>(p)[i];
}

template <DType T>
void Store(void* p, int64_t i, float v) {
  if constexpr (T == DType::kBF16) static_cast<uint16_t*>(p)[i] = FloatToBf16(v);
  if constexpr (T == DType::kF16) static_cast<uint16_t*>(p)[i] = FloatToF16(v);
  if constexpr (T == DType::kF32) static_cast<float*>(p)[i] = v;
}

// Round to nearest even: adding and subtracting 1.5 * 2^23 leaves the integer (|v| <= 127).
inline float RoundEven(float v) { return (v + 0x1.8p23f) - 0x1.8p23f; }

template <DType T, int kBits>
void Quantize(const void* src, int64_t n, int64_t block, char* packed) {
  constexpr float kL = WeightQuantLevels(kBits);
  float* scales = reinterpret_cast<float*>(packed);
  char* codes = packed + WeightQuantBlocks(n, block) * 4;
  for (int64_t b0 = 0, q = 0; b0 < n; b0 += block, ++q) {
    const int64_t b1 = b0 + block < n ? b0 + block : n;
    float amax = 0;
    int bad = 0;  // inf or NaN seen
    for (int64_t i = b0; i < b1; ++i) {
      const float a = std::fabs(Load<T>(src, i));
      bad |= !(a <= 3.4028235e38f);
      amax = a > amax ? a : amax;
    }
    // int4: b0 is even (the block is), so the block's codes start a byte.
    char* out = kBits == 4 ? codes + b0 / 2 : codes + b0;
    if (bad != 0) {
      scales[q] = std::numeric_limits<float>::quiet_NaN();
      std::memset(out, 0, static_cast<size_t>(kBits == 4 ? (b1 - b0 + 1) / 2 : b1 - b0));
      continue;
    }
    scales[q] = amax / kL;
    const float recip = amax > 0 ? kL / amax : 0.0f;
    auto code = [&](int64_t i) {
      float v = Load<T>(src, i) * recip;
      v = v > kL ? kL : v < -kL ? -kL : v;
      return static_cast<int>(RoundEven(v));
    };
    if constexpr (kBits == 8) {
      for (int64_t i = b0; i < b1; ++i) out[i - b0] = static_cast<char>(code(i));
    } else {
      int64_t i = b0;
      for (; i + 1 < b1; i += 2) out[(i - b0) / 2] = static_cast<char>((code(i) & 0xf) | (code(i + 1) & 0xf) << 4);
      if (i < b1) out[(i - b0) / 2] = static_cast<char>(code(i) & 0xf);  // the span's last, odd element
    }
  }
}

// Element i's code: int8 as is; int4 its nibble, sign-extended.
template <int kBits>
inline float CodeAt(const char* codes, int64_t i) {
  if constexpr (kBits == 8) return static_cast<float>(static_cast<int8_t>(codes[i]));
  const auto b = static_cast<uint8_t>(codes[i / 2]);
  const int nib = (i & 1) != 0 ? b >> 4 : b & 0xf;
  return static_cast<float>(nib >= 8 ? nib - 16 : nib);
}

template <DType T, int kBits>
void Dequantize(const char* packed, int64_t n, int64_t block, void* dst) {
  const float* scales = reinterpret_cast<const float*>(packed);
  const char* codes = packed + WeightQuantBlocks(n, block) * 4;
  for (int64_t b0 = 0, q = 0; b0 < n; b0 += block, ++q) {
    const int64_t b1 = b0 + block < n ? b0 + block : n;
    const float s = scales[q];
    if constexpr (T == DType::kBF16) {
      if (s == s) {  // finite values (|code| <= 127 times a finite scale): round to nearest even without FloatToBf16's NaN branch, so the loop vectorizes
        uint16_t* out = static_cast<uint16_t*>(dst);
        for (int64_t i = b0; i < b1; ++i) {
          const uint32_t u = FloatBits(CodeAt<kBits>(codes, i) * s);
          out[i] = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
        }
        continue;
      }
    }
    for (int64_t i = b0; i < b1; ++i) Store<T>(dst, i, CodeAt<kBits>(codes, i) * s);
  }
}

template <int kBits>
void QuantizeAs(const void* src, DType dtype, int64_t n, int64_t block, char* out) {
  switch (dtype) {
    case DType::kBF16: return Quantize<DType::kBF16, kBits>(src, n, block, out);
    case DType::kF16: return Quantize<DType::kF16, kBits>(src, n, block, out);
    default: return Quantize<DType::kF32, kBits>(src, n, block, out);
  }
}

template <int kBits>
void DequantizeAs(const char* in, int64_t n, int64_t block, void* dst, DType dtype) {
  switch (dtype) {
    case DType::kBF16: return Dequantize<DType::kBF16, kBits>(in, n, block, dst);
    case DType::kF16: return Dequantize<DType::kF16, kBits>(in, n, block, dst);
    default: return Dequantize<DType::kF32, kBits>(in, n, block, dst);
  }
}

}  // namespace

Status CheckWeightQuant(int64_t block, int bits) {
  if (bits != 8 && bits != 4) return InvalidArgumentError("quantized codes of ", bits, " bits: 8 or 4 are supported");
  if (block < 1 || block > kWeightQuantMaxBlock) {
    return InvalidArgumentError("quantization block must be in [1, ", kWeightQuantMaxBlock, "], got ", block);
  }
  if (bits == 4 && block % 2 != 0) {
    return InvalidArgumentError("quantization block ", block, " is odd: int4 codes go two a byte, so a block must be even");
  }
  return Status();
}

void QuantizeWeights(const void* src, DType dtype, int64_t n, int64_t block, void* packed, int bits) {
  if (bits == 4) return QuantizeAs<4>(src, dtype, n, block, static_cast<char*>(packed));
  QuantizeAs<8>(src, dtype, n, block, static_cast<char*>(packed));
}

void DequantizeWeights(const void* packed, int64_t n, int64_t block, void* dst, DType dtype, int bits) {
  if (bits == 4) return DequantizeAs<4>(static_cast<const char*>(packed), n, block, dst, dtype);
  DequantizeAs<8>(static_cast<const char*>(packed), n, block, dst, dtype);
}

}  // namespace zrt::kernels
