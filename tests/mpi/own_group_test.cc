// Tensors over a data-parallel group of their own (ParamOptions::data_parallel: a mixture-of-experts
// model's experts over their expert-data-parallel group) at 1, 2, 3, 4 and 6 ranks, every expert-
// parallel size EP dividing the world (EP = 1: every rank holds every expert, over the whole world;
// EP = N: each rank its own experts, alone). Ranks at the same place in each EP group (rank % EP) form
// an expert-data-parallel group and hold the same experts; the model has dense tensors over the world
// beside them. Against a one-process reference engine holding every tensor, whose gradients are the
// world's mean for dense tensors and the sum over an expert's holders divided by the world for
// experts: parameters and the clipped global norm at stages 0-3 (accumulation; host and NVMe offload
// of state and parameters at stage 3), replicas of an expert bit-identical, and the rules:
// registrations compared within the groups, one such group per rank, the configurations that do not
// combine; the full state (ForEachFullTensor) of every tensor on every rank (checkpoints:
// own_group_ckpt_test.cc).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "tests/mpi/engine_fixture.h"
#include "tests/mpi/own_group_model.h"
#include "tests/support/scratch_root.h"

namespace zrt {
namespace {

using namespace own_group;  // NOLINT: the shared model


class OwnGroupTest : public EngineTest {
 protected:
  std::vector<int> Eps() const {
    std::vector<int> out;
    for (int ep = 1; ep <= size(); ++ep) {
      if (size() % ep == 0) out.push_back(ep);
    }
    return out;
  }

  // This rank's engine: its experts over `edp`.
  Result<std::unique_ptr<ZeroEngine>> Build(const Case& r, int ep, Communicator* edp, std::vector<int64_t>* keys) {
    EngineConfig c = Config(r);
    if (r.nvme) {
      const std::string root = testing::SharedScratchRoot(comm_.get(), "zrt_own_group_nvme");
      if (root.empty()) return InternalError("no scratch root");
      nvme_roots_.push_back(root);
      c.offload.nvme_dir = root + "/rank" + std::to_string(rank());
      std::filesystem::create_directories(c.offload.nvme_dir);
    }
    ASSIGN_OR_RETURN(auto e, ZeroEngine::Create(comm_.get(), &device_, c));
    RETURN_IF_ERROR(AddModel(*e, ep, {rank() % ep}, edp, keys));
    return e;
  }

  // The one-process reference: every tensor, gradients already reduced as the engine defines them.
  Result<std::unique_ptr<ZeroEngine>> BuildReference(const Case& r, int ep, Communicator* self, std::vector<int64_t>* keys) {
    Case one = r;
    one.offload = one.nvme = false;
    ASSIGN_OR_RETURN(auto e, ZeroEngine::Create(self, &device_, Config(one)));
    std::vector<int> all(static_cast<size_t>(ep));
    for (int er = 0; er < ep; ++er) all[static_cast<size_t>(er)] = er;
    RETURN_IF_ERROR(AddModel(*e, ep, all, nullptr, keys));
    return e;
  }

  // One micro-step's forward and backward of every group, the gradient by tensor key.
  void Backward(ZeroEngine& e, const std::vector<int64_t>& keys, const std::function<float(int64_t key, int64_t i, float v)>& grad) {
    EngineTest::Backward(e, keys.size(), [&](int64_t p, int64_t i, float v) { return grad(keys[static_cast<size_t>(p)], i, v); });
  }

  void TearDown() override {
    for (const std::string& root : nvme_roots_) EXPECT_TRUE(testing::RemoveSharedScratchRoot(comm_.get(), root).ok());
  }
  std::vector<std::string> nvme_roots_;

