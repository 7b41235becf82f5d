#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "zrt/kernels/cast.h"
#include "zrt/core/thread_pool.h"
#include "tests/support/reference.h"

namespace zrt::kernels {
namespace {

TEST(CastCpu, EveryIsaEqualsScalarConversionsBitForBit) {
  std::mt19937_64 rng(testing::TestSeed());
  ThreadPool pool(2);
  const size_t n = 100003;
  std::vector<float> f(n);
  for (float& x : f) {  // random bit patterns: subnormals, NaNs, infinities, huge values
    uint32_t u = static_cast<uint32_t>(rng());
    std::memcpy(&x, &u, 4);
  }
  std::vector<uint16_t> h(n);
  for (auto& x : h) x = static_cast<uint16_t>(rng());
  for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16}) {
    if (!CpuSupports(isa)) continue;
    SCOPED_TRACE(std::string(CpuIsaName(isa)));
    CpuKernelOptions o;
    o.isa = isa;
    o.pool = &pool;
    o.chunk = 4097;
    for (size_t offset : {size_t{0}, size_t{1}}) {
      const size_t m = n - offset;
      std::vector<uint16_t> out16(m, 0xdead);
      for (DType t : {DType::kBF16, DType::kF16}) {
        ASSERT_TRUE(CastCpu(f.data() + offset, DType::kF32, out16.data(), t, static_cast<int64_t>(m), o).ok());
        for (size_t i = 0; i < m; ++i) {
          const float x = f[offset + i];
          const uint16_t want = t == DType::kBF16 ? FloatToBf16(x) : FloatToF16(x);
          ASSERT_EQ(out16[i], want) << DTypeName(t) << " element " << i << " bits 0x" << std::hex << FloatBits(x);
        }
        std::vector<float> out32(m, -1.0f);
        ASSERT_TRUE(CastCpu(h.data() + offset, t, out32.data(), DType::kF32, static_cast<int64_t>(m), o).ok());
        for (size_t i = 0; i < m; ++i) {
          const float want = t == DType::kBF16 ? Bf16ToFloat(h[offset + i]) : F16ToFloat(h[offset + i]);
          if (std::isnan(want)) {
            ASSERT_TRUE(std::isnan(out32[i])) << i;
          } else {
            ASSERT_EQ(FloatBits(out32[i]), FloatBits(want)) << DTypeName(t) << " element " << i;
          }
        }
      }
      // bf16 -> f16 goes through f32 (exact widening, one rounding).
      std::vector<uint16_t> hf(m);
      ASSERT_TRUE(CastCpu(h.data() + offset, DType::kBF16, hf.data(), DType::kF16, static_cast<int64_t>(m), o).ok());
      for (size_t i = 0; i < m; ++i) ASSERT_EQ(hf[i], FloatToF16(Bf16ToFloat(h[offset + i]))) << i;
    }
  }
}

TEST(CastCpu, SameDtypeCopiesAndBadInput) {
  std::vector<float> a = {1, 2, 3}, b(3);
  ASSERT_TRUE(CastCpu(a.data(), DType::kF32, b.data(), DType::kF32, 3).ok());
  EXPECT_EQ(a, b);
  EXPECT_TRUE(CastCpu(nullptr, DType::kF32, nullptr, DType::kBF16, 0).ok());
  EXPECT_EQ(CastCpu(a.data(), DType::kBytes, b.data(), DType::kF32, 3).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(CastCpu(a.data(), DType::kF32, nullptr, DType::kBF16, 3).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(CastCpu(a.data(), DType::kF32, b.data(), DType::kBF16, -1).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zrt::kernels
