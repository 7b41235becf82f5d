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
// combine, checkpoints refused.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "tests/mpi/engine_fixture.h"
#include "tests/support/scratch_root.h"
#include "zrt/checkpoint/checkpointer.h"

namespace zrt {
namespace {

// The dense part; experts are added per EP rank (ExpertsOf).
const std::vector<ParamDef> kDense = {{"embed", {37, 29}, "g0"}, {"w1", {1001}, "g1"}, {"b1", {3}, "g1"}, {"head", {129}, "g2"}};
constexpr int kExpertsPerRank = 2;

struct Expert {
  int id;             // global expert index
  ParamDef w, b;      // its tensors (group "expert.<id>")
};
// EP rank e's experts: e, e + EP, ... (kExpertsPerRank of them).
std::vector<Expert> ExpertsOf(int ep, int e) {
  std::vector<Expert> out;
  for (int k = 0; k < kExpertsPerRank; ++k) {
    const int id = e + k * ep;
    const std::string g = "expert." + std::to_string(id);
    out.push_back({id, {g + ".w", {333}, g}, {g + ".b", {7}, g}});
  }
  return out;
}
// A tensor's identity in the gradient and init functions: dense index, or 100 + 2 id (+1 for b).
int64_t ExpertKey(int id, int which) { return 100 + 2 * id + which; }

struct Case {
  int stage = 2;
  int accum = 1;
  double clip = 0;
  bool offload = false;  // stage 3: optimizer state and parameter shards in host memory
  bool nvme = false;     // stage 3: both on NVMe (streamed in sub-groups)
};
std::string Name(const Case& r, int ep) {
  return "stage " + std::to_string(r.stage) + " accum " + std::to_string(r.accum) + " clip " + std::to_string(r.clip) +
         (r.offload ? " offload" : "") + (r.nvme ? " nvme" : "") + " EP " + std::to_string(ep);
}

EngineConfig Config(const Case& r) {
  EngineConfig c;
  c.stage = r.stage;
  c.bucket_bytes = 4096;  // several buckets per step, groups across buckets
  c.alignment = 8;
  c.grad_accum_steps = r.accum;
  c.max_grad_norm = r.clip;
  c.adam.lr = 1e-2;
  c.adam.weight_decay = 0.01;
  c.adam.eps = 0.5;  // about the gradients' size: the update sees their scale (Adam alone would not)
  if (r.offload) {
    c.offload.optimizer = OffloadTarget::kHost;
    c.offload.params = OffloadTarget::kHost;
  }
  if (r.nvme) {  // nvme_dir: the caller's
    c.offload.optimizer = OffloadTarget::kNvme;
    c.offload.params = OffloadTarget::kNvme;
    c.offload.sub_group_elements = 512;
  }
  return c;
}

// Rank q's gradient of tensor `key`'s element i at value v.
float Grad(int q, int64_t key, int64_t i, float v) { return v - Target(q, key, i) + 0.01f * static_cast<float>(q); }

class OwnGroupTest : public EngineTest {
 protected:
  std::vector<int> Eps() const {
    std::vector<int> out;
    for (int ep = 1; ep <= size(); ++ep) {
      if (size() % ep == 0) out.push_back(ep);
    }
    return out;
  }

  // The dense tensors, then the experts of EP ranks `eps` (over `edp`, or the engine's group when
  // null), initialised by their keys.
  static Status AddModel(ZeroEngine& e, int ep, const std::vector<int>& eps, Communicator* edp, std::vector<int64_t>* keys) {
    keys->clear();
    for (size_t p = 0; p < kDense.size(); ++p) {
      RETURN_IF_ERROR(e.AddParam(kDense[p].name, kDense[p].shape, DType::kF32, {.group = kDense[p].group}).status());
      keys->push_back(static_cast<int64_t>(p));
    }
    for (int er : eps) {
      for (const Expert& x : ExpertsOf(ep, er)) {
        RETURN_IF_ERROR(e.AddParam(x.w.name, x.w.shape, DType::kF32, {.group = x.w.group, .data_parallel = edp}).status());
        RETURN_IF_ERROR(e.AddParam(x.b.name, x.b.shape, DType::kF32, {.group = x.b.group, .weight_decay = 0, .data_parallel = edp}).status());
        keys->push_back(ExpertKey(x.id, 0));
        keys->push_back(ExpertKey(x.id, 1));
      }
    }
    const std::vector<int64_t> k = *keys;
    return e.Finalize([k](int64_t p, int64_t off, int64_t n, float* out) {
      for (int64_t i = 0; i < n; ++i) out[i] = Init(k[static_cast<size_t>(p)], off + i);
    });
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
  // Checkpoints, loads and the full state refuse the view, naming the group.
  {
    auto e = fresh(Config({}));
    ASSERT_TRUE(e->AddParam("d", {8}, DType::kF32).ok());
    ASSERT_TRUE(e->AddParam("x", {8}, DType::kF32, {.group = "experts", .data_parallel = edp->get()}).ok());
    ASSERT_TRUE(e->Finalize(InitFn()).ok());
    const std::string root = testing::SharedScratchRoot(comm_.get(), "zrt_own_group_ckpt");
    ASSERT_FALSE(root.empty());
    auto ck = ckpt::Checkpointer::Create(comm_.get(), &device_, {.root = root});
    ASSERT_TRUE(ck.ok()) << ck.status();
    Status st = (*ck)->SaveAsync(e->state_view());
    if (st.ok()) st = (*ck)->Wait();
    EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st;
    EXPECT_NE(st.message().find("'experts'"), std::string::npos) << st;
    auto res = (*ck)->Resume(e->state_view());
    EXPECT_EQ(res.status().code(), StatusCode::kFailedPrecondition) << res.status();
    auto full = e->FullMaster(ParamHandle{0});
    EXPECT_EQ(full.status().code(), StatusCode::kFailedPrecondition) << full.status();
    ck->reset();
    ASSERT_TRUE(testing::RemoveSharedScratchRoot(comm_.get(), root).ok());
  }
}

}  // namespace
}  // namespace zrt
