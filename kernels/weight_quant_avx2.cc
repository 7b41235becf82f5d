// The block quantizer's loops (weight_quant_loops.inc) built for AVX2 (this file's -m flags, kernels/CMakeLists.txt);
// weight_quant.cc calls it where the CPU supports it.
#include <cmath>
#include <cstring>
#include <limits>

#include "zrt/kernels/weight_quant.h"
#include "zrt/kernels/weight_quant_internal.h"

namespace zrt::kernels::internal {
namespace avx2 {
#include "weight_quant_loops.inc"  // NOLINT(bugprone-suspicious-include): one source, three instruction sets
ZRT_WEIGHT_QUANT_UNIT
}  // namespace avx2

const WeightQuantUnit& Avx2WeightQuant() { return avx2::kUnit; }

}  // namespace zrt::kernels::internal
