// The GPT model's backward against finite differences of its forward, per tensor, along a random
// direction (central differences; fp32 model, so the tolerance is a few percent of the derivative).
#include "examples/gpt/model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace gpt {
namespace {

struct Fixture {
  Config c{256, 8, 2, 16, 2};
  int batch = 2;
  std::vector<TensorDef> defs = Tensors(c);
  std::vector<std::vector<float>> w, g;
  std::vector<uint8_t> tokens;

  explicit Fixture(uint64_t seed) {
    std::mt19937 rng(static_cast<unsigned>(seed));
    for (size_t t = 0; t < defs.size(); ++t) {
      int64_t n = 1;
      for (int64_t d : defs[t].shape) n *= d;
      w.emplace_back(static_cast<size_t>(n));
      g.emplace_back(static_cast<size_t>(n), 0.0f);
      // Larger than GPT-2's init, and LayerNorm weights away from 1, so every path matters.
      std::normal_distribution<float> nd(0.0f, 0.3f);
      for (float& x : w.back()) x = nd(rng) + (defs[t].name.find("ln_") != std::string::npos && defs[t].name.find("weight") != std::string::npos ? 1.0f : 0.0f);
    }
    std::uniform_int_distribution<int> tok(0, 255);
    tokens.resize(static_cast<size_t>(batch) * static_cast<size_t>(c.context + 1));
    for (auto& x : tokens) x = static_cast<uint8_t>(tok(rng));
  }
  BlockParams Block(int l) {
    BlockParams p;
    for (int i = 0; i < kBlockTensors; ++i) p.p[i] = w[2 + static_cast<size_t>(l * kBlockTensors + i)].data();
    return p;
  }
  double Loss(Model& m) {
    m.Embed(w[0].data(), w[1].data(), tokens.data());
    for (int l = 0; l < c.layers; ++l) m.Block(l, Block(l));
    const size_t lf = defs.size() - 2;
    return m.Head(w[lf].data(), w[lf + 1].data(), w[0].data());
  }
  void Grads(Model& m) {
    Loss(m);
    for (auto& x : g) std::fill(x.begin(), x.end(), 0.0f);
    const size_t lf = defs.size() - 2;
    m.HeadBackward(w[lf].data(), w[lf + 1].data(), w[0].data(), g[lf].data(), g[lf + 1].data(), g[0].data());
    for (int l = c.layers - 1; l >= 0; --l) {
      BlockGrads bg;
      for (int i = 0; i < kBlockTensors; ++i) bg.g[i] = g[2 + static_cast<size_t>(l * kBlockTensors + i)].data();
      m.BlockBackward(l, Block(l), bg);
    }
    m.EmbedBackward(g[0].data(), g[1].data());
  }
};

TEST(GptModel, GradientsMatchFiniteDifferencesForEveryTensor) {
  Fixture f(std::random_device{}());
  Model m(f.c, f.batch);
  f.Grads(m);
  std::mt19937 rng(99);
  for (size_t t = 0; t < f.defs.size(); ++t) {
    std::vector<float>& x = f.w[t];
    std::vector<float> d(x.size());
    for (float& v : d) v = (rng() & 1 ? 1.0f : -1.0f) / std::sqrt(static_cast<float>(x.size()));
    double analytic = 0;
    for (size_t i = 0; i < x.size(); ++i) analytic += static_cast<double>(f.g[t][i]) * d[i];
    const float eps = 1e-2f;
    const std::vector<float> saved = x;
    for (size_t i = 0; i < x.size(); ++i) x[i] = saved[i] + eps * d[i];
    const double up = f.Loss(m);
    for (size_t i = 0; i < x.size(); ++i) x[i] = saved[i] - eps * d[i];
    const double down = f.Loss(m);
    x = saved;
    const double numeric = (up - down) / (2 * eps);
    EXPECT_NEAR(analytic, numeric, 0.03 * std::abs(numeric) + 2e-4) << f.defs[t].name;
  }
}

TEST(GptModel, ParameterCountAndPresets) {
  for (const char* p : {"tiny", "small", "gpt2"}) {
    auto c = Preset(p);
    ASSERT_TRUE(c.ok());
    int64_t n = 0;
    for (const TensorDef& d : Tensors(*c)) {
      int64_t e = 1;
      for (int64_t s : d.shape) e *= s;
      n += e;
    }
    EXPECT_EQ(n, c->num_params()) << p;
  }
  EXPECT_EQ(Preset("gpt2")->num_params(), 86'039'040);  // GPT-2 124M (124,439,808) with 256 byte tokens instead of 50257
  EXPECT_FALSE(Preset("huge").ok());
}

}  // namespace
}  // namespace gpt
