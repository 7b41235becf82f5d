// The block quantizer's loops (weight_quant_loops.inc) built for AVX-512 (this file's -m flags, kernels/CMakeLists.txt);
// weight_quant.cc calls it where the CPU supports it.
#include <cmath>
#include <cstring>
#include <limits>

#include "zrt/kernels/weight_quant.h"
#include "zrt/kernels/weight_quant_internal.h"

namespace zrt::kernels::internal {
namespace avx512 {
#include "weight_quant_loops.inc"  // NOLINT(bugprone-suspicious-include): one source, three instruction sets
ZRT_WEIGHT_QUANT_UNIT
}  // namespace avx512

const WeightQuantUnit& Avx512WeightQuant() { return avx512::kUnit; }

}  // namespace zrt::kernels::internal
