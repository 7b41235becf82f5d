// The GPT model's backward against finite differences of its forward, per tensor, along a random
// direction (central differences; fp32 model, so the tolerance is a few percent of the derivative).
#include "examples/gpt/model.h"

#include <gtest/gtest.h>

#include <barrier>
#include <cmath>
#include <random>
#include <thread>

namespace gpt {
namespace {

struct Fixture {
  Config c;
  int batch = 2;
  std::vector<TensorDef> defs;
  std::vector<std::vector<float>> w, g;
  std::vector<uint8_t> tokens;

  explicit Fixture(uint64_t seed, Config config = {256, 8, 2, 16, 2}) : c(config), defs(Tensors(config)) {
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
  std::vector<const float*> Weights() const {
    std::vector<const float*> p;
    for (const auto& x : w) p.push_back(x.data());
    return p;
  }
  double Loss(Model& m) { return Forward(m, c, Weights(), tokens.data()); }
  void Grads(Model& m) {
    Loss(m);
    std::vector<float*> d;
    for (auto& x : g) {
      std::fill(x.begin(), x.end(), 0.0f);
      d.push_back(x.data());
    }
    Backward(m, c, Weights(), d);
  }
};

// The experts each token went to, every block (empty without experts).
std::vector<int> Routes(const Model& m, const Config& c) {
  std::vector<int> r;
  for (int l = 0; c.experts > 0 && l < c.layers; ++l) r.insert(r.end(), m.routes(l).begin(), m.routes(l).end());
  return r;
}

// Each tensor's gradient along a random direction against central differences of the loss. With
// experts the loss is smooth only while no token changes experts: a step that moves a token elsewhere
// is taken again with a smaller eps (the routing is piecewise constant; its gradient is not taken).
void CheckGradients(Fixture& f) {
  Model m(f.c, f.batch);
  f.Grads(m);
  const std::vector<int> routes = Routes(m, f.c);
  std::mt19937 rng(99);
  for (size_t t = 0; t < f.defs.size(); ++t) {
    std::vector<float>& x = f.w[t];
    std::vector<float> d(x.size());
    for (float& v : d) v = (rng() & 1 ? 1.0f : -1.0f) / std::sqrt(static_cast<float>(x.size()));
    double analytic = 0;
    for (size_t i = 0; i < x.size(); ++i) analytic += static_cast<double>(f.g[t][i]) * d[i];
    const std::vector<float> saved = x;
    double numeric = 0;
    bool smooth = false;
    for (float eps = 1e-2f; !smooth && eps > 1e-4f; eps /= 4) {
      for (size_t i = 0; i < x.size(); ++i) x[i] = saved[i] + eps * d[i];
      const double up = f.Loss(m);
      smooth = Routes(m, f.c) == routes;
      for (size_t i = 0; i < x.size(); ++i) x[i] = saved[i] - eps * d[i];
      const double down = f.Loss(m);
      smooth = smooth && Routes(m, f.c) == routes;
      numeric = (up - down) / (2 * eps);
    }
    x = saved;
    ASSERT_TRUE(smooth) << f.defs[t].name << ": every step moved a token to another expert";
    EXPECT_NEAR(analytic, numeric, 0.03 * std::abs(numeric) + 2e-4) << f.defs[t].name;
  }
}

TEST(GptModel, GradientsMatchFiniteDifferencesForEveryTensor) {
  Fixture f(std::random_device{}());
  CheckGradients(f);
}

// Mixture of experts: the router (its softmax gates and the load-balancing term) and every expert,
// one expert per token and two; a larger balancing weight so its gradient is not lost in the loss's.
// The smallest gap, over every token and block, between the probability of its k-th expert and of the
// best one it did not go to: how far the routing is from a tie.
double RoutingMargin(const Model& m, const Config& c) {
  double margin = 1;
  for (int l = 0; l < c.layers; ++l) {
    const std::vector<float>& p = m.router_probs(l);
    const std::vector<int>& r = m.routes(l);
    for (size_t n = 0; n * static_cast<size_t>(c.experts) < p.size(); ++n) {
      const float* pn = p.data() + n * static_cast<size_t>(c.experts);
      const float kth = pn[r[(n + 1) * static_cast<size_t>(c.top_k) - 1]];
      for (int e = 0; e < c.experts; ++e) {
        bool taken = false;
        for (int s = 0; s < c.top_k; ++s) taken = taken || r[n * static_cast<size_t>(c.top_k) + static_cast<size_t>(s)] == e;
        if (!taken) margin = std::min(margin, static_cast<double>(kth - pn[e]));
      }
    }
  }
  return margin;
}

TEST(GptModel, ExpertGradientsMatchFiniteDifferences) {
  std::mt19937_64 seeds(std::random_device{}());
  for (int k : {1, 2}) {
    SCOPED_TRACE("top_k " + std::to_string(k));
    const Config c{256, 8, 2, 16, 2, 4, k, 0.5f};
    Fixture f(seeds(), c);
    for (int tries = 0; tries < 100; ++tries) {  // weights whose routing is not within 2e-3 of a tie
      Model probe(c, f.batch);
      f.Loss(probe);
      if (RoutingMargin(probe, c) >= 2e-3) break;
      f = Fixture(seeds(), c);
    }
    CheckGradients(f);
    Model m(f.c, f.batch);
    const double loss = f.Loss(m);
    EXPECT_GT(m.aux_loss(), 0.0);
    EXPECT_LT(m.aux_loss(), loss);
    // Every token went to k different experts.
    for (int l = 0; l < f.c.layers; ++l) {
      const std::vector<int>& r = m.routes(l);
      ASSERT_EQ(r.size(), static_cast<size_t>(f.batch * f.c.context * k));
      for (size_t n = 0; n < r.size(); n += static_cast<size_t>(k)) {
        for (int s = 0; s < k; ++s) {
          EXPECT_GE(r[n + static_cast<size_t>(s)], 0);
          EXPECT_LT(r[n + static_cast<size_t>(s)], 4);
          if (s > 0) {
            EXPECT_NE(r[n + static_cast<size_t>(s)], r[n]);
          }
        }
      }
    }
  }
}

// Expert parallelism in one process: P "ranks" on threads, each with its own tokens and a mailbox
// all-to-all, against the model with every expert local on each rank's tokens: the same routes and
// loss on every rank, the same gradients of the dense tensors, and of each expert on its rank the
// sum of the ranks' gradients; the experts of other ranks never read (null pointers).
TEST(GptModel, ExpertParallelMatchesEveryExpertLocal) {
  std::mt19937_64 seeds(std::random_device{}());
  for (int P : {2, 4}) {
    for (int k : {1, 2}) {
      SCOPED_TRACE("EP " + std::to_string(P) + " top_k " + std::to_string(k));
      const Config c{256, 8, 2, 16, 2, 4, k, 0.5f};
      const uint64_t seed = seeds();
      std::vector<Fixture> ref;  // rank r's tokens; the weights are rank 0's on every rank
      for (int r = 0; r < P; ++r) {
        ref.emplace_back(r == 0 ? seed : seeds(), c);
        ref.back().w = ref.front().w;
      }
      std::vector<double> ref_loss(static_cast<size_t>(P));
      std::vector<std::vector<int>> ref_routes(static_cast<size_t>(P));
      for (int r = 0; r < P; ++r) {
        Model m(c, ref[static_cast<size_t>(r)].batch);
        ref[static_cast<size_t>(r)].Grads(m);
        ref_loss[static_cast<size_t>(r)] = ref[static_cast<size_t>(r)].Loss(m);
        ref_routes[static_cast<size_t>(r)] = Routes(m, c);
      }
      // The mailbox: box[from][to], written before the first wait and read before the second.
      std::vector<std::vector<std::vector<float>>> box(static_cast<size_t>(P));
      std::barrier sync(P);
      std::vector<std::vector<std::vector<float>>> grads(static_cast<size_t>(P));
      std::vector<double> loss(static_cast<size_t>(P));
      std::vector<std::vector<int>> routes(static_cast<size_t>(P));
      std::vector<std::thread> ranks;
      for (int r = 0; r < P; ++r) {
        ranks.emplace_back([&, r] {
          ExpertParallel ep{P, r, [&, r](std::vector<std::vector<float>> send) {
                              box[static_cast<size_t>(r)] = std::move(send);
                              sync.arrive_and_wait();
                              std::vector<std::vector<float>> recv;
                              for (int q = 0; q < P; ++q) recv.push_back(box[static_cast<size_t>(q)][static_cast<size_t>(r)]);
                              sync.arrive_and_wait();
                              return recv;
                            }};
          const Fixture& f = ref[static_cast<size_t>(r)];
          std::vector<const float*> w = f.Weights();
          auto& g = grads[static_cast<size_t>(r)];
          std::vector<float*> d;
          for (size_t t = 0; t < f.defs.size(); ++t) {
            const std::string& name = f.defs[t].name;
            const size_t at = name.find("experts.");
            const bool local = at == std::string::npos || ep.holds(std::stoi(name.substr(at + 8)), c.experts);
            g.emplace_back(f.w[t].size(), 0.0f);
            if (!local) w[t] = nullptr;
            d.push_back(local ? g.back().data() : nullptr);
          }
          Model m(c, f.batch, ep);
          Forward(m, c, w, f.tokens.data());
          Backward(m, c, w, d);
          loss[static_cast<size_t>(r)] = Forward(m, c, w, f.tokens.data());
          routes[static_cast<size_t>(r)] = Routes(m, c);
        });
      }
      for (auto& t : ranks) t.join();
      const std::vector<TensorDef>& defs = ref[0].defs;
      int experts_with_gradients = 0;  // tensors of experts that had tokens (not a vacuous comparison)
      for (int r = 0; r < P; ++r) {
        const size_t ur = static_cast<size_t>(r);
        EXPECT_EQ(routes[ur], ref_routes[ur]) << "rank " << r;
        EXPECT_NEAR(loss[ur], ref_loss[ur], 1e-5 * ref_loss[ur]) << "rank " << r;
        for (size_t t = 0; t < defs.size(); ++t) {
          const size_t at = defs[t].name.find("experts.");
          const int expert = at == std::string::npos ? -1 : std::stoi(defs[t].name.substr(at + 8));
          if (expert >= 0 && expert / (c.experts / P) != r) continue;
          std::vector<float> want = ref[ur].g[t];
          if (expert >= 0) {  // the sum over the ranks
            std::fill(want.begin(), want.end(), 0.0f);
            for (int q = 0; q < P; ++q) {
              for (size_t i = 0; i < want.size(); ++i) want[i] += ref[static_cast<size_t>(q)].g[t][i];
            }
          }
          float scale = 0, worst = 0;
          for (size_t i = 0; i < want.size(); ++i) {
            scale = std::max(scale, std::abs(want[i]));
            worst = std::max(worst, std::abs(grads[ur][t][i] - want[i]));
          }
          EXPECT_LE(worst, 1e-5f * scale + 1e-7f) << defs[t].name << " on rank " << r;
          if (expert >= 0 && scale > 0) ++experts_with_gradients;
        }
      }
      EXPECT_GT(experts_with_gradients, 0);
    }
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
  Config moe = *Preset("tiny");
  moe.experts = 4;
  moe.top_k = 2;
  int64_t n = 0;
  for (const TensorDef& d : Tensors(moe)) {
    int64_t e = 1;
    for (int64_t s : d.shape) e *= s;
    n += e;
  }
  EXPECT_EQ(n, moe.num_params());
  EXPECT_EQ(static_cast<int>(Tensors(moe).size()), 2 + moe.layers * moe.block_tensors() + 2);
  EXPECT_EQ(Preset("gpt2")->num_params(), 86'039'040);  // GPT-2 124M (124,439,808) with 256 byte tokens instead of 50257
  EXPECT_FALSE(Preset("huge").ok());
}

}  // namespace
}  // namespace gpt
