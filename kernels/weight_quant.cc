// qwZ's and qgZ's block quantizer (weight_quant.h): the loops of weight_quant_loops.inc built three
// times, for the baseline here and for AVX2 and AVX-512 (weight_quant_avx2.cc, weight_quant_avx512.cc,
// each with its -m flags), chosen at run time by the CPU. The same bytes from every unit
// (weight_quant_test checks each the CPU has).
#include "zrt/kernels/weight_quant.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "zrt/kernels/weight_quant_internal.h"

namespace zrt::kernels {
namespace internal::baseline {
#include "weight_quant_loops.inc"  // NOLINT(bugprone-suspicious-include): one source, three instruction sets
ZRT_WEIGHT_QUANT_UNIT
}  // namespace internal::baseline

namespace {
const internal::WeightQuantUnit& UnitFor(CpuIsa isa) {
  if (isa == CpuIsa::kAuto) isa = DetectCpuIsa();
  switch (isa) {
    case CpuIsa::kAvx512:
    case CpuIsa::kAvx512Bf16: return CpuSupports(CpuIsa::kAvx512) ? internal::Avx512WeightQuant() : internal::baseline::kUnit;
    case CpuIsa::kAvx2: return CpuSupports(CpuIsa::kAvx2) ? internal::Avx2WeightQuant() : internal::baseline::kUnit;
    default: return internal::baseline::kUnit;
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

void QuantizeWeights(const void* src, DType dtype, int64_t n, int64_t block, void* packed, int bits, CpuIsa isa) {
  UnitFor(isa).quantize(src, dtype, n, block, static_cast<char*>(packed), bits);
}

void DequantizeWeights(const void* packed, int64_t n, int64_t block, void* dst, DType dtype, int bits, CpuIsa isa) {
  UnitFor(isa).dequantize(static_cast<const char*>(packed), n, block, dst, dtype, bits);
}

}  // namespace zrt::kernels