  // Trains both for `steps` optimizer steps and compares.
  void Compare(const Case& r, int ep) {
    SCOPED_TRACE(Name(r, ep));
    auto edp = comm_->Split(rank() % ep, rank());
    ASSERT_TRUE(edp.ok()) << edp.status();
    ASSERT_EQ((*edp)->size(), size() / ep);
    auto self = MpiCommunicator::Create(MPI_COMM_SELF);
    ASSERT_TRUE(self.ok());
    std::vector<int64_t> keys, ref_keys;
    auto e = Build(r, ep, edp->get(), &keys);
    ASSERT_TRUE(e.ok()) << e.status();
    auto ref = BuildReference(r, ep, self->get(), &ref_keys);
    ASSERT_TRUE(ref.ok()) << ref.status();
    const int n = size();
    // Which ranks hold expert id: those with rank % ep == id % ep.
    auto holders = [&](int id) {
      std::vector<int> q;
      for (int k = 0; k < n; ++k) {
        if (k % ep == id % ep) q.push_back(k);
      }
      return q;
    };
    constexpr int kSteps = 3;
    for (int s = 0; s < kSteps; ++s) {
      for (int m = 0; m < r.accum; ++m) {
        const bool last = m + 1 == r.accum;
        (*e)->SetSync(last);
        (*ref)->SetSync(last);
        const int me = rank();
        Backward(**e, keys, [&](int64_t key, int64_t i, float v) { return Grad(me, key, i, v) * static_cast<float>(m + 1); });
        Backward(**ref, ref_keys, [&](int64_t key, int64_t i, float v) {
          float sum = 0;
          if (key < 100) {
            for (int q = 0; q < n; ++q) sum += Grad(q, key, i, v);
          } else {
            for (int q : holders(static_cast<int>((key - 100) / 2))) sum += Grad(q, key, i, v);
          }
          return sum / static_cast<float>(n) * static_cast<float>(m + 1);
        });
      }
      auto a = (*e)->Step();
      auto b = (*ref)->Step();
      ASSERT_TRUE(a.ok()) << a.status();
      ASSERT_TRUE(b.ok()) << b.status();
      EXPECT_NEAR(a->grad_norm, b->grad_norm, 1e-5 * b->grad_norm) << "step " << s;
    }
    // Every tensor this rank holds against the reference's.
    const auto mine = Params(**e, keys.size());
    const auto want = Params(**ref, ref_keys.size());
    for (size_t p = 0; p < keys.size(); ++p) {
      size_t rp = 0;
      while (rp < ref_keys.size() && ref_keys[rp] != keys[p]) ++rp;
      ASSERT_LT(rp, ref_keys.size());
      ASSERT_EQ(mine[p].size(), want[rp].size());
      double worst = 0;
      for (size_t i = 0; i < mine[p].size(); ++i) worst = std::max(worst, std::fabs(static_cast<double>(mine[p][i]) - want[rp][i]));
      EXPECT_LT(worst, 2e-5) << "tensor " << (*e)->spec(ParamHandle{static_cast<int64_t>(p)}).name;
    }
    // The holders of an expert hold the very same values; the dense tensors are the same everywhere.
    for (size_t p = 0; p < keys.size(); ++p) {
      Communicator* c = keys[p] < 100 ? comm_.get() : edp->get();
      std::vector<float> first = mine[p];
      ASSERT_TRUE(c->Broadcast(first.data(), first.size() * sizeof(float), DType::kBytes, 0).ok());
      EXPECT_EQ(0, std::memcmp(first.data(), mine[p].data(), first.size() * sizeof(float))) << "tensor #" << p;
    }
    // The full state on every rank (root -1) and on the last alone: every tensor of every group,
    // those of experts this rank does not hold included, once each, as the reference has it.
    const FullStateOptions all_kinds{.root = -1, .kinds = {"master", "exp_avg", "exp_avg_sq"}};
    std::map<std::string, std::vector<float>> want_full;
    ASSERT_TRUE((*ref)->ForEachFullTensor(all_kinds, [&](const TensorSpec& t, std::string_view kind, std::span<const float> v) {
      want_full[t.name + "/" + std::string(kind)].assign(v.begin(), v.end());
      return Status();
    }).ok());
    for (int root : {-1, n - 1}) {
      FullStateOptions o = all_kinds;
      o.root = root;
      std::map<std::string, std::vector<float>> got;
      Status st = (*e)->ForEachFullTensor(o, [&](const TensorSpec& t, std::string_view kind, std::span<const float> v) {
        const std::string key = t.name + "/" + std::string(kind);
        if (got.count(key) != 0) return InternalError("twice: ", key);
        got[key].assign(v.begin(), v.end());
        return Status();
      });
      ASSERT_TRUE(st.ok()) << st;
      if (root != -1 && root != rank()) {
        EXPECT_TRUE(got.empty());
        continue;
      }
      ASSERT_EQ(got.size(), want_full.size()) << "root " << root;
      for (const auto& [key, v] : want_full) {
        ASSERT_EQ(got.count(key), 1u) << key;
        ASSERT_EQ(got[key].size(), v.size()) << key;
        double worst = 0;
        for (size_t i = 0; i < v.size(); ++i) worst = std::max(worst, std::fabs(static_cast<double>(got[key][i]) - v[i]));
        EXPECT_LT(worst, 2e-5) << key << " (root " << root << ")";
      }
    }
  }
};

TEST_F(OwnGroupTest, MatchesTheReferenceAtEveryStageAndExpertParallelSize) {
  for (int ep : Eps()) {
    for (int stage : {0, 1, 2, 3}) Compare({.stage = stage}, ep);
    Compare({.stage = 2, .accum = 2, .clip = 0.5}, ep);  // clipping active: the norm counts each expert once
    Compare({.stage = 3, .accum = 2, .clip = 0.5}, ep);
    Compare({.stage = 0, .clip = 0.5}, ep);
    Compare({.stage = 3, .offload = true}, ep);
    Compare({.stage = 3, .accum = 2, .nvme = true}, ep);
  }
}

TEST_F(OwnGroupTest, RegistrationsAreComparedWithinTheGroup) {
  if (size() < 2) GTEST_SKIP() << "needs two ranks";
  const int ep = size() >= 4 && size() % 2 == 0 ? 2 : 1;  // groups of two or more ranks
  auto edp = comm_->Split(rank() % ep, rank());
  ASSERT_TRUE(edp.ok());
  // The last rank's expert has another shape than its group's rank 0's: refused on every rank, naming it.
  {
    auto e = ZeroEngine::Create(comm_.get(), &device_, Config({}));
    ASSERT_TRUE(e.ok());
    ASSERT_TRUE((*e)->AddParam("w", {64}, DType::kF32).ok());
    const int64_t len = rank() == size() - 1 ? 65 : 64;
    ASSERT_TRUE((*e)->AddParam("expert." + std::to_string(rank() % ep), {len}, DType::kF32, {.group = "x", .data_parallel = edp->get()}).ok());
    Status st = (*e)->Finalize(InitFn());
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("differs across ranks"), std::string::npos) << st;
  }
  // Rank 0 alone has tensors over a group of its own: refused everywhere, nothing hangs.
  {
    auto self = MpiCommunicator::Create(MPI_COMM_SELF);
    ASSERT_TRUE(self.ok());
    auto e = ZeroEngine::Create(comm_.get(), &device_, Config({}));
    ASSERT_TRUE(e.ok());
    ASSERT_TRUE((*e)->AddParam("w", {64}, DType::kF32).ok());
    if (rank() == 0) {
      ASSERT_TRUE((*e)->AddParam("mine", {8}, DType::kF32, {.group = "x", .data_parallel = self->get()}).ok());
    }
    Status st = (*e)->Finalize(InitFn());
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("of its own"), std::string::npos) << st;
  }
}

