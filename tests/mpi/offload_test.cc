// Offload at 1..4 ranks: optimizer state on host memory or NVMe (and stage-3 parameters too) gives
// bit-identical training to the in-memory engine over 10 steps at every stage and dtype; checkpoints
// of NVMe-resident state save and load in both directions; bad input (missing directory, budget too
// small, files removed underneath, on one rank or all) is a clear error on every rank and changes
// nothing.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

#include "zrt/checkpoint/checkpointer.h"
#include "zrt/checkpoint/catalog.h"
#include "zrt/checkpoint/load.h"
#include "tests/mpi/engine_fixture.h"
#include "tests/support/checkpointer_testing.h"
#include "tests/support/io_hooks.h"
#include "tests/support/state_values.h"

namespace zrt {
namespace {

namespace fs = std::filesystem;

class OffloadTest : public EngineTest {
 protected:
  void SetUp() override {
    EngineTest::SetUp();
    int64_t id = ::getpid();
    ASSERT_TRUE(comm_->Broadcast(&id, sizeof(id), DType::kBytes, 0).ok());
    dir_ = fs::temp_directory_path() / ("zrt_offload_" + std::to_string(id) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    ASSERT_TRUE(comm_->Barrier().ok());
  }
  void TearDown() override {
    ASSERT_TRUE(comm_->Barrier().ok());
    if (rank() == 0) fs::remove_all(dir_);
  }

  // Each live NVMe engine needs its own directory (the swapper locks it): `sub` names one under dir_.
  EngineConfig Config(int stage, OffloadTarget optimizer, OffloadTarget params, const std::string& sub = "swap") const {
    fs::create_directories(dir_ / sub);
    EngineConfig c;
    c.stage = stage;
    c.bucket_bytes = 4096;
    c.alignment = 4;
    c.max_grad_norm = 0.5;
    c.adam.lr = 1e-2;
    c.adam.weight_decay = 0.01;
    c.prefetch_depth = 1;
    c.offload.optimizer = optimizer;
    c.offload.params = params;
    c.offload.nvme_dir = (dir_ / sub).string();
    c.offload.sub_group_elements = 4096;  // the smallest: several sub-groups per group
    c.offload.host_budget_bytes = 4 << 20;
    return c;
  }

  void Train(ZeroEngine& e, int from, int to) {
    for (int step = from; step < to; ++step) {
      Backward(e, kModel.size(), [&](int64_t p, int64_t i, float v) { return v - Target(rank(), p, i) + 0.01f * static_cast<float>(step); });
      auto r = e.Step();
      ASSERT_TRUE(r.ok()) << r.status();
      ASSERT_FALSE(r->skipped);
    }
  }

  // This rank's optimizer state, read through the view whether resident or not.
  static std::vector<std::vector<float>> State(ZeroEngine& e) { return testing::ReadState(e.state_view()); }

  static void ExpectBitIdentical(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b,
                                 const std::string& what) {
    ASSERT_EQ(a.size(), b.size()) << what;
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a[i].size(), b[i].size()) << what << " #" << i;
      if (a[i].empty()) continue;
      ASSERT_EQ(std::memcmp(a[i].data(), b[i].data(), a[i].size() * 4), 0) << what << " #" << i << " differs";
    }
  }

