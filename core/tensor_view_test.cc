#include "zrt/core/tensor_spec.h"

#include <gtest/gtest.h>

namespace zrt {
namespace {

TEST(TensorView, TypedSpansOverTheTensorsElements) {
  const TensorSpec spec{"layer.w", {2, 3}, DType::kBF16};
  uint16_t storage[6] = {};
  const TensorView v{storage, &spec, DType::kBF16};
  EXPECT_EQ(v.numel(), 6);
  EXPECT_EQ(v.name(), "layer.w");
  std::span<bf16> x = v.as<bf16>();
  ASSERT_EQ(x.size(), 6u);
  x[4] = 3.0f;
  EXPECT_EQ(storage[4], FloatToBf16(3.0f));
  EXPECT_EQ(static_cast<float>(v.as<const bf16>()[4]), 3.0f);
  // A gradient view may have another dtype than the tensor (fp32 gradients of a bf16 tensor).
  float g[6] = {};
  const TensorView gv{g, &spec, DType::kF32};
  gv.as<float>()[5] = 2.0f;
  EXPECT_EQ(g[5], 2.0f);
}

TEST(TensorViewDeathTest, AWrongElementTypeAbortsNamingTheTensor) {
  const TensorSpec spec{"embed", {4}, DType::kF32};
  float storage[4] = {};
  const TensorView v{storage, &spec, DType::kF32};
  EXPECT_DEATH((void)v.as<bf16>(), "as<bf16>\\(\\) of tensor 'embed', whose elements are f32");
}

}  // namespace
}  // namespace zrt