TEST_F(OwnGroupTest, RulesAndRefusals) {
  auto self = MpiCommunicator::Create(MPI_COMM_SELF);
  auto edp = comm_->Split(rank(), rank());  // EP = N: one rank each
  ASSERT_TRUE(self.ok() && edp.ok());
  auto fresh = [&](const EngineConfig& c) {
    auto e = ZeroEngine::Create(comm_.get(), &device_, c);
    EXPECT_TRUE(e.ok()) << e.status();
    return std::move(*e);
  };
  // A second group besides the engine's, and a group's tensors over two.
  {
    auto e = fresh(Config({}));
    ASSERT_TRUE(e->AddParam("a", {8}, DType::kF32, {.group = "x", .data_parallel = edp->get()}).ok());
    auto b = e->AddParam("b", {8}, DType::kF32, {.group = "y", .data_parallel = self->get()});
    EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument) << b.status();
    ASSERT_TRUE(e->AddParam("c", {8}, DType::kF32, {.group = "x"}).ok());
    Status st = e->Finalize(InitFn());
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("different data-parallel groups"), std::string::npos) << st.message();
  }
  // The engine's own communicator is the engine's group (nothing special).
  {
    auto e = fresh(Config({}));
    ASSERT_TRUE(e->AddParam("a", {8}, DType::kF32, {.data_parallel = comm_.get()}).ok());
    ASSERT_TRUE(e->Finalize(InitFn()).ok());
    EXPECT_TRUE(e->state_view().CheckOneMesh("save").ok());
  }
  // What does not combine yet.
  std::vector<EngineConfig> refused;
  EngineConfig c = Config({.stage = 3});
  c.quantized_weights = true;
  refused.push_back(c);
  c = Config({.stage = 2});
  c.quantized_gradients = true;
  refused.push_back(c);
  if (size() >= 2) {
    c = Config({.stage = 2});
    c.shard_group_size = 1;
    refused.push_back(c);
  }
  for (const EngineConfig& cfg : refused) {
    auto e = fresh(cfg);
    ASSERT_TRUE(e->AddParam("d", {8}, DType::kF32).ok());
    ASSERT_TRUE(e->AddParam("x", {8}, DType::kF32, {.group = "x", .data_parallel = edp->get()}).ok());
    Status st = e->Finalize(InitFn());
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("do not combine"), std::string::npos) << st;
  }
  // A tensor of another rank's expert group is found by name (every rank asks for it); an unknown
  // name, or ranks asking for different tensors (each its own expert's handle), are refused on every
  // rank, nothing hangs.
  {
    auto e = fresh(Config({}));
    ASSERT_TRUE(e->AddParam("d", {8}, DType::kF32).ok());
    ASSERT_TRUE(e->AddParam("x." + std::to_string(rank()), {8}, DType::kF32, {.group = "experts", .data_parallel = edp->get()}).ok());
    ASSERT_TRUE(e->Finalize(InitFn()).ok());
    auto full = e->FullMaster(ParamHandle{1});
    if (size() == 1) {
      ASSERT_TRUE(full.ok()) << full.status();
      EXPECT_EQ(full->size(), 8u);
    } else {
      EXPECT_EQ(full.status().code(), StatusCode::kInvalidArgument) << full.status();
      EXPECT_NE(full.status().message().find("asks for"), std::string::npos) << full.status();
    }
    int seen = 0;
    Status st = e->ForEachFullTensor({.tensors = {"x." + std::to_string(size() - 1)}}, [&](const TensorSpec&, std::string_view, std::span<const float>) {
      ++seen;
      return Status();
    });
    EXPECT_TRUE(st.ok()) << st;
    EXPECT_EQ(seen, rank() == 0 ? 1 : 0);
    st = e->ForEachFullTensor({.tensors = {"x." + std::to_string(size())}}, [](const TensorSpec&, std::string_view, std::span<const float>) { return Status(); });
    EXPECT_EQ(st.code(), StatusCode::kNotFound) << st;
  }
}

}  // namespace
}  // namespace zrt
