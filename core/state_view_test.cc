// StateSink::PutStored's default: a sink that takes values only receives a compact part decoded,
// each element what its stored form decodes to (quant_math.h Q8Value, dtype.h Bf16ToFloat), in blocks
// whose scales apply to their own codes; a form it cannot decode is refused.
#include "zrt/core/state_view.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "zrt/core/dtype.h"
#include "zrt/core/quant_math.h"

namespace zrt {
namespace {

class Recorder final : public StateSink {
 public:
  Status Put(int group, int buffer, int64_t offset, int64_t n, const float* data) override {
    group_ = group;
    buffer_ = buffer;
    offset_ = offset;
    values_.assign(data, data + n);
    return Status();
  }
  void Close(const Status&) override {}
  int group_ = -1, buffer_ = -1;
  int64_t offset_ = -1;
  std::vector<float> values_;
};

TEST(StateSinkTest, PutStoredDecodesForASinkOfValues) {
  std::mt19937 rng(std::random_device{}());
  Recorder r;
  // q8: three blocks of 8, signed and unsigned, every code drawn (the decode does not check the form).
  for (const bool is_signed : {true, false}) {
    std::vector<uint8_t> codes(24);
    for (uint8_t& c : codes) c = static_cast<uint8_t>(rng() & 0xff);
    const std::vector<float> scales = {0.5f, 0.0f, 3.25e-3f};
    ASSERT_TRUE(r.PutStored(2, 1, 64, 24, StateFormat{Precision::kQ8, is_signed, 8}, codes.data(), scales.data()).ok());
    EXPECT_EQ(r.group_, 2);
    EXPECT_EQ(r.buffer_, 1);
    EXPECT_EQ(r.offset_, 64);
    ASSERT_EQ(r.values_.size(), 24u);
    for (size_t i = 0; i < 24; ++i) EXPECT_EQ(r.values_[i], Q8Value(codes[i], is_signed) * scales[i / 8]) << i;
  }
  std::vector<uint16_t> h(13);
  for (uint16_t& x : h) x = static_cast<uint16_t>(rng() & 0x7f7f);  // finite values
  ASSERT_TRUE(r.PutStored(0, 0, 5, 13, StateFormat{Precision::kBF16, false, 0}, h.data(), nullptr).ok());
  ASSERT_EQ(r.values_.size(), 13u);
  for (size_t i = 0; i < 13; ++i) EXPECT_EQ(r.values_[i], Bf16ToFloat(h[i])) << i;
  EXPECT_EQ(r.PutStored(0, 0, 0, 4, StateFormat{Precision::kF32, false, 0}, h.data(), nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.PutStored(0, 0, 0, 4, StateFormat{Precision::kQ8, false, 0}, h.data(), nullptr).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zrt
