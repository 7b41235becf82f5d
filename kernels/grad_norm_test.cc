#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "zrt/kernels/grad_norm.h"
#include "zrt/core/thread_pool.h"
#include "tests/support/reference.h"

namespace zrt::kernels {
namespace {

std::vector<CpuIsa> Isas() {
  std::vector<CpuIsa> v;
  for (CpuIsa i : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16}) {
    if (CpuSupports(i)) v.push_back(i);
  }
  return v;
}

TEST(GradSumSquares, MatchesDoubleReferenceForEveryIsaAndDtype) {
  std::mt19937_64 rng(testing::TestSeed());
  ThreadPool pool(2);
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    std::vector<std::vector<float>> f;
    std::vector<std::vector<uint16_t>> h;
    std::vector<GradRef> refs;
    double want = 0;
    for (size_t n : {0u, 1u, 17u, 1023u, 200003u}) {
      auto v = testing::RandomFloats(n, rng, 3.0f);
      std::vector<uint16_t> hv(n);
      for (size_t i = 0; i < n; ++i) {
        if (t != DType::kF32) {
          hv[i] = t == DType::kBF16 ? FloatToBf16(v[i]) : FloatToF16(v[i]);
          v[i] = LoadAsFloat(hv.data(), static_cast<int64_t>(i), t);
        }
        want += static_cast<double>(v[i]) * v[i];
      }
      f.push_back(std::move(v));
      h.push_back(std::move(hv));
    }
    for (size_t k = 0; k < f.size(); ++k) {
      refs.push_back(GradRef{t == DType::kF32 ? static_cast<const void*>(f[k].data()) : h[k].data(),
                             static_cast<int64_t>(f[k].size())});
    }
    for (CpuIsa isa : Isas()) {
      CpuKernelOptions o;
      o.isa = isa;
      o.pool = &pool;
      auto r = GradSumSquaresCpu(refs, t, o);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_FALSE(r->nonfinite);
      EXPECT_NEAR(r->sum_squares, want, 1e-6 * want) << DTypeName(t) << " " << CpuIsaName(isa);
      // Deterministic: the same with one thread.
      o.pool = nullptr;
      EXPECT_EQ(GradSumSquaresCpu(refs, t, o)->sum_squares, r->sum_squares);
    }
  }
}

TEST(GradSumSquares, DetectsInfAndNanAnywhere) {
  const float inf = std::numeric_limits<float>::infinity();
  for (CpuIsa isa : Isas()) {
    for (float bad : {inf, -inf, std::nanf("")}) {
      for (size_t pos : {size_t{0}, size_t{15}, size_t{16}, size_t{1000}, size_t{1036}}) {  // 1036: in the tail
        std::vector<float> g(1037, 0.5f);
        g[pos] = bad;
        GradRef r{g.data(), static_cast<int64_t>(g.size())};
        CpuKernelOptions o;
        o.isa = isa;
        auto s = GradSumSquaresCpu(std::span(&r, 1), DType::kF32, o);
        ASSERT_TRUE(s.ok());
        EXPECT_TRUE(s->nonfinite) << CpuIsaName(isa) << " pos " << pos << " value " << bad;
        std::vector<uint16_t> b(g.size());
        for (size_t i = 0; i < g.size(); ++i) b[i] = FloatToBf16(g[i]);
        GradRef rb{b.data(), static_cast<int64_t>(b.size())};
        EXPECT_TRUE(GradSumSquaresCpu(std::span(&rb, 1), DType::kBF16, o)->nonfinite);
      }
    }
    // Large finite values are not "non-finite".
    std::vector<float> big(64, 1e30f);
    GradRef r{big.data(), 64};
    CpuKernelOptions o;
    o.isa = isa;
    EXPECT_FALSE(GradSumSquaresCpu(std::span(&r, 1), DType::kF32, o)->nonfinite);
  }
}

TEST(GradMultiplier, ReproducesTorchClipGradNorm) {
  ZRT_REQUIRE_REFERENCE();
  const auto dir = testing::ReferenceDir() / "clip_grad_norm";
  auto cj = testing::LoadCase(dir);
  ASSERT_TRUE(cj.ok()) << cj.status();
  std::vector<std::vector<float>> grads;
  std::vector<GradRef> refs;
  for (int i = 0; i < 3; ++i) grads.push_back(*testing::LoadBin<float>(dir, "grad" + std::to_string(i)));
  for (auto& g : grads) refs.push_back(GradRef{g.data(), static_cast<int64_t>(g.size())});
  auto stats = GradSumSquaresCpu(refs, DType::kF32);
  ASSERT_TRUE(stats.ok());
  for (const auto& c : (*cj)["cases"]) {
    const float max_norm = c["max_norm"];
    const std::string tag = c["tag"];
    float norm = 0;
    const float mult = GradMultiplier(stats->sum_squares, 1.0f, max_norm, &norm);
    EXPECT_NEAR(norm, static_cast<float>(c["total_norm"]), 1e-6 * norm) << tag;
    for (int i = 0; i < 3; ++i) {
      auto want = *testing::LoadBin<float>(dir, "clipped" + std::to_string(i) + "_max" + tag);
      for (size_t k = 0; k < want.size(); ++k) {
        ASSERT_NEAR(grads[static_cast<size_t>(i)][k] * mult, want[k], 1e-6 * std::abs(want[k]) + 1e-12)
            << tag << " grad " << i << " element " << k;
      }
    }
  }
  // With a loss scale the norm is of the unscaled gradients and the multiplier unscales too.
  float norm = 0;
  const float m = GradMultiplier(stats->sum_squares * 1024.0 * 1024.0, 1024.0f, 0.0f, &norm);
  EXPECT_NEAR(norm, std::sqrt(stats->sum_squares), 1e-6 * norm);
  EXPECT_EQ(m, 1.0f / 1024.0f);
}

}  // namespace
}  // namespace zrt::kernels
