// The block quantizer of qwZ and qgZ (weight_quant.h), int8 and int4, against a reference written from
// the header's rule: every code and scale, the packed layout (nibble order, the last odd element), the
// error bound, zero and non-finite blocks, every dtype, odd lengths and the checks of the settings, for
// every instruction set the CPU has (the baseline, AVX2, AVX-512: the same bytes).
#include "zrt/kernels/weight_quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace zrt::kernels {
namespace {

struct Case {
  int bits;
  int64_t n, block;
};

// The header's rule, element by element: the code of x[i] and its block's scale.
void Reference(const std::vector<float>& x, int64_t block, int bits, std::vector<int>* codes, std::vector<float>* scales) {
  const float L = static_cast<float>(WeightQuantLevels(bits));
  const auto n = static_cast<int64_t>(x.size());
  codes->assign(x.size(), 0);
  scales->clear();
  for (int64_t b0 = 0; b0 < n; b0 += block) {
    const int64_t b1 = std::min(n, b0 + block);
    float amax = 0;
    bool bad = false;
    for (int64_t i = b0; i < b1; ++i) {
      bad |= !std::isfinite(x[static_cast<size_t>(i)]);
      amax = std::max(amax, std::fabs(x[static_cast<size_t>(i)]));
    }
    scales->push_back(bad ? std::numeric_limits<float>::quiet_NaN() : amax / L);
    if (bad || amax == 0) continue;
    for (int64_t i = b0; i < b1; ++i) {
      const float v = std::clamp(x[static_cast<size_t>(i)] * (L / amax), -L, L);
      (*codes)[static_cast<size_t>(i)] = static_cast<int>(std::nearbyint(v));  // the default mode: to nearest even
    }
  }
}

int PackedCode(const std::vector<char>& packed, int64_t scales, int bits, int64_t i) {
  const char* c = packed.data() + scales * 4;
  if (bits == 8) return static_cast<int8_t>(c[i]);
  const auto b = static_cast<uint8_t>(c[i / 2]);
  const int nib = (i & 1) != 0 ? b >> 4 : b & 0xf;
  return nib >= 8 ? nib - 16 : nib;
}

class WeightQuantTest : public ::testing::TestWithParam<Case> {};

// The instruction sets this CPU has (kScalar: the baseline loops); each must give the same bytes.
std::vector<CpuIsa> Isas() {
  std::vector<CpuIsa> out = {CpuIsa::kScalar};
  for (CpuIsa i : {CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (CpuSupports(i)) out.push_back(i);
  }
  return out;
}

TEST_P(WeightQuantTest, CodesScalesAndDecodedValuesFollowTheRule) {
  const Case c = GetParam();
  for (CpuIsa isa : Isas()) {
    SCOPED_TRACE(std::string(CpuIsaName(isa)));
    std::mt19937 rng(std::random_device{}());
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(c.n));
    for (float& v : x) v = d(rng) * std::exp2(static_cast<float>(static_cast<int>(rng() % 20)) - 10.0f);
    if (c.n > 2 * c.block) {  // a block of zeros, and a block holding a NaN and one an inf
      std::fill(x.begin() + c.block, x.begin() + 2 * c.block, 0.0f);
      x[0] = std::numeric_limits<float>::quiet_NaN();
      if (c.n > 3 * c.block) x[static_cast<size_t>(2 * c.block + 1)] = -std::numeric_limits<float>::infinity();
    }
    std::vector<int> codes;
    std::vector<float> scales;
    Reference(x, c.block, c.bits, &codes, &scales);
    const int64_t blocks = WeightQuantBlocks(c.n, c.block), bytes = PackedWeightBytes(c.n, c.block, c.bits);
    ASSERT_EQ(bytes, blocks * 4 + (c.bits == 4 ? (c.n + 1) / 2 : c.n));
    std::vector<char> packed(static_cast<size_t>(bytes) + 16, static_cast<char>(0x5a));  // poisoned, and a guard past the end
    QuantizeWeights(x.data(), DType::kF32, c.n, c.block, packed.data(), c.bits, isa);
    for (size_t k = static_cast<size_t>(bytes); k < packed.size(); ++k) ASSERT_EQ(packed[k], 0x5a) << "written past the end";
    for (int64_t q = 0; q < blocks; ++q) {
      float s;
      std::memcpy(&s, packed.data() + q * 4, 4);
      if (std::isnan(scales[static_cast<size_t>(q)])) {
        EXPECT_TRUE(std::isnan(s)) << "block " << q;
      } else {
        EXPECT_EQ(s, scales[static_cast<size_t>(q)]) << "block " << q;
      }
    }
    for (int64_t i = 0; i < c.n; ++i) {
      ASSERT_EQ(PackedCode(packed, blocks, c.bits, i), codes[static_cast<size_t>(i)]) << "element " << i;
    }
    if (c.bits == 4 && c.n % 2 == 1) {
      EXPECT_EQ(static_cast<uint8_t>(packed[static_cast<size_t>(bytes - 1)]) >> 4, 0) << "the last odd element's high nibble";
    }

    // Decoded: code * scale exactly in f32, NaN for a non-finite block, within scale / 2 of the input.
    std::vector<float> out(static_cast<size_t>(c.n), -1.0f);
    DequantizeWeights(packed.data(), c.n, c.block, out.data(), DType::kF32, c.bits, isa);
    for (int64_t i = 0; i < c.n; ++i) {
      const float s = scales[static_cast<size_t>(i / c.block)], xi = x[static_cast<size_t>(i)], o = out[static_cast<size_t>(i)];
      if (std::isnan(s)) {
        EXPECT_TRUE(std::isnan(o)) << "element " << i << " of a non-finite block decoded to " << o;
        continue;
      }
      ASSERT_EQ(o, static_cast<float>(codes[static_cast<size_t>(i)]) * s) << "element " << i;
      EXPECT_LE(std::fabs(o - xi), s / 2 * 1.0001f + 1e-30f) << "element " << i;
    }
    // 16-bit destinations: the f32 decoded value rounded to nearest even.
    std::vector<uint16_t> h(static_cast<size_t>(c.n));
    DequantizeWeights(packed.data(), c.n, c.block, h.data(), DType::kBF16, c.bits, isa);
    for (int64_t i = 0; i < c.n; ++i) {
      const float o = out[static_cast<size_t>(i)];
      if (std::isnan(o)) {
        EXPECT_TRUE(std::isnan(Bf16ToFloat(h[static_cast<size_t>(i)])));
      } else {
        ASSERT_EQ(h[static_cast<size_t>(i)], FloatToBf16(o)) << "element " << i;
      }
    }
    DequantizeWeights(packed.data(), c.n, c.block, h.data(), DType::kF16, c.bits, isa);
    for (int64_t i = 0; i < c.n; ++i) {
      if (!std::isnan(out[static_cast<size_t>(i)])) {
        ASSERT_EQ(h[static_cast<size_t>(i)], FloatToF16(out[static_cast<size_t>(i)])) << "element " << i;
      }
    }
  }
}

TEST_P(WeightQuantTest, SixteenBitSourcesQuantizeTheirValues) {
  const Case c = GetParam();
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<uint16_t> b(static_cast<size_t>(c.n));
  std::vector<float> x(b.size());
  for (size_t i = 0; i < b.size(); ++i) x[i] = Bf16ToFloat(b[i] = FloatToBf16(d(rng)));
  std::vector<uint16_t> f16(b.size());
  for (size_t i = 0; i < b.size(); ++i) f16[i] = FloatToF16(x[i]);
  std::vector<float> xf16(b.size());
  for (size_t i = 0; i < b.size(); ++i) xf16[i] = F16ToFloat(f16[i]);
  for (CpuIsa isa : Isas()) {
    SCOPED_TRACE(std::string(CpuIsaName(isa)));
    std::vector<char> from16(static_cast<size_t>(PackedWeightBytes(c.n, c.block, c.bits))), from32(from16.size());
    QuantizeWeights(b.data(), DType::kBF16, c.n, c.block, from16.data(), c.bits, isa);
    QuantizeWeights(x.data(), DType::kF32, c.n, c.block, from32.data(), c.bits, isa);
    EXPECT_EQ(from16, from32);
    QuantizeWeights(f16.data(), DType::kF16, c.n, c.block, from16.data(), c.bits, isa);
    QuantizeWeights(xf16.data(), DType::kF32, c.n, c.block, from32.data(), c.bits, isa);
    EXPECT_EQ(from16, from32);
  }
}

INSTANTIATE_TEST_SUITE_P(Widths, WeightQuantTest,
                         ::testing::Values(Case{8, 1, 1}, Case{8, 1000, 64}, Case{8, 777, 33}, Case{8, 5000, 256},
                                           Case{4, 1, 2}, Case{4, 2, 2}, Case{4, 1001, 64}, Case{4, 777, 34},
                                           Case{4, 5000, 256}, Case{4, 4099, 4096}),
                         [](const ::testing::TestParamInfo<Case>& p) {
                           return "int" + std::to_string(p.param.bits) + "_n" + std::to_string(p.param.n) + "_b" +
                                  std::to_string(p.param.block);
                         });

TEST(WeightQuant, Int4UsesEveryCodeAndRoundsTiesToEven) {
  // One block whose largest magnitude is 7: x * (7 / 7) = x, so the codes are x rounded to nearest even.
  const std::vector<float> x = {7, -7, 0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 3, -3, 4, -4, 5.49f, -5.51f, 6.5f, -6.5f};
  const std::vector<int> want = {7, -7, 0, 2, 2, 0, -2, -2, 3, -3, 4, -4, 5, -6, 6, -6};
  std::vector<char> packed(static_cast<size_t>(PackedWeightBytes(16, 16, 4)));
  ASSERT_EQ(packed.size(), 4u + 8u);
  QuantizeWeights(x.data(), DType::kF32, 16, 16, packed.data(), 4);
  for (int64_t i = 0; i < 16; ++i) EXPECT_EQ(PackedCode(packed, 1, 4, i), want[static_cast<size_t>(i)]) << "element " << i;
  EXPECT_EQ(static_cast<uint8_t>(packed[4]), 0x97) << "element 0 in the low nibble (7), element 1 in the high (-7 = 0x9)";
}

TEST(WeightQuant, SettingsAreChecked) {
  EXPECT_TRUE(CheckWeightQuant(256, 8).ok());
  EXPECT_TRUE(CheckWeightQuant(1, 8).ok());
  EXPECT_TRUE(CheckWeightQuant(2, 4).ok());
  const Status odd = CheckWeightQuant(255, 4);
  EXPECT_EQ(odd.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(odd.message().find("255"), std::string::npos) << odd.message();
  EXPECT_EQ(CheckWeightQuant(256, 2).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckWeightQuant(0, 8).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckWeightQuant(kWeightQuantMaxBlock * 2, 4).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zrt::kernels
