#include "zrt/core/tensor_spec.h"

#include <gtest/gtest.h>

namespace zrt {
namespace {

TEST(TensorSpec, NumelBytesAndString) {
  TensorSpec s{"layer0.w", {3, 5}, DType::kBF16};
  EXPECT_TRUE(Validate(s).ok());
  EXPECT_EQ(s.numel(), 15);
  EXPECT_EQ(s.bytes(), 30);
  EXPECT_EQ(s.ToString(), "layer0.w [3, 5] bf16");
  TensorSpec scalar{"scale", {}, DType::kF32};
  EXPECT_EQ(scalar.numel(), 1);
  TensorSpec empty{"e", {4, 0, 2}, DType::kF32};
  EXPECT_TRUE(Validate(empty).ok());
  EXPECT_EQ(empty.numel(), 0);
}

TEST(TensorSpec, RejectsBadSpecsNamingThem) {
  Status neg = Validate(TensorSpec{"w", {2, -1}, DType::kF32});
  EXPECT_EQ(neg.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(neg.message().find("w [2, -1]"), std::string_view::npos) << neg;
  EXPECT_EQ(Validate(TensorSpec{"", {1}, DType::kF32}).code(), StatusCode::kInvalidArgument);
  Status big = Validate(TensorSpec{"huge", {1LL << 40, 1LL << 40}, DType::kF32});
  EXPECT_EQ(big.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(big.message().find("huge"), std::string_view::npos);
  EXPECT_NE(big.message().find("overflow"), std::string_view::npos);
}

}  // namespace
}  // namespace zrt
