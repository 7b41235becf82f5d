// The ZeRO engine at 1..4 ranks: stages against each other and against PyTorch's reference, gradient
// accumulation, clipping, overflow skipping, a bf16 model's loss curve, memory formulas, bad input.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstring>
#include <random>

#include "tests/mpi/engine_fixture.h"
#include "tests/support/reference.h"

namespace zrt {
namespace {

TEST_F(EngineTest, StagesOneToThreeMatchStageZero) {
  for (double clip : {0.0, 0.5}) {
    std::vector<std::vector<std::vector<float>>> results;
    for (int stage = 0; stage <= 3; ++stage) {
      EngineConfig cfg;
      cfg.stage = stage;
      cfg.bucket_bytes = 4096;  // several buckets, groups spanning buckets and buckets mixing groups
      cfg.alignment = 4;
      cfg.max_grad_norm = clip;
      cfg.adam.lr = 1e-2;
      cfg.adam.weight_decay = 0.01;
      auto e = Make(cfg, kModel, DType::kF32, InitFn());
      ASSERT_TRUE(e.ok()) << e.status();
      for (int step = 0; step < 10; ++step) {
        Backward(**e, kModel.size(), [&](int64_t p, int64_t i, float v) { return v - Target(rank(), p, i) + 0.01f * step; });
        auto r = (*e)->Step();
        ASSERT_TRUE(r.ok()) << r.status();
        ASSERT_FALSE(r->skipped);
        ASSERT_EQ(r->step, step + 1);
      }
      results.push_back(Params(**e, kModel.size()));
    }
    for (int stage = 1; stage <= 3; ++stage) {
      for (size_t p = 0; p < kModel.size(); ++p) {
        ASSERT_EQ(results[static_cast<size_t>(stage)][p].size(), results[0][p].size());
        for (size_t i = 0; i < results[0][p].size(); ++i) {
          const float want = results[0][p][i], got = results[static_cast<size_t>(stage)][p][i];
          ASSERT_NEAR(got, want, 1e-6 * std::abs(want) + 1e-7)
              << "stage " << stage << " clip " << clip << " param " << kModel[p].name << " element " << i;
        }
      }
    }
  }
}

TEST_F(EngineTest, EveryStageReproducesPyTorchAdamW) {
  ZRT_REQUIRE_REFERENCE();
  const auto dir = testing::ReferenceDir() / "adamw_default";
  auto cj = testing::LoadCase(dir);
  ASSERT_TRUE(cj.ok());
  const auto& hp = (*cj)["hyperparameters"];
  const int steps = (*cj)["steps"];
  std::vector<ParamDef> model;
  for (int t = 0; t < 3; ++t) model.push_back({"p" + std::to_string(t), {(*cj)["sizes"][static_cast<size_t>(t)]}, "g" + std::to_string(t % 2)});
  for (int stage = 0; stage <= 3; ++stage) {
    EngineConfig cfg;
    cfg.stage = stage;
    cfg.adam.lr = hp["lr"];
    cfg.adam.beta1 = hp["betas"][0];
    cfg.adam.beta2 = hp["betas"][1];
    cfg.adam.eps = hp["eps"];
    cfg.adam.weight_decay = hp["weight_decay"];
    std::vector<std::vector<float>> init;
    for (int t = 0; t < 3; ++t) init.push_back(*testing::LoadBin<float>(dir, "param" + std::to_string(t) + "_init"));
    auto e = Make(cfg, model, DType::kF32, [&](int64_t p, int64_t off, int64_t n, float* out) {
      std::memcpy(out, init[static_cast<size_t>(p)].data() + off, static_cast<size_t>(n) * 4);
    });
    ASSERT_TRUE(e.ok()) << e.status();
    for (int s = 1; s <= steps; ++s) {
      std::vector<std::vector<float>> grads;
      for (int t = 0; t < 3; ++t) grads.push_back(*testing::LoadBin<float>(dir, "grad" + std::to_string(t) + "_step" + std::to_string(s)));
      // Every rank has the same gradient, so the average is that gradient.
      Backward(**e, 3, [&](int64_t p, int64_t i, float) { return grads[static_cast<size_t>(p)][static_cast<size_t>(i)]; });
      ASSERT_TRUE((*e)->Step().ok());
      auto got = Params(**e, 3);
      for (int t = 0; t < 3; ++t) {
        auto want = *testing::LoadBin<float>(dir, "param" + std::to_string(t) + "_step" + std::to_string(s));
        for (size_t i = 0; i < want.size(); ++i) {
          // Bit-exact where averaging identical values is exact (1, 2, 4 ranks). Otherwise the average
          // may be off by an ulp, which moves the update (of size ~lr) by ~1e-6 of itself.
          ASSERT_NEAR(got[static_cast<size_t>(t)][i], want[i], 1e-6 * (std::abs(want[i]) + cfg.adam.lr))
              << "stage " << stage << " step " << s << " tensor " << t << " element " << i;
          if ((size() & (size() - 1)) == 0) {
            ASSERT_EQ(got[static_cast<size_t>(t)][i], want[i]);
          }
        }
      }
    }
  }
}

TEST_F(EngineTest, AccumulatedMicroStepsEqualOneBigBatch) {
  for (int stage = 0; stage <= 3; ++stage) {
    auto micro = [&](int k, int64_t p, int64_t i, float v) {
      return (v - Target(rank() * 4 + k, p, i)) * (1.0f + 0.25f * static_cast<float>(k));
    };
    EngineConfig cfg;
    cfg.stage = stage;
    cfg.bucket_bytes = 8192;
    cfg.adam.lr = 1e-2;
    auto big = Make(cfg, kModel, DType::kF32, InitFn());
    ASSERT_TRUE(big.ok()) << big.status();
    // One step on the 4x batch: the mean of the micro-batch gradients (summed in the same order).
    Backward(**big, kModel.size(), [&](int64_t p, int64_t i, float v) {
      float s = 0;
      for (int k = 0; k < 4; ++k) s += micro(k, p, i, v);
      return s * 0.25f;
    });
    ASSERT_TRUE((*big)->Step().ok());
    cfg.grad_accum_steps = 4;
    auto acc = Make(cfg, kModel, DType::kF32, InitFn());
    ASSERT_TRUE(acc.ok());
    const int64_t before = (*acc)->comm_stats().reduce_bytes;
    for (int k = 0; k < 4; ++k) {
      (*acc)->SetSync(k == 3);
      Backward(**acc, kModel.size(), [&](int64_t p, int64_t i, float v) { return micro(k, p, i, v); });
      if (k < 3) {
        ASSERT_EQ((*acc)->comm_stats().reduce_bytes, before) << "no gradient reduction before the last micro-step";
        ASSERT_EQ((*acc)->Step().status().code(), StatusCode::kFailedPrecondition);
      }
    }
    ASSERT_TRUE((*acc)->Step().ok());
    auto a = Params(**big, kModel.size()), b = Params(**acc, kModel.size());
    for (size_t p = 0; p < kModel.size(); ++p) {
      for (size_t i = 0; i < a[p].size(); ++i) {
        ASSERT_NEAR(b[p][i], a[p][i], 1e-6 * std::abs(a[p][i])) << "stage " << stage << " param " << p << " elem " << i;
      }
    }
  }
}

TEST_F(EngineTest, ClippingReturnsTorchNormAndClips) {
  ZRT_REQUIRE_REFERENCE();
  const auto dir = testing::ReferenceDir() / "clip_grad_norm";
  std::vector<std::vector<float>> grads, clipped;
  for (int t = 0; t < 3; ++t) {
    grads.push_back(*testing::LoadBin<float>(dir, "grad" + std::to_string(t)));
    clipped.push_back(*testing::LoadBin<float>(dir, "clipped" + std::to_string(t) + "_max0p5"));
  }
  std::vector<ParamDef> model = {{"a", {100}, "x"}, {"b", {3001}, "y"}, {"c", {7}, "y"}};
  for (int stage = 0; stage <= 3; ++stage) {
    EngineConfig cfg;
    cfg.stage = stage;
    cfg.max_grad_norm = 0.5;
    cfg.adam.lr = 0.1;
    cfg.adam.beta1 = 0;  // with beta1 = 0 and SGD-like first step, the update reveals the clipped grad
    cfg.adam.beta2 = 0;
    cfg.adam.eps = 1e30;  // update = -lr * g / eps: linear in the (clipped) gradient
    auto e = Make(cfg, model, DType::kF32, [](int64_t, int64_t, int64_t n, float* out) { std::fill(out, out + n, 0.0f); });
    ASSERT_TRUE(e.ok());
    Backward(**e, 3, [&](int64_t p, int64_t i, float) { return grads[static_cast<size_t>(p)][static_cast<size_t>(i)]; });
    auto r = (*e)->Step();
    ASSERT_TRUE(r.ok());
    EXPECT_NEAR(r->grad_norm, 32.565093994140625, 32.6 * 1e-6) << "stage " << stage;
    auto got = Params(**e, 3);
    for (int t = 0; t < 3; ++t) {
      for (size_t i = 0; i < clipped[static_cast<size_t>(t)].size(); ++i) {
        const double want = -0.1 * clipped[static_cast<size_t>(t)][i] / 1e30;
        ASSERT_NEAR(got[static_cast<size_t>(t)][i], want, 1e-5 * std::abs(want) + 1e-45) << "stage " << stage << " t " << t << " i " << i;
      }
    }
  }
}

TEST_F(EngineTest, OverflowOnOneRankSkipsTheStepEverywhere) {
  for (int stage = 0; stage <= 3; ++stage) {
    EngineConfig cfg;
    cfg.stage = stage;
    cfg.loss_scale.mode = LossScaleMode::kDynamic;
    cfg.loss_scale.init_scale = 1024;
    auto e = Make(cfg, kModel, DType::kF16, InitFn());
    ASSERT_TRUE(e.ok()) << e.status();
    Backward(**e, kModel.size(), [&](int64_t p, int64_t i, float v) { return (v - Target(rank(), p, i)) * 1024.0f; });
    ASSERT_FALSE((*e)->Step()->skipped);
    const auto before = Params(**e, kModel.size());
    // The last rank sees an overflow in one element.
    Backward(**e, kModel.size(), [&](int64_t p, int64_t i, float v) {
      if (rank() == size() - 1 && p == 4 && i == 17) return std::numeric_limits<float>::infinity();
      return (v - Target(rank(), p, i)) * 1024.0f;
    });
    auto r = (*e)->Step();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->skipped) << "stage " << stage;
    EXPECT_EQ(r->step, 1);
    EXPECT_EQ((*e)->loss_scale(), 512);
    EXPECT_EQ(Params(**e, kModel.size()), before) << "a skipped step changes nothing";
    // And training continues.
    Backward(**e, kModel.size(), [&](int64_t p, int64_t i, float v) { return (v - Target(rank(), p, i)) * 512.0f; });
    auto r3 = (*e)->Step();
    ASSERT_TRUE(r3.ok());
    EXPECT_FALSE(r3->skipped);
    EXPECT_EQ(r3->step, 2);
  }
}

// y = W2 relu(W1 x + b1) on a synthetic regression; each rank its own samples; bf16 parameters.
TEST_F(EngineTest, Bf16MlpTrainsWithTheSameLossCurveAtEveryStage) {
  constexpr int kIn = 8, kHidden = 16, kBatch = 32, kSteps = 40;
  const std::vector<ParamDef> mlp = {{"w1", {kHidden, kIn}, "l1"}, {"b1", {kHidden}, "l1"}, {"w2", {kHidden}, "l2"}};
  auto sample = [&](int step, int k, float* x) {
    std::mt19937 rng(static_cast<unsigned>(1000 * step + 97 * rank() + k));
    std::uniform_real_distribution<float> u(-1, 1);
    float y = 0;
    for (int j = 0; j < kIn; ++j) {
      x[j] = u(rng);
      y += std::sin(static_cast<float>(j)) * x[j] + 0.5f * x[j] * x[j];
    }
    return y;
  };
  std::vector<std::vector<double>> curves;
  for (int stage = 0; stage <= 3; ++stage) {
    EngineConfig cfg;
    cfg.stage = stage;
    cfg.adam.lr = 3e-2;
    auto e = Make(cfg, mlp, DType::kBF16, [](int64_t p, int64_t off, int64_t n, float* out) {
      for (int64_t i = 0; i < n; ++i) out[i] = p == 1 ? 0.0f : 0.4f * std::sin(1.7f * static_cast<float>(off + i) + static_cast<float>(p));
    });
    ASSERT_TRUE(e.ok()) << e.status();
    std::vector<double> curve;
    for (int step = 0; step < kSteps; ++step) {
      // Forward + backward by hand, in float, from the bf16 parameters.
      // Typed views by name: bf16 elements convert to float as they are read.
      ASSERT_TRUE((*e)->Gather(0).ok() && (*e)->Gather(1).ok());
      auto as_floats = [&](const char* name) {
        std::span<const bf16> v = (*e)->Param(name).value().as<bf16>();
        return std::vector<float>(v.begin(), v.end());
      };
      std::vector<float> W1 = as_floats("w1"), B1 = as_floats("b1"), W2 = as_floats("w2");
      ASSERT_EQ(W1.size(), size_t{kHidden * kIn});
      ASSERT_TRUE((*e)->Release(0).ok());
      ASSERT_TRUE((*e)->Release(1).ok());
      std::vector<float> gW1(W1.size()), gB1(B1.size()), gW2(W2.size());
      double loss = 0;
      for (int k = 0; k < kBatch; ++k) {
        float x[kIn];
        const float y = sample(step, k, x);
        float h[kHidden], out = 0;
        for (int j = 0; j < kHidden; ++j) {
          float a = B1[static_cast<size_t>(j)];
          for (int i = 0; i < kIn; ++i) a += W1[static_cast<size_t>(j * kIn + i)] * x[i];
          h[j] = a > 0 ? a : 0;
          out += W2[static_cast<size_t>(j)] * h[j];
        }
        const float d = out - y;
        loss += 0.5 * d * d / kBatch;
        for (int j = 0; j < kHidden; ++j) {
          gW2[static_cast<size_t>(j)] += d * h[j] / kBatch;
          if (h[j] > 0) {
            const float dh = d * W2[static_cast<size_t>(j)] / kBatch;
            gB1[static_cast<size_t>(j)] += dh;
            for (int i = 0; i < kIn; ++i) gW1[static_cast<size_t>(j * kIn + i)] += dh * x[i];
          }
        }
      }
      float total = static_cast<float>(loss);
      ASSERT_TRUE(comm_->AllReduce(&total, &total, 1, DType::kF32, ReduceOp::kAvg).ok());
      curve.push_back(total);
      const std::vector<float>* g[] = {&gW1, &gB1, &gW2};
      for (int grp = 1; grp >= 0; --grp) {
        for (int64_t p = 0; p < 3; ++p) {
          const ParamHandle h{p};
          if ((*e)->group(h) != grp) continue;
          std::span<bf16> gv = (*e)->Grad(h).value().as<bf16>();
          std::copy(g[p]->begin(), g[p]->end(), gv.begin());  // float -> bf16, rounded to nearest even
        }
        ASSERT_TRUE((*e)->GradsReady(grp).ok());
      }
      ASSERT_TRUE((*e)->Step().ok());
    }
    EXPECT_LT(curve.back(), 0.5 * curve.front()) << "stage " << stage << " did not learn";
    curves.push_back(curve);
  }
  for (int stage = 1; stage <= 3; ++stage) {
    for (int s = 0; s < kSteps; ++s) {
      EXPECT_NEAR(curves[static_cast<size_t>(stage)][static_cast<size_t>(s)], curves[0][static_cast<size_t>(s)],
                  0.02 * curves[0][static_cast<size_t>(s)] + 1e-3) << "stage " << stage << " step " << s;
    }
  }
}

TEST_F(EngineTest, MemoryPerRankMatchesZeroFormulas) {
  // bf16 + Adam, Psi = 3 * 2^20 parameters in three groups: model state per rank as in the ZeRO paper.
  const std::vector<ParamDef> model = {{"a", {1 << 20}, "a"}, {"b", {1 << 20}, "b"}, {"c", {1 << 20}, "c"}};
  const double psi = 3.0 * (1 << 20), n = size();
  const double formula[] = {16 * psi, 4 * psi + 12 * psi / n, 2 * psi + 14 * psi / n, 16 * psi / n};
  for (int stage = 0; stage <= 3; ++stage) {
    EngineConfig cfg;
    cfg.stage = stage;
    cfg.bucket_bytes = 1 << 20;
    CpuDevice dev;  // fresh accounting per stage
    auto e = ZeroEngine::Create(comm_.get(), &dev, cfg);
    ASSERT_TRUE(e.ok());
    for (const ParamDef& p : model) ASSERT_TRUE((*e)->AddParam(p.name, p.shape, DType::kBF16, {.group = p.group}).ok());
    ASSERT_TRUE((*e)->Finalize(InitFn()).ok());
    Backward(**e, model.size(), [](int64_t, int64_t, float v) { return v * 0.01f; });
    ASSERT_TRUE((*e)->Step().ok());
    const auto m = (*e)->memory();
    const double state = static_cast<double>(m.peak_of(MemCategory::kParameters) + m.peak_of(MemCategory::kGradients) +
                                             m.peak_of(MemCategory::kOptimizerState));
    EXPECT_NEAR(state, formula[stage], 0.05 * formula[stage]) << "stage " << stage << "\n" << m.ToString();
    // Buffers beyond model state are bounded by configuration: two buckets (+ outputs), and at stages
    // 2-3 the pooled full buffers of the groups in use (here at most one group's params + grads).
    EXPECT_LE(m.peak_of(MemCategory::kCommunication), 2 * cfg.bucket_bytes + 2 * cfg.bucket_bytes / size() + 4096);
    EXPECT_LE(m.peak_of(MemCategory::kStaging), stage >= 2 ? 4 * (2 << 20) + 4 * 4096 : 0) << m.ToString();
  }
}

// Reduction buffers fit the model: with bucket_bytes above the model's gradient, one bucket of the
// trained groups' gradients (plus its reduce-scatter output), none on one rank; and a 16-bit reduce
// dtype still rounds on one rank as a reduction over many would.
TEST_F(EngineTest, BucketsAreSizedToTheModel) {
  const std::vector<ParamDef> model = {{"a", {1000}, "a"}, {"b", {3001}, "b"}, {"f", {50000}, "f"}};
  for (int stage = 0; stage <= 3; ++stage) {
    EngineConfig cfg;  // bucket_bytes: the default 32 MiB
    cfg.stage = stage;
    CpuDevice dev;
    auto e = ZeroEngine::Create(comm_.get(), &dev, cfg);
    ASSERT_TRUE(e.ok());
    for (const ParamDef& p : model) {
      ASSERT_TRUE((*e)->AddParam(p.name, p.shape, DType::kBF16, {.group = p.group, .frozen = p.name == "f"}).ok());
    }
    ASSERT_TRUE((*e)->Finalize(InitFn()).ok());
    for (int g : {1, 0}) {  // the trained groups' gradients (zero), reduced
      ASSERT_TRUE((*e)->Gather(g).ok());
      ASSERT_TRUE((*e)->GradBuffer(g).ok());
      ASSERT_TRUE((*e)->Release(g).ok());
      ASSERT_TRUE((*e)->GradsReady(g).ok());
    }
    ASSERT_TRUE((*e)->Step().ok());
    const int n = stage == 0 ? 1 : size();
    int64_t unit = 0;  // per rank, "a" and "b" ("f" is frozen: nothing to reduce)
    for (int64_t numel : {1000, 3001}) {
      const std::vector<int64_t> one = {numel};
      auto l = ShardLayout::Create(std::span<const int64_t>(one), n, cfg.alignment);
      ASSERT_TRUE(l.ok());
      unit += l->shard_size();
    }
    const int64_t want = size() == 1 ? 0 : stage == 0 ? unit * 4 : (unit * size() + unit) * 4;
    EXPECT_EQ((*e)->memory().peak_of(MemCategory::kCommunication), want) << "stage " << stage << "\n" << (*e)->memory().ToString();
  }
}

TEST_F(EngineTest, OneRankRoundsThroughA16BitReduceDtypeAsAReductionWould) {
  if (size() != 1) GTEST_SKIP() << "one rank: nothing is reduced";
  // f32 gradients into f32 shards with bf16 on the wire: the values come out bf16-rounded.
  EngineConfig cfg;
  cfg.stage = 2;
  cfg.reduce_dtype = DType::kBF16;
  cfg.fp32_grads = true;
  cfg.adam.lr = 0;  // the step leaves the weights; the gradient norm shows the rounding
  cfg.max_grad_norm = 0;
  auto e = ZeroEngine::Create(comm_.get(), &device_, cfg);
  ASSERT_TRUE(e.ok());
  auto h = (*e)->AddParam("w", {4}, DType::kF32);
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE((*e)->Finalize(InitFn()).ok());
  ASSERT_TRUE((*e)->Gather(0).ok());
  auto g = (*e)->Grad(*h);
  ASSERT_TRUE(g.ok());
  const float x = 1.0f + 0x1p-12f;  // not a bf16 value: rounds to 1
  for (float& v : g->as<float>()) v = x;
  ASSERT_TRUE((*e)->Release(0).ok());
  ASSERT_TRUE((*e)->GradsReady(0).ok());
  auto r = (*e)->Step();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_DOUBLE_EQ(r->grad_norm, 2.0);  // sqrt(4 * 1^2), not sqrt(4) * x
}

TEST_F(EngineTest, BadInputGivesClearErrors) {
  EngineConfig cfg;
  cfg.stage = 3;
  EngineConfig bad_stage;
  bad_stage.stage = 4;
  EXPECT_EQ(ZeroEngine::Create(comm_.get(), &device_, bad_stage).status().code(), StatusCode::kInvalidArgument);
  auto e = Make(cfg, kModel, DType::kF32, InitFn());
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ((*e)->AddParam("late", {3}, DType::kF32).status().code(), StatusCode::kFailedPrecondition);
  {
    auto dup = ZeroEngine::Create(comm_.get(), &device_, EngineConfig{});
    ASSERT_TRUE(dup.ok());
    ASSERT_TRUE((*dup)->AddParam("w", {3}, DType::kF32, {.group = "a"}).ok());
    Status s = (*dup)->AddParam("w", {5}, DType::kF32, {.group = "b"}).status();  // another group: checkpoints match by name
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("already registered"), std::string_view::npos) << s;
  }
  EXPECT_EQ((*e)->Gather(99).status().code(), StatusCode::kNotFound);
  ASSERT_TRUE((*e)->Gather(0).ok());
  ASSERT_TRUE((*e)->Release(0).ok());
  Status twice = (*e)->Release(0);
  EXPECT_EQ(twice.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(twice.message().find("g0"), std::string_view::npos) << twice;
  EXPECT_EQ((*e)->GradsReady(1).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(ZeroEngine::Create(comm_.get(), &device_, cfg).value()->AddParam("neg", {-1}, DType::kF32).status().code(),
            StatusCode::kInvalidArgument);
  // Mixed dtypes in one group.
  auto mixed = ZeroEngine::Create(comm_.get(), &device_, cfg);
  ASSERT_TRUE((*mixed)->AddParam("x", {4}, DType::kF32, {.group = "g"}).ok());
  ASSERT_TRUE((*mixed)->AddParam("y", {4}, DType::kBF16, {.group = "g"}).ok());
  Status md = (*mixed)->Finalize(InitFn());
  EXPECT_EQ(md.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(md.message().find("'y'"), std::string_view::npos) << md;
  // A model smaller than the world trains fine.
  auto small = Make(cfg, {{"s", {1}, "s"}}, DType::kF32, InitFn());
  ASSERT_TRUE(small.ok());
  Backward(**small, 1, [](int64_t, int64_t, float v) { return v; });
  ASSERT_TRUE((*small)->Step().ok());
}

TEST_F(EngineTest, MismatchedRegistrationNamesTheParameter) {
  if (size() == 1) GTEST_SKIP() << "needs two ranks to disagree";
  auto e = ZeroEngine::Create(comm_.get(), &device_, EngineConfig{});
  ASSERT_TRUE(e.ok());
  ASSERT_TRUE((*e)->AddParam("same", {4}, DType::kF32).ok());
  ASSERT_TRUE((*e)->AddParam(rank() == 1 ? "other" : "differs", {4}, DType::kF32).ok());
  Status s = (*e)->Finalize(InitFn());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("parameter #1"), std::string_view::npos) << s;
}

}  // namespace
}  // namespace zrt
