#include "zrt/kernels/adam.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "zrt/core/thread_pool.h"
#include "tests/support/reference.h"

namespace zrt::kernels {
namespace {

std::vector<CpuIsa> SupportedIsas() {
  std::vector<CpuIsa> v;
  for (CpuIsa i : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16}) {
    if (CpuSupports(i)) v.push_back(i);
  }
  return v;
}

// Double-precision reference of one step (same convention as adam_math.h), with a first-order bound
// on how far a correct float implementation may be from it, per element:
//  - m and v sum terms of size a = b1*a + (1-b1)*(|g| + |wd*p|) and av (the same for squares), so
//    their rounding error is ~1e-7 of those sizes, not of |m| or |v| (which cancellation can shrink);
//  - p moves by step_size * m / denom, so its error gains step_size * dm / denom;
//  - in Adam(L2) g depends on p, so p's error feeds the next step's m and v (dm, dv).
// Where terms cancel (g ~ -wd*p, or m changing sign) the update is ill-conditioned; the bound says by
// how much any float implementation may legitimately differ there.
struct Ref {
  std::vector<double> p, m, v, vmax, a, av, dp, dm, dv;
  explicit Ref(const std::vector<float>& init)
      : p(init.begin(), init.end()), m(init.size()), v(init.size()), vmax(init.size()), a(init.size()),
        av(init.size()), dp(init.size()), dm(init.size()), dv(init.size()) {}
  void Step(const AdamConfig& c, int64_t t, double grad_scale, const std::vector<float>& g) {
    const double bc1 = c.bias_correction ? 1 - std::pow(c.beta1, t) : 1;
    const double bc2 = c.bias_correction ? 1 - std::pow(c.beta2, t) : 1;
    const double step = c.lr / bc1;
    for (size_t i = 0; i < p.size(); ++i) {
      double gi = g[i] * grad_scale, mag = std::abs(gi), dg = 0;
      if (c.mode == AdamMode::kAdamL2) {
        mag += std::abs(c.weight_decay * p[i]);
        gi += c.weight_decay * p[i];
        dg = c.weight_decay * dp[i];
      }
      if (c.mode == AdamMode::kAdamW) p[i] *= 1 - c.lr * c.weight_decay;
      m[i] = c.beta1 * m[i] + (1 - c.beta1) * gi;
      v[i] = c.beta2 * v[i] + (1 - c.beta2) * gi * gi;
      a[i] = c.beta1 * a[i] + (1 - c.beta1) * mag;
      av[i] = c.beta2 * av[i] + (1 - c.beta2) * mag * mag;
      dm[i] = c.beta1 * dm[i] + (1 - c.beta1) * dg + 1e-6 * a[i];
      dv[i] = c.beta2 * dv[i] + (1 - c.beta2) * 2 * std::abs(gi) * dg + 1e-6 * av[i];
      double vh = v[i];
      if (c.amsgrad) {
        vmax[i] = std::max(vmax[i], v[i]);
        vh = vmax[i];
      }
      const double denom = std::sqrt(vh) / std::sqrt(bc2) + c.eps;
      p[i] -= step * m[i] / denom;
      // d(m/denom) <= dm/denom + |m| * d(denom)/denom^2, d(denom) <= dv / (2 sqrt(v) sqrt(bc2)).
      const double ddenom = dv[i] / (2 * std::sqrt(vh) * std::sqrt(bc2) + 1e-30);
      dp[i] += 1e-6 * std::abs(p[i]) + step * (dm[i] / denom + std::abs(m[i]) * ddenom / (denom * denom));
    }
  }
};

// memcmp that accepts empty (possibly null) ranges.
bool SameBytes(const void* a, const void* b, size_t bytes) { return bytes == 0 || std::memcmp(a, b, bytes) == 0; }

struct State {
  std::vector<float> p, m, v, vmax;
  std::vector<uint16_t> copy;
};

// Runs `steps` steps of AdamCpu on one tensor of n elements starting at element `offset` of its buffers
// (misaligned starts), with the given ISA and gradients; returns the state.
State RunSteps(const AdamConfig& c, CpuIsa isa, const std::vector<std::vector<float>>& grads, const std::vector<float>& init,
               size_t offset, DType grad_dtype, DType copy_dtype, ThreadPool* pool, double grad_scale = 1.0) {
  const size_t n = init.size();
  std::vector<float> p(n + offset, -7.0f), m(n + offset, 0.0f), v(n + offset, 0.0f), vmax(n + offset, 0.0f);
  std::vector<uint16_t> copy(n + offset, 0xdead);
  std::copy(init.begin(), init.end(), p.begin() + static_cast<ptrdiff_t>(offset));
  for (size_t s = 0; s < grads.size(); ++s) {
    std::vector<float> g32(n + offset);
    std::vector<uint16_t> g16(n + offset);
    for (size_t i = 0; i < n; ++i) {
      g32[offset + i] = grads[s][i];
      g16[offset + i] = grad_dtype == DType::kBF16 ? FloatToBf16(grads[s][i]) : FloatToF16(grads[s][i]);
    }
    AdamTensorArgs t;
    t.param = p.data() + offset;
    t.grad = grad_dtype == DType::kF32 ? static_cast<const void*>(g32.data() + offset) : g16.data() + offset;
    t.exp_avg = m.data() + offset;
    t.exp_avg_sq = v.data() + offset;
    t.max_exp_avg_sq = c.amsgrad ? vmax.data() + offset : nullptr;
    t.param_copy = copy_dtype == DType::kBytes ? nullptr : copy.data() + offset;
    t.numel = static_cast<int64_t>(n);
    auto s_or = MakeAdamStepScalars(c, static_cast<int64_t>(s + 1), grad_scale);
    EXPECT_TRUE(s_or.ok()) << s_or.status();
    CpuKernelOptions o;
    o.isa = isa;
    o.pool = pool;
    o.chunk = 1000;  // several work items, boundaries not multiples of the vector width
    Status st = AdamCpu(*s_or, std::span<const AdamTensorArgs>(&t, 1), grad_dtype,
                        copy_dtype == DType::kBytes ? DType::kBF16 : copy_dtype, o);
    EXPECT_TRUE(st.ok()) << st;
  }
  // Nothing outside [offset, offset + n) was touched.
  for (size_t i = 0; i < offset; ++i) {
    EXPECT_EQ(p[i], -7.0f);
    EXPECT_EQ(copy[i], 0xdead);
  }
  State out;
  out.p.assign(p.begin() + static_cast<ptrdiff_t>(offset), p.end());
  out.m.assign(m.begin() + static_cast<ptrdiff_t>(offset), m.end());
  out.v.assign(v.begin() + static_cast<ptrdiff_t>(offset), v.end());
  out.vmax.assign(vmax.begin() + static_cast<ptrdiff_t>(offset), vmax.end());
  out.copy.assign(copy.begin() + static_cast<ptrdiff_t>(offset), copy.end());
  return out;
}

TEST(AdamCpu, MatchesPyTorchReference) {
  ZRT_REQUIRE_REFERENCE();
  for (const char* name : {"adamw_default", "adamw_aggressive", "adam_l2"}) {
    SCOPED_TRACE(name);
    const auto dir = testing::ReferenceDir() / name;
    auto cj = testing::LoadCase(dir);
    ASSERT_TRUE(cj.ok()) << cj.status();
    const auto& hp = (*cj)["hyperparameters"];
    AdamConfig c;
    c.lr = hp["lr"];
    c.beta1 = hp["betas"][0];
    c.beta2 = hp["betas"][1];
    c.eps = hp["eps"];
    c.weight_decay = hp["weight_decay"];
    c.mode = (*cj)["kind"] == "adam" ? AdamMode::kAdamL2 : AdamMode::kAdamW;
    const int steps = (*cj)["steps"], tensors = (*cj)["tensors"];
    for (CpuIsa isa : SupportedIsas()) {
      for (int t = 0; t < tensors; ++t) {
        const std::string ti = std::to_string(t);
        auto init = testing::LoadBin<float>(dir, "param" + ti + "_init");
        ASSERT_TRUE(init.ok()) << init.status();
        std::vector<std::vector<float>> grads;
        for (int s = 1; s <= steps; ++s) grads.push_back(*testing::LoadBin<float>(dir, "grad" + ti + "_step" + std::to_string(s)));
        // Check after every step, so an error cannot hide behind a later one.
        for (int s = 1; s <= steps; ++s) {
          std::vector<std::vector<float>> first(grads.begin(), grads.begin() + s);
          State st = RunSteps(c, isa, first, *init, 0, DType::kF32, DType::kBytes, nullptr);
          auto want = *testing::LoadBin<float>(dir, "param" + ti + "_step" + std::to_string(s));
          ASSERT_EQ(want.size(), st.p.size());
          // The spec asks for 1e-6 relative; with PyTorch's operation order we reproduce it exactly.
          for (size_t i = 0; i < want.size(); ++i) {
            ASSERT_EQ(FloatBits(st.p[i]), FloatBits(want[i]))
                << CpuIsaName(isa) << " tensor " << t << " step " << s << " element " << i << ": " << st.p[i]
                << " vs " << want[i];
          }
          if (s == steps) {
            auto m = *testing::LoadBin<float>(dir, "exp_avg" + ti + "_final");
            auto v = *testing::LoadBin<float>(dir, "exp_avg_sq" + ti + "_final");
            for (size_t i = 0; i < m.size(); ++i) {
              ASSERT_EQ(FloatBits(st.m[i]), FloatBits(m[i])) << "exp_avg " << i;
              ASSERT_EQ(FloatBits(st.v[i]), FloatBits(v[i])) << "exp_avg_sq " << i;
            }
          }
        }
      }
    }
  }
}

struct Case {
  AdamConfig config;
  DType grad;
  DType copy;  // kBytes = no copy
  double grad_scale;
};

TEST(AdamCpu, IsasAgreeBitForBitAndMatchDoubleReference) {
  const uint64_t seed = testing::TestSeed();
  SCOPED_TRACE("ZRT_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  ThreadPool pool(2);
  AdamConfig w;
  w.lr = 1e-2;
  w.weight_decay = 0.1;
  AdamConfig l2 = w;
  l2.mode = AdamMode::kAdamL2;
  AdamConfig ams = w;
  ams.amsgrad = true;
  ams.beta2 = 0.95;
  AdamConfig nobc = w;
  nobc.bias_correction = false;
  const Case cases[] = {{w, DType::kF32, DType::kBytes, 1.0}, {w, DType::kBF16, DType::kBF16, 0.25},
                        {l2, DType::kF32, DType::kF16, 1.0},  {ams, DType::kF16, DType::kBF16, 2.0},
                        {nobc, DType::kF32, DType::kBF16, 1.0}};
  const size_t sizes[] = {0, 1, 15, 17, 1023, (1u << 20) + 3};
  int case_no = 0;
  for (const Case& k : cases) {
    for (size_t n : sizes) {
      for (size_t offset : {size_t{0}, size_t{3}}) {
        SCOPED_TRACE("case " + std::to_string(case_no) + " n " + std::to_string(n) + " offset " + std::to_string(offset));
        const std::vector<float> init = testing::RandomFloats(n, rng);
        std::vector<std::vector<float>> grads;
        for (int s = 0; s < 3; ++s) {
          auto g = testing::RandomFloats(n, rng, 0.1f);
          // Make grads representable in the grad dtype so the reference sees what the kernel sees.
          if (k.grad != DType::kF32) {
            for (float& x : g) x = k.grad == DType::kBF16 ? Bf16ToFloat(FloatToBf16(x)) : F16ToFloat(FloatToF16(x));
          }
          grads.push_back(g);
        }
        State scalar = RunSteps(k.config, CpuIsa::kScalar, grads, init, offset, k.grad, k.copy, nullptr, k.grad_scale);
        for (CpuIsa isa : SupportedIsas()) {
          if (isa == CpuIsa::kScalar) continue;
          State simd = RunSteps(k.config, isa, grads, init, offset, k.grad, k.copy, &pool, k.grad_scale);
          ASSERT_TRUE(SameBytes(simd.p.data(), scalar.p.data(), n * 4)) << CpuIsaName(isa) << " param differs";
          ASSERT_TRUE(SameBytes(simd.m.data(), scalar.m.data(), n * 4)) << CpuIsaName(isa);
          ASSERT_TRUE(SameBytes(simd.v.data(), scalar.v.data(), n * 4)) << CpuIsaName(isa);
          ASSERT_TRUE(SameBytes(simd.vmax.data(), scalar.vmax.data(), n * 4)) << CpuIsaName(isa);
          ASSERT_TRUE(SameBytes(simd.copy.data(), scalar.copy.data(), n * 2)) << CpuIsaName(isa) << " copy differs";
        }
        // Double reference, within each element's error bound (see Ref).
        Ref ref(init);
        for (size_t s = 0; s < grads.size(); ++s) ref.Step(k.config, static_cast<int64_t>(s + 1), k.grad_scale, grads[s]);
        for (size_t i = 0; i < n; ++i) {
          ASSERT_NEAR(scalar.p[i], ref.p[i], ref.dp[i] + 1e-9) << "element " << i;
          ASSERT_NEAR(scalar.m[i], ref.m[i], ref.dm[i] + 1e-12) << "element " << i;
          ASSERT_NEAR(scalar.v[i], ref.v[i], ref.dv[i] + 1e-15) << "element " << i;
        }
        // The parameter copy is the RNE of the fp32 master, bit for bit.
        if (k.copy != DType::kBytes) {
          for (size_t i = 0; i < n; ++i) {
            const uint16_t want = k.copy == DType::kBF16 ? FloatToBf16(scalar.p[i]) : FloatToF16(scalar.p[i]);
            ASSERT_EQ(scalar.copy[i], want) << "element " << i;
          }
        }
      }
    }
    ++case_no;
  }
}

TEST(AdamCpu, ResultsDoNotDependOnThreadCount) {
  std::mt19937_64 rng(testing::TestSeed());
  const auto init = testing::RandomFloats(300001, rng);
  const std::vector<std::vector<float>> grads = {testing::RandomFloats(init.size(), rng)};
  AdamConfig c;
  State one = RunSteps(c, CpuIsa::kAuto, grads, init, 0, DType::kF32, DType::kBF16, nullptr);
  ThreadPool pool(3);
  State four = RunSteps(c, CpuIsa::kAuto, grads, init, 0, DType::kF32, DType::kBF16, &pool);
  EXPECT_EQ(one.p, four.p);
  EXPECT_EQ(one.copy, four.copy);
}

TEST(AdamCpu, BadInputIsRejectedWithoutTouchingState) {
  AdamConfig c;
  auto s = MakeAdamStepScalars(c, 1);
  ASSERT_TRUE(s.ok());
  std::vector<float> p(8, 1.0f), g(8, 1.0f), m(8, 0.0f), v(8, 0.0f);
  AdamTensorArgs ok{p.data(), g.data(), m.data(), v.data(), nullptr, nullptr, 8};
  AdamTensorArgs bad = ok;
  bad.exp_avg = nullptr;
  std::vector<AdamTensorArgs> ts = {ok, bad};
  Status st = AdamCpu(*s, ts, DType::kF32, DType::kBF16);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("tensor 1"), std::string_view::npos) << st;
  EXPECT_EQ(p[0], 1.0f);  // tensor 0 was not updated either
  EXPECT_EQ(AdamCpu(*s, std::span(&ok, 1), DType::kBytes, DType::kBF16).code(), StatusCode::kInvalidArgument);
  AdamTensorArgs copy_f32 = ok;
  copy_f32.param_copy = g.data();
  EXPECT_EQ(AdamCpu(*s, std::span(&copy_f32, 1), DType::kF32, DType::kF32).code(), StatusCode::kInvalidArgument);
  AdamConfig ams = c;
  ams.amsgrad = true;
  EXPECT_EQ(AdamCpu(*MakeAdamStepScalars(ams, 1), std::span(&ok, 1), DType::kF32, DType::kBF16).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeAdamStepScalars(c, 0).status().code(), StatusCode::kInvalidArgument);
  AdamConfig badbeta = c;
  badbeta.beta2 = 1.0;
  EXPECT_EQ(MakeAdamStepScalars(badbeta, 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeAdamStepScalars(c, 1, std::nan("")).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(p[0], 1.0f);
}

TEST(AdamCpu, ForcingAnUnsupportedIsaIsUnavailable) {
  for (CpuIsa isa : {CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16}) {
    if (CpuSupports(isa)) continue;
    AdamConfig c;
    std::vector<float> x(4, 1.0f);
    AdamTensorArgs t{x.data(), x.data(), x.data(), x.data(), nullptr, nullptr, 0};
    CpuKernelOptions o;
    o.isa = isa;
    EXPECT_EQ(AdamCpu(*MakeAdamStepScalars(c, 1), std::span(&t, 1), DType::kF32, DType::kBF16, o).code(),
              StatusCode::kUnavailable);
  }
  EXPECT_NE(DetectCpuIsa(), CpuIsa::kAuto);
  RecordProperty("isa", std::string(CpuIsaName(DetectCpuIsa())));
}

}  // namespace
}  // namespace zrt::kernels