  fs::path dir_;
};

TEST_F(OffloadTest, OffloadedRunsAreBitIdenticalToInMemory) {
  using T = OffloadTarget;
  struct Case {
    int stage;
    T optimizer, params;
    DType dtype;
    bool amsgrad;
  };
  const Case cases[] = {
      {0, T::kNvme, T::kNone, DType::kBF16, false}, {1, T::kNvme, T::kNone, DType::kF32, false},
      {2, T::kNvme, T::kNone, DType::kBF16, true},  {2, T::kHost, T::kNone, DType::kBF16, false},
      {3, T::kNvme, T::kNone, DType::kBF16, false}, {3, T::kNvme, T::kNvme, DType::kBF16, false},
      {3, T::kNvme, T::kNvme, DType::kF32, true},   {3, T::kHost, T::kHost, DType::kF16, false},
  };
  for (const Case& c : cases) {
    const std::string what = "stage " + std::to_string(c.stage) + " optimizer " + std::string(OffloadTargetName(c.optimizer)) +
                             " params " + std::string(OffloadTargetName(c.params)) + " " + std::string(DTypeName(c.dtype));
    EngineConfig mem = Config(c.stage, T::kNone, T::kNone), off = Config(c.stage, c.optimizer, c.params);
    mem.adam.amsgrad = off.adam.amsgrad = c.amsgrad;
    auto a = Make(mem, kModel, c.dtype, InitFn());
    ASSERT_TRUE(a.ok()) << a.status();
    const auto dev_before = device_.memory().Read();
    auto b = Make(off, kModel, c.dtype, InitFn());
    ASSERT_TRUE(b.ok()) << what << ": " << b.status();
    Train(**a, 0, 10);
    Train(**b, 0, 10);
    ExpectBitIdentical(Params(**a, kModel.size()), Params(**b, kModel.size()), what + ": parameters");
    ExpectBitIdentical(State(**a), State(**b), what + ": optimizer state");
    // Where the state lives: nothing of it on the device; the host holds the state (host) or only the
    // buffer sets within the budget (nvme).
    const auto dev = (*b)->memory(), host = (*b)->host_memory();  // the device is shared with `a`
    EXPECT_EQ(dev.current_of(MemCategory::kOptimizerState), dev_before.current_of(MemCategory::kOptimizerState)) << what;
    if (c.optimizer == T::kHost) {
      EXPECT_EQ(host.current_of(MemCategory::kOptimizerState), (*a)->memory().current_of(MemCategory::kOptimizerState)) << what;
    } else {
      EXPECT_LE(host.total_current, off.offload.host_budget_bytes) << what;
      EXPECT_GT((*b)->swap_stats().bytes_written, 0) << what;
    }
    if (c.params != T::kNone) {
      EXPECT_EQ(dev.current_of(MemCategory::kParameters), dev_before.current_of(MemCategory::kParameters)) << what;
    }
  }
}

TEST_F(OffloadTest, CheckpointsOfNvmeStateLoadBothWays) {
  using T = OffloadTarget;
  const std::string root = (dir_ / "ckpt").string();
  auto nvme = Make(Config(3, T::kNvme, T::kNvme), kModel, DType::kBF16, InitFn());
  ASSERT_TRUE(nvme.ok()) << nvme.status();
  Train(**nvme, 0, 4);
  {
    auto ck = ckpt::Checkpointer::Create(comm_.get(), &device_, {.root = root});
    ASSERT_TRUE(ck.ok()) << ck.status();
    ASSERT_TRUE((*ck)->SaveAsync((*nvme)->state_view(), {{"k", 1}}).ok());
    ASSERT_TRUE((*ck)->Wait().ok());
  }
  Train(**nvme, 4, 8);
  const auto want = Params(**nvme, kModel.size());
  const auto want_state = State(**nvme);
  auto dir = ckpt::FindLatestComplete(root);
  ASSERT_TRUE(dir.ok()) << dir.status();
  std::vector<std::vector<std::vector<float>>> verified;
  for (T target : {T::kNone, T::kNvme}) {
    auto e = Make(Config(3, target, target, "resume"), kModel, DType::kBF16, [](int64_t, int64_t, int64_t n, float* out) {
      std::fill(out, out + n, 123.0f);  // overwritten by the load
    });
    ASSERT_TRUE(e.ok()) << e.status();
    auto r = ckpt::Load(*dir, (*e)->state_view());
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE((*e)->Restore(r->counters).ok());
    Train(**e, 4, 8);
    ExpectBitIdentical(Params(**e, kModel.size()), want, std::string("resumed into ") + std::string(OffloadTargetName(target)));
    ExpectBitIdentical(State(**e), want_state, std::string("state resumed into ") + std::string(OffloadTargetName(target)));
  }
  // And an in-memory checkpoint loads into NVMe-resident state (the reverse direction).
  auto mem = Make(Config(2, T::kNone, T::kNone), kModel, DType::kBF16, InitFn());
  ASSERT_TRUE(mem.ok());
  Train(**mem, 0, 3);
  const std::string root2 = (dir_ / "ckpt2").string();
  {
    auto ck = ckpt::Checkpointer::Create(comm_.get(), &device_, {.root = root2});
    ASSERT_TRUE(ck.ok());
    ASSERT_TRUE((*ck)->SaveAsync((*mem)->state_view()).ok());
    ASSERT_TRUE((*ck)->Wait().ok());
  }
  auto dir2 = ckpt::FindLatestComplete(root2);
  ASSERT_TRUE(dir2.ok());
  auto e = Make(Config(2, T::kNvme, T::kNone, "reverse"), kModel, DType::kBF16, InitFn());
  ASSERT_TRUE(e.ok());
  auto r = ckpt::Load(*dir2, (*e)->state_view());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE((*e)->Restore(r->counters).ok());
  ExpectBitIdentical(State(**e), State(**mem), "in-memory checkpoint into nvme");
  ExpectBitIdentical(Params(**e, kModel.size()), Params(**mem, kModel.size()), "in-memory checkpoint into nvme: params");
}

// A save of NVMe state rides on the next step: SaveAsync reads nothing (the writer waits for the
// state), the step hands every sub-group over before Adam changes it (chunks of 3072 elements
// straddle sub-groups of 4096), and the checkpoint holds exactly the state SaveAsync was given. The
// other ways a step can come: a Wait first (delivered at once), a load first (the save gets the state
// as it was), the Checkpointer destroyed first (the save is abandoned, the step is unaffected, the
// previous checkpoint stays), and the writer failing on one rank mid-step (the step goes on; every
// rank's Wait fails; the previous checkpoint stays; the next save works).
TEST_F(OffloadTest, ASaveOfNvmeStateIsHandedOverByTheNextStep) {
  using T = OffloadTarget;
  std::vector<ParamDef> model = kModel;
  model.push_back({"big", {50001}, "g3"});
  const std::string root = (dir_ / "ckpt").string();
  auto e = Make(Config(3, T::kNvme, T::kNvme), model, DType::kBF16, InitFn());
  ASSERT_TRUE(e.ok()) << e.status();
  auto train = [&](ZeroEngine& en, int from, int to) {
    for (int step = from; step < to; ++step) {
      Backward(en, model.size(), [&](int64_t p, int64_t i, float v) { return v - Target(rank(), p, i) + 0.01f * static_cast<float>(step); });
      auto r = en.Step();
      ASSERT_TRUE(r.ok()) << r.status();
    }
  };
  // Loads the newest checkpoint into a fresh in-memory engine: its state.
  auto saved_state = [&](const std::string& tag) {
    auto fresh = Make(Config(3, T::kNone, T::kNone, tag), model, DType::kBF16, InitFn());
    EXPECT_TRUE(fresh.ok()) << fresh.status();
    auto dir = ckpt::FindLatestComplete(root);
    EXPECT_TRUE(dir.ok()) << dir.status();
    auto r = ckpt::Load(*dir, (*fresh)->state_view());
    EXPECT_TRUE(r.ok()) << r.status();
    return std::make_pair(State(**fresh), r.ok() ? r->counters.step : -1);
  };
  testing::FnIoHooks hooks;
  std::atomic<int> fail_writes{-1};  // the rank whose checkpoint writes fail
  hooks.transfer = [&](bool write, const std::string& path, int64_t, size_t*) {
    return write && rank() == fail_writes.load() && path.find("rank-") != std::string::npos ? EIO : 0;
  };
  auto make_ck = [&] {
    auto ck = ckpt::internal::CheckpointerTesting::Create(comm_.get(), &device_, {.root = root, .chunk_elements = 3072}, &hooks);
    EXPECT_TRUE(ck.ok()) << ck.status();
    return std::move(*ck);
  };
  train(**e, 0, 3);

  // 1. Deferred to the next step.
  auto ck = make_ck();
  auto before = State(**e);
  ASSERT_TRUE(ck->SaveAsync((*e)->state_view()).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  { Status p = ck->Poll(); ASSERT_TRUE(p.ok()) << p; }
  EXPECT_TRUE(ck->in_flight()) << "the save cannot be written before the step hands the state over";
  train(**e, 3, 4);
  for (int i = 0; i < 4000 && ck->in_flight(); ++i) {  // up to 20 s on a loaded machine
    ASSERT_TRUE(ck->Poll().ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_FALSE(ck->in_flight()) << "committed by a Poll after the step";
  auto [got, step] = saved_state("check1");
  EXPECT_EQ(step, 3);
  ExpectBitIdentical(got, before, "the state SaveAsync was given");

  // 2. Wait before any step: delivered at once.
  before = State(**e);
  ASSERT_TRUE(ck->SaveAsync((*e)->state_view()).ok());
  ASSERT_TRUE(ck->Wait().ok());
  std::tie(got, step) = saved_state("check2");
  EXPECT_EQ(step, 4);
  ExpectBitIdentical(got, before, "delivered by Wait");

  // 3. A load before the step: the save gets the state as it was, the engine the loaded one.
  train(**e, 4, 5);
  before = State(**e);
  ASSERT_TRUE(ck->SaveAsync((*e)->state_view()).ok());
  {
    auto dir = ckpt::FindLatestComplete(root);  // step 4's
    ASSERT_TRUE(dir.ok());
    auto r = ckpt::Load(*dir, (*e)->state_view());
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE((*e)->Restore(r->counters).ok());
  }
  ASSERT_TRUE(ck->Wait().ok());
  std::tie(got, step) = saved_state("check3");
  EXPECT_EQ(step, 5);
  ExpectBitIdentical(got, before, "a load came before the step");
  train(**e, 4, 5);
  ExpectBitIdentical(State(**e), before, "the engine went on from the loaded state");

  // 4. The Checkpointer destroyed while its save (of step 6) waits for the step: abandoned; step 5
  // stays the newest.
  const auto at5 = before;
  train(**e, 5, 6);
  ASSERT_TRUE(ck->SaveAsync((*e)->state_view()).ok());
  ck.reset();
  train(**e, 6, 7);
  ck = make_ck();  // removes the abandoned .tmp directory
  std::tie(got, step) = saved_state("check4");
  EXPECT_EQ(step, 5);
  ExpectBitIdentical(got, at5, "the previous checkpoint after an abandoned save");
  EXPECT_EQ(std::distance(fs::directory_iterator(root), fs::directory_iterator()), 4) << "step-3, -4, -5 and latest only";

  // 5. The writer fails on one rank while the step hands the state over: the step is unaffected,
  // every rank's Wait fails, the previous checkpoint stays, the next save works.
  fail_writes = size() - 1;
  ASSERT_TRUE(ck->SaveAsync((*e)->state_view()).ok());
  train(**e, 7, 8);
  Status w = ck->Wait();
  EXPECT_FALSE(w.ok()) << "a failed write on rank " << size() - 1 << " fails the save everywhere";
  std::tie(got, step) = saved_state("check5");
  EXPECT_EQ(step, 5);
  fail_writes = -1;
  before = State(**e);
  ASSERT_TRUE(ck->SaveAsync((*e)->state_view()).ok());
  train(**e, 8, 9);
  ASSERT_TRUE(ck->Wait().ok());
  std::tie(got, step) = saved_state("check6");
  EXPECT_EQ(step, 8);
  ExpectBitIdentical(got, before, "the save after a failed one");

  // 6. The engine destroyed while a save waits for its state: every rank's Wait fails, no hang.
  ASSERT_TRUE(ck->SaveAsync((*e)->state_view()).ok());
  e->reset();
  EXPECT_FALSE(ck->Wait().ok());
  std::tie(got, step) = saved_state("check7");
  EXPECT_EQ(step, 8);
}

// The GPU data paths on CPU ranks: an engine on memory the host may not address (CpuDevice(false), as a
// CudaDevice) initialises through host staging, reduces, clips and steps through Compute, copies
// gradients down and parameters up around a CPU Adam on offloaded state, and exposes device state to
// checkpoints through copies; all of it bit-identical to the host engine, and checkpoints of device
// state load into host state and back.
TEST_F(OffloadTest, DeviceMemoryPathsAreBitIdentical) {
  using T = OffloadTarget;
  CpuDevice gpu_like(/*host_accessible=*/false);
  struct Case {
    int stage;
    T optimizer, params;
    DType dtype;
  };
  const Case cases[] = {
      {0, T::kNone, T::kNone, DType::kBF16}, {1, T::kNone, T::kNone, DType::kF32},  {2, T::kNone, T::kNone, DType::kF16},
      {3, T::kNone, T::kNone, DType::kBF16}, {2, T::kHost, T::kNone, DType::kBF16}, {1, T::kNvme, T::kNone, DType::kF32},
      {3, T::kNvme, T::kNone, DType::kBF16}, {3, T::kHost, T::kHost, DType::kBF16}, {3, T::kNvme, T::kNvme, DType::kBF16},
  };
  for (const Case& c : cases) {
    const std::string what = "device memory, stage " + std::to_string(c.stage) + " optimizer " +
                             std::string(OffloadTargetName(c.optimizer)) + " params " + std::string(OffloadTargetName(c.params)) +
                             " " + std::string(DTypeName(c.dtype));
    auto a = Make(Config(c.stage, T::kNone, T::kNone), kModel, c.dtype, InitFn());
    ASSERT_TRUE(a.ok()) << a.status();
    auto b = Make(Config(c.stage, c.optimizer, c.params), kModel, c.dtype, InitFn(), &gpu_like);
    ASSERT_TRUE(b.ok()) << what << ": " << b.status();
    Train(**a, 0, 6);
    Train(**b, 0, 6);
    ExpectBitIdentical(Params(**a, kModel.size()), Params(**b, kModel.size()), what + ": parameters");
    ExpectBitIdentical(State(**a), State(**b), what + ": optimizer state");
    if (c.optimizer == T::kNone) {
      for (const StateGroup& g : (*b)->state_view().groups) {
        for (const StateBuffer& sb : g.buffers) EXPECT_TRUE(sb.data == nullptr) << what << ": " << sb.kind;  // device memory: through the owner
      }
    }
  }

  // Checkpoints: device state -> host state, and host state -> device state, both resume exactly.
  auto dev = Make(Config(2, T::kNone, T::kNone), kModel, DType::kBF16, InitFn(), &gpu_like);
  ASSERT_TRUE(dev.ok()) << dev.status();
  Train(**dev, 0, 3);
  const std::string root = (dir_ / "ckpt-device").string();
  {
    auto ck = ckpt::Checkpointer::Create(comm_.get(), &device_, {.root = root});
    ASSERT_TRUE(ck.ok()) << ck.status();
    ASSERT_TRUE((*ck)->SaveAsync((*dev)->state_view()).ok());
    Train(**dev, 3, 4);  // training goes on while the save is written: the snapshot is already taken
    ASSERT_TRUE((*ck)->Wait().ok());
  }
  auto dir = ckpt::FindLatestComplete(root);
  ASSERT_TRUE(dir.ok()) << dir.status();
  for (Device* target : {static_cast<Device*>(&device_), static_cast<Device*>(&gpu_like)}) {
    auto e = Make(Config(3, T::kNone, T::kNone), kModel, DType::kBF16, [](int64_t, int64_t, int64_t n, float* out) {
      std::fill(out, out + n, 7.0f);
    }, target);
    ASSERT_TRUE(e.ok()) << e.status();
    auto r = ckpt::Load(*dir, (*e)->state_view());
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE((*e)->Restore(r->counters).ok());
    Train(**e, 3, 4);
    ExpectBitIdentical(Params(**e, kModel.size()), Params(**dev, kModel.size()), "resumed from device state on " + target->name());
    // A stage-3 engine holds other shards than the stage-2 one: compare parameters only.
  }
  // The staging device of a checkpointer must be host memory.
  auto bad = ckpt::Checkpointer::Create(comm_.get(), &gpu_like, {.root = root});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("not host memory"), std::string::npos) << bad.status();
}

TEST_F(OffloadTest, BadInputIsAClearErrorOnEveryRankAndChangesNothing) {
  using T = OffloadTarget;
  {  // a missing directory: named
    EngineConfig c = Config(2, T::kNvme, T::kNone);
    c.offload.nvme_dir = (dir_ / "no-such-dir").string();
    auto e = Make(c, kModel, DType::kBF16, InitFn());
    ASSERT_FALSE(e.ok());
    EXPECT_NE(e.status().message().find(c.offload.nvme_dir), std::string::npos) << e.status();
  }
  {  // a budget too small for one sub-group: the settings are named
    EngineConfig c = Config(2, T::kNvme, T::kNone);
    c.offload.host_budget_bytes = 64 << 10;
    auto e = Make(c, kModel, DType::kBF16, InitFn());
    ASSERT_FALSE(e.ok());
    EXPECT_NE(e.status().message().find("offload.host_budget_bytes"), std::string::npos) << e.status();
    EXPECT_NE(e.status().message().find("offload.sub_group_elements"), std::string::npos) << e.status();
  }
  {  // combinations that cannot work
    auto e1 = ZeroEngine::Create(comm_.get(), &device_, Config(2, T::kNone, T::kHost));
    ASSERT_FALSE(e1.ok());
    EXPECT_NE(e1.status().message().find("needs stage 3"), std::string::npos) << e1.status();
    auto e2 = ZeroEngine::Create(comm_.get(), &device_, Config(3, T::kHost, T::kNvme));
    ASSERT_FALSE(e2.ok());
    EXPECT_NE(e2.status().message().find("offload.optimizer = nvme"), std::string::npos) << e2.status();
    EngineConfig c = Config(3, T::kNvme, T::kNone);
    c.offload.nvme_dir.clear();
    auto e3 = ZeroEngine::Create(comm_.get(), &device_, c);
    ASSERT_FALSE(e3.ok());
    EXPECT_NE(e3.status().message().find("offload.nvme_dir"), std::string::npos) << e3.status();
  }
  // Files removed underneath: on the last rank only, then on every rank. Every rank's step fails
  // (naming the file, or the rank that has the problem) and nothing changes.
  for (bool everywhere : {false, true}) {
    const std::string sub = everywhere ? "all" : "one";
    auto e = Make(Config(3, T::kNvme, T::kNvme, sub), kModel, DType::kBF16, InitFn());
    ASSERT_TRUE(e.ok()) << e.status();
    Train(**e, 0, 2);
    const auto before = Params(**e, kModel.size());
    const auto state_before = State(**e);
    const fs::path victim = dir_ / sub / ("zrt-swap.rank" + std::to_string(rank())) / "0.exp_avg.swp";
    const bool mine = everywhere || rank() == size() - 1;
    if (mine) fs::remove(victim);
    Backward(**e, kModel.size(), [&](int64_t p, int64_t i, float v) { return v - Target(rank(), p, i); });
    auto r = (*e)->Step();
    ASSERT_FALSE(r.ok());
    if (mine) {
      EXPECT_NE(r.status().message().find(victim.string()), std::string::npos) << r.status();
    } else {
      EXPECT_NE(r.status().message().find("failed on rank " + std::to_string(size() - 1)), std::string::npos) << r.status();
    }
    EXPECT_NE(r.status().message().find("nothing was updated"), std::string::npos) << r.status();
    ExpectBitIdentical(Params(**e, kModel.size()), before, "parameters after a failed step");
    if (!mine) ExpectBitIdentical(State(**e), state_before, "state after a failed step");
  }
}

}  // namespace
}  // namespace zrt
