#include "zrt/core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "tests/support/reference.h"

namespace zrt {
namespace {

// Independent reference for RNE narrowing: exact arithmetic in double over the representable grid.
uint16_t RefToBf16(float f) {
  if (std::isnan(f)) return 0x7fc0;
  // bf16 values are the floats with the low 16 bits zero: pick the nearer of the two neighbours.
  const uint32_t u = FloatBits(f);
  const uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;
  const double d = f, dlo = BitsToFloat(lo);
  const double dhi = (hi & 0x7f800000u) == 0x7f800000u && (lo & 0x7fffffffu) == 0x7f7f0000u
                         ? std::ldexp(1.0, 128) * (f < 0 ? -1 : 1)  // the step above the max is 2^128
                         : static_cast<double>(BitsToFloat(hi));
  const double elo = std::abs(d - dlo), ehi = std::abs(dhi - d);
  uint32_t pick = elo < ehi ? lo : ehi < elo ? hi : (((lo >> 16) & 1) ? hi : lo);
  return static_cast<uint16_t>(pick >> 16);
}

TEST(DType, SizesNamesParse) {
  EXPECT_EQ(DTypeSize(DType::kF32), 4u);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kBytes), 1u);
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kBytes}) {
    auto p = ParseDType(DTypeName(t));
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(*p, t);
  }
  EXPECT_EQ(*ParseDType("BFloat16"), DType::kBF16);
  EXPECT_EQ(*ParseDType("fp16"), DType::kF16);
  EXPECT_EQ(*ParseDType("float32"), DType::kF32);
  auto bad = ParseDType("f8");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'f8'"), std::string_view::npos);
}

TEST(DType, Bf16SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FloatToBf16(0.0f), 0x0000);
  EXPECT_EQ(FloatToBf16(-0.0f), 0x8000);
  EXPECT_EQ(FloatToBf16(inf), 0x7f80);
  EXPECT_EQ(FloatToBf16(-inf), 0xff80);
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::max()), 0x7f80);  // overflows to inf under RNE
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::nanf("")))));
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(BitsToFloat(0x7f800001u)))));  // signalling NaN stays NaN
  EXPECT_EQ(FloatToBf16(BitsToFloat(0x3f808000u)), 0x3f80);  // tie, even below
  EXPECT_EQ(FloatToBf16(BitsToFloat(0x3f818000u)), 0x3f82);  // tie, even above
  EXPECT_EQ(FloatToBf16(BitsToFloat(0x3f808001u)), 0x3f81);  // just above the tie
}

TEST(DType, Bf16MatchesIndependentReferenceOnRandomBits) {
  std::mt19937_64 rng(testing::TestSeed());
  for (int i = 0; i < 200000; ++i) {
    const float f = BitsToFloat(static_cast<uint32_t>(rng()));
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToBf16(f), RefToBf16(f)) << "bits 0x" << std::hex << FloatBits(f);
  }
}

TEST(DType, F16ExhaustiveRoundTrip) {
  // Every half value converts to float and back unchanged (NaN stays NaN).
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const float f = F16ToFloat(static_cast<uint16_t>(h));
    const uint16_t back = FloatToF16(f);
    if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu)) {
      EXPECT_TRUE(std::isnan(f));
      EXPECT_EQ(back & 0x7c00u, 0x7c00u);
      EXPECT_NE(back & 0x3ffu, 0u);
    } else {
      ASSERT_EQ(back, h) << "half 0x" << std::hex << h;
    }
  }
}

TEST(DType, F16RoundsToNearestEvenBetweenNeighbours) {
  // For each pair of adjacent positive halves, the midpoint goes to the even one and points just off
  // the midpoint go to the nearer one (covers subnormals, the normal boundary and overflow to inf).
  for (uint32_t h = 0; h < 0x7c00u; ++h) {
    const double a = F16ToFloat(static_cast<uint16_t>(h));
    const double b = h + 1 == 0x7c00u ? 65536.0 : static_cast<double>(F16ToFloat(static_cast<uint16_t>(h + 1)));
    const float mid = static_cast<float>((a + b) / 2);  // exact in float
    const uint16_t even = (h & 1) ? static_cast<uint16_t>(h + 1) : static_cast<uint16_t>(h);
    ASSERT_EQ(FloatToF16(mid), even) << "h=0x" << std::hex << h;
    ASSERT_EQ(FloatToF16(std::nextafter(mid, 0.0f)), h) << "h=0x" << std::hex << h;
    ASSERT_EQ(FloatToF16(std::nextafter(mid, 1e9f)), h + 1) << "h=0x" << std::hex << h;
    ASSERT_EQ(FloatToF16(-mid), even | 0x8000u);
  }
  EXPECT_EQ(FloatToF16(1e10f), 0x7c00);
  EXPECT_EQ(FloatToF16(1e-10f), 0x0000);
  EXPECT_EQ(FloatToF16(-1e-10f), 0x8000);
}

