// qwZ's block quantizer (weight_quant.h): plain loops over one dtype each, which the compiler
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

template <DType T>
void Quantize(const void* src, int64_t n, int64_t block, char* packed) {
  float* scales = reinterpret_cast<float*>(packed);
  int8_t* codes = reinterpret_cast<int8_t*>(packed + WeightQuantBlocks(n, block) * 4);
  for (int64_t b0 = 0, q = 0; b0 < n; b0 += block, ++q) {
    const int64_t b1 = b0 + block < n ? b0 + block : n;
    float amax = 0;
    int bad = 0;  // inf or NaN seen
    for (int64_t i = b0; i < b1; ++i) {
      const float a = std::fabs(Load<T>(src, i));
      bad |= !(a <= 3.4028235e38f);
      amax = a > amax ? a : amax;
    }
    if (bad != 0) {
      scales[q] = std::numeric_limits<float>::quiet_NaN();
      std::memset(codes + b0, 0, static_cast<size_t>(b1 - b0));
      continue;
    }
    scales[q] = amax / 127.0f;
    const float recip = amax > 0 ? 127.0f / amax : 0.0f;
    for (int64_t i = b0; i < b1; ++i) {
      float v = Load<T>(src, i) * recip;
      v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
      // Round to nearest even: adding and subtracting 1.5 * 2^23 leaves the integer (|v| <= 127).
      codes[i] = static_cast<int8_t>((v + 0x1.8p23f) - 0x1.8p23f);
    }
  }
}

template <DType T>
void Dequantize(const char* packed, int64_t n, int64_t block, void* dst) {
  const float* scales = reinterpret_cast<const float*>(packed);
  const int8_t* codes = reinterpret_cast<const int8_t*>(packed + WeightQuantBlocks(n, block) * 4);
  for (int64_t b0 = 0, q = 0; b0 < n; b0 += block, ++q) {
    const int64_t b1 = b0 + block < n ? b0 + block : n;
    const float s = scales[q];
    if constexpr (T == DType::kBF16) {
      if (s == s) {  // finite values (|code| <= 127 times a finite scale): round to nearest even without FloatToBf16's NaN branch, so the loop vectorizes
        uint16_t* out = static_cast<uint16_t*>(dst);
        for (int64_t i = b0; i < b1; ++i) {
          const uint32_t u = FloatBits(static_cast<float>(codes[i]) * s);
          out[i] = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
        }
        continue;
      }
    }
    for (int64_t i = b0; i < b1; ++i) Store<T>(dst, i, static_cast<float>(codes[i]) * s);
  }
}

}  // namespace

void QuantizeWeights(const void* src, DType dtype, int64_t n, int64_t block, void* packed) {
  char* out = static_cast<char*>(packed);
  switch (dtype) {
    case DType::kBF16: return Quantize<DType::kBF16>(src, n, block, out);
    case DType::kF16: return Quantize<DType::kF16>(src, n, block, out);
    default: return Quantize<DType::kF32>(src, n, block, out);
  }
}

void DequantizeWeights(const void* packed, int64_t n, int64_t block, void* dst, DType dtype) {
  const char* in = static_cast<const char*>(packed);
  switch (dtype) {
    case DType::kBF16: return Dequantize<DType::kBF16>(in, n, block, dst);
    case DType::kF16: return Dequantize<DType::kF16>(in, n, block, dst);
    default: return Dequantize<DType::kF32>(in, n, block, dst);
  }
}

}  // namespace zrt::kernels
