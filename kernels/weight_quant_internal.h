// Internal: the block quantizer's instruction-set units (weight_quant.cc dispatches to them). Each
// includes weight_quant_loops.inc in a namespace of its own and ends it with ZRT_WEIGHT_QUANT_UNIT,
// which defines that unit's table over the loops' templates.
#pragma once

#include <cstdint>

#include "zrt/core/dtype.h"

namespace zrt::kernels::internal {

struct WeightQuantUnit {
  void (*quantize)(const void* src, DType dtype, int64_t n, int64_t block, char* packed, int bits);
  void (*dequantize)(const char* packed, int64_t n, int64_t block, void* dst, DType dtype, int bits);
};

const WeightQuantUnit& Avx2WeightQuant();    // weight_quant_avx2.cc
const WeightQuantUnit& Avx512WeightQuant();  // weight_quant_avx512.cc

}  // namespace zrt::kernels::internal

// The unit's table over QuantizeImpl / DequantizeImpl, by dtype and width (inside the unit's namespace).
#define ZRT_WEIGHT_QUANT_UNIT                                                                                       \
  template <int kBits>                                                                                            \
  void QuantizeAs(const void* src, DType dtype, int64_t n, int64_t block, char* out) {                            \
    switch (dtype) {                                                                                              \
      case DType::kBF16: return QuantizeImpl<DType::kBF16, kBits>(src, n, block, out);                            \
      case DType::kF16: return QuantizeImpl<DType::kF16, kBits>(src, n, block, out);                              \
      default: return QuantizeImpl<DType::kF32, kBits>(src, n, block, out);                                       \
    }                                                                                                             \
  }                                                                                                               \
  template <int kBits>                                                                                            \
  void DequantizeAs(const char* in, int64_t n, int64_t block, void* dst, DType dtype) {                           \
    switch (dtype) {                                                                                              \
      case DType::kBF16: return DequantizeImpl<DType::kBF16, kBits>(in, n, block, dst);                           \
      case DType::kF16: return DequantizeImpl<DType::kF16, kBits>(in, n, block, dst);                             \
      default: return DequantizeImpl<DType::kF32, kBits>(in, n, block, dst);                                     \
    }                                                                                                             \
  }                                                                                                               \
  inline void Quantize(const void* src, DType dtype, int64_t n, int64_t block, char* out, int bits) {             \
    if (bits == 4) return QuantizeAs<4>(src, dtype, n, block, out);                                               \
    QuantizeAs<8>(src, dtype, n, block, out);                                                                     \
  }                                                                                                               \
  inline void Dequantize(const char* in, int64_t n, int64_t block, void* dst, DType dtype, int bits) {            \
    if (bits == 4) return DequantizeAs<4>(in, n, block, dst, dtype);                                              \
    DequantizeAs<8>(in, n, block, dst, dtype);                                                                    \
  }                                                                                                               \
  inline constexpr WeightQuantUnit kUnit = {&Quantize, &Dequantize};