TEST(DType, BitExactAgainstPyTorchReference) {
  ZRT_REQUIRE_REFERENCE();
  const auto dir = testing::ReferenceDir() / "dtype_conversion";
  auto input = testing::LoadBin<float>(dir, "input_f32");
  auto bf16 = testing::LoadBin<uint16_t>(dir, "as_bf16");
  auto f16 = testing::LoadBin<uint16_t>(dir, "as_f16");
  ASSERT_TRUE(input.ok() && bf16.ok() && f16.ok()) << input.status() << bf16.status() << f16.status();
  ASSERT_EQ(input->size(), bf16->size());
  ASSERT_EQ(input->size(), f16->size());
  int64_t nans = 0;
  for (size_t i = 0; i < input->size(); ++i) {
    const float x = (*input)[i];
    if (std::isnan(x)) {
      ++nans;
      EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(x)))) << i;
      EXPECT_TRUE(std::isnan(F16ToFloat(FloatToF16(x)))) << i;
      EXPECT_TRUE(std::isnan(Bf16ToFloat((*bf16)[i]))) << i;
      continue;
    }
    ASSERT_EQ(FloatToBf16(x), (*bf16)[i]) << "element " << i << " value " << x;
    ASSERT_EQ(FloatToF16(x), (*f16)[i]) << "element " << i << " value " << x;
  }
  RecordProperty("nans", static_cast<int>(nans));
}

TEST(DType, LoadStoreHelpers) {
  float f[1];
  uint16_t h[1];
  StoreFromFloat(f, 0, DType::kF32, 1.5f);
  EXPECT_EQ(LoadAsFloat(f, 0, DType::kF32), 1.5f);
  StoreFromFloat(h, 0, DType::kBF16, 1.5f);
  EXPECT_EQ(LoadAsFloat(h, 0, DType::kBF16), 1.5f);
  StoreFromFloat(h, 0, DType::kF16, -2.25f);
  EXPECT_EQ(LoadAsFloat(h, 0, DType::kF16), -2.25f);
}

TEST(DType, ElementTypesConvertAsTheScalarFunctions) {
  static_assert(DTypeOf<float> == DType::kF32 && DTypeOf<bf16> == DType::kBF16 && DTypeOf<const f16> == DType::kF16);
  std::mt19937 rng(std::random_device{}());
  for (int i = 0; i < 100000; ++i) {
    const float f = BitsToFloat(static_cast<uint32_t>(rng()));
    const bf16 b = f;
    const f16 h = f;
    EXPECT_EQ(b.bits, FloatToBf16(f));
    EXPECT_EQ(h.bits, FloatToF16(f));
    const float back = b, hback = h;
    EXPECT_EQ(FloatBits(back), FloatBits(Bf16ToFloat(b.bits)));
    EXPECT_EQ(FloatBits(hback), FloatBits(F16ToFloat(h.bits)));
  }
  // Arithmetic goes through float; arrays of them are the buffers' bytes.
  bf16 v[2] = {1.5f, 0.25f};
  v[0] = v[0] * v[1] + 1.0f;
  EXPECT_EQ(static_cast<float>(v[0]), 1.375f);
  uint16_t raw[2];
  std::memcpy(raw, v, sizeof(raw));
  EXPECT_EQ(raw[1], FloatToBf16(0.25f));
  EXPECT_EQ(bf16::FromBits(0x3f80).bits, 0x3f80);
  EXPECT_EQ(static_cast<float>(f16::FromBits(0x3c00)), 1.0f);
}

}  // namespace
}  // namespace zrt
