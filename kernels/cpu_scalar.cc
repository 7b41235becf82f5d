// Scalar CPU kernels: the portable reference the SIMD units must match bit for bit.
#include "zrt/kernels/cpu_loops.h"
#include "zrt/core/dtype.h"

namespace zrt::kernels::scalar {
namespace {

using internal::kElemBf16;
using internal::kElemF16;

struct Isa {
  using V = float;
  static constexpr int kWidth = 1;
  struct Full {};
  using Tail = Full;
  static Tail MakeTail(int64_t) { return {}; }

  template <int K>
  static void Prefetch(const void*, int64_t) {}  // one element per iteration: not worth an instruction
  template <int K>
  static float Load(const void* base, int64_t i, Full) {
    if constexpr (K == kElemBf16) return Bf16ToFloat(static_cast<const uint16_t*>(base)[i]);
    if constexpr (K == kElemF16) return F16ToFloat(static_cast<const uint16_t*>(base)[i]);
    if constexpr (K != kElemBf16 && K != kElemF16) return static_cast<const float*>(base)[i];
  }
  template <int K>
  static void Store(void* base, int64_t i, float x, Full) {
    if constexpr (K == kElemBf16) {
      static_cast<uint16_t*>(base)[i] = FloatToBf16(x);
    } else if constexpr (K == kElemF16) {
      static_cast<uint16_t*>(base)[i] = FloatToF16(x);
    } else {
      static_cast<float*>(base)[i] = x;
    }
  }
  static double LaneSumF64(float x) { return x; }

  // Compact state: the definitions of quant_math.h, one element at a time.
  static float Abs(float x) { return BitsToFloat(FloatBits(x) & 0x7fffffffu); }
  static float LaneMax(float x) { return x; }
  template <bool kSigned>
  static float DecodeQ8(const void* base, int64_t i, Full) { return Q8Value(static_cast<const uint8_t*>(base)[i], kSigned); }
  template <bool kSigned>
  static void EncodeQ8(void* base, int64_t i, float x, float recip, Full) {
    static_cast<uint8_t*>(base)[i] = Q8Encode(x, recip, kSigned);
  }
  static float ZeroUnlessAbove(float m, float r, float t) { return r > t ? m : 0.0f; }
  static void StoreBf16Stochastic(void* base, int64_t i, float x, uint32_t key, uint32_t lo, Full) {
    static_cast<uint16_t*>(base)[i] = FloatToBf16Stochastic(x, key, lo);
  }
};

}  // namespace
}  // namespace zrt::kernels::scalar

namespace zrt::kernels::internal {
const CpuKernelTable& ScalarKernels() { return Kernels<scalar::Isa>::kTable; }
}  // namespace zrt::kernels::internal
