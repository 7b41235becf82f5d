// The engine on a GPU (CudaDevice + NcclCommunicator) against the CPU reference engine (CpuDevice +
// MPI) on the same model and gradients: bit-identical parameters at one rank (the fused CUDA Adam and
// casts are bit-exact with the CPU kernels; clipping is off because the two norms are summed in
// different orders), close at several; with optimizer/parameter offload to host and NVMe; and
// checkpoints of device state that resume on the CPU engine; the memory tier copying device state on
// its own thread while the GPU trains on. Skipped without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "zrt/checkpoint/checkpointer.h"
#include "zrt/checkpoint/catalog.h"
#include "zrt/checkpoint/load.h"
#include "zrt/offload/host_memory.h"
#include "zrt/runtime/engine.h"
#include "tests/gpu/nccl_fixture.h"
#include "tests/support/state_values.h"

namespace zrt {
namespace {

namespace fs = std::filesystem;

struct Def {
  std::string name;
  std::vector<int64_t> shape;
  std::string group;
};
const std::vector<Def> kModel = {{"embed", {37, 29}, "g0"}, {"w1", {100001}, "g1"}, {"b1", {3}, "g1"},
                                 {"w2", {40999}, "g2"},      {"tiny", {1}, "g2"}};

float Init(int64_t p, int64_t i) { return 0.5f * std::sin(0.1f * static_cast<float>(i) + static_cast<float>(p)); }
float Target(int rank, int64_t p, int64_t i) {
  return std::sin(0.37f * static_cast<float>(i) + static_cast<float>(rank) + 0.1f * static_cast<float>(p));
}

std::vector<char> Fetch(Device* d, const void* p, size_t bytes) {
  std::vector<char> h(bytes);
  EXPECT_TRUE(d->Copy(h.data(), p, bytes).ok());
  return h;
}

std::vector<std::vector<float>> StateNow(ZeroEngine& e) { return testing::ReadState(e.state_view()); }

class EngineGpuTest : public testing::NcclFixture {
 protected:
  void SetUp() override {
    NcclFixture::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    nccl_->set_check_args(false);
    int64_t id = ::getpid();
    ASSERT_TRUE(mpi_->Broadcast(&id, sizeof(id), DType::kBytes, 0).ok());
    dir_ = fs::temp_directory_path() / ("zrt_engine_gpu_" + std::to_string(id));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (nccl_ && mpi_->Barrier().ok() && mpi_->rank() == 0) fs::remove_all(dir_);
  }

  Result<std::unique_ptr<ZeroEngine>> Make(Communicator* comm, Device* dev, const EngineConfig& cfg, DType dtype,
                                           const ZeroEngine::InitFn& init) {
    ASSIGN_OR_RETURN(auto e, ZeroEngine::Create(comm, dev, cfg));
    for (const Def& p : kModel) RETURN_IF_ERROR(e->AddParam(p.name, p.shape, dtype, {.group = p.group}));
    RETURN_IF_ERROR(e->Finalize(init));
    return e;
  }
  static ZeroEngine::InitFn InitFn() {
    return [](int64_t p, int64_t off, int64_t n, float* out) {
      for (int64_t i = 0; i < n; ++i) out[i] = Init(p, off + i);
    };
  }
  static size_t Bytes(const TensorView& v) { return static_cast<size_t>(v.numel()) * DTypeSize(v.dtype); }

  // Backward of the quadratic loss: gradients computed on the host from the gathered parameters.
  void Train(ZeroEngine& e, Device* d, int from, int to) {
    for (int step = from; step < to; ++step) {
      for (int g = e.num_groups() - 1; g >= 0; --g) {
        ASSERT_TRUE(e.Gather(g).ok());
        for (size_t p = 0; p < kModel.size(); ++p) {
          const ParamHandle h{static_cast<int64_t>(p)};
          if (e.group(h) != g) continue;
          auto w = e.Param(h);
          auto gv = e.Grad(h);
          ASSERT_TRUE(w.ok() && gv.ok()) << w.status() << gv.status();
          std::vector<char> params = Fetch(d, w->data, Bytes(*w)), grads(Bytes(*gv), 0);
          for (int64_t i = 0; i < w->numel(); ++i) {
            const float v = LoadAsFloat(params.data(), i, w->dtype);
            StoreFromFloat(grads.data(), i, gv->dtype, v - Target(rank(), static_cast<int64_t>(p), i) + 0.01f * static_cast<float>(step));
          }
          ASSERT_TRUE(d->Copy(gv->data, grads.data(), grads.size()).ok());
        }
        ASSERT_TRUE(e.Release(g).ok());
        ASSERT_TRUE(e.GradsReady(g).ok());
      }
      auto r = e.Step();
      ASSERT_TRUE(r.ok()) << r.status();
      ASSERT_FALSE(r->skipped);
    }
  }

  std::vector<std::vector<char>> Params(ZeroEngine& e, Device* d) {
    std::vector<std::vector<char>> out;
    for (int g = 0; g < e.num_groups(); ++g) {
      EXPECT_TRUE(e.Gather(g).ok());
      std::vector<char> bytes;
      for (size_t p = 0; p < kModel.size(); ++p) {
        const ParamHandle h{static_cast<int64_t>(p)};
        if (e.group(h) != g) continue;
        auto w = e.Param(h);
        EXPECT_TRUE(w.ok()) << w.status();
        std::vector<char> t = Fetch(d, w->data, Bytes(*w));
        bytes.insert(bytes.end(), t.begin(), t.end());
      }
      out.push_back(std::move(bytes));
      EXPECT_TRUE(e.Release(g).ok());
    }
    return out;
  }

  void ExpectSame(const std::vector<std::vector<char>>& a, const std::vector<std::vector<char>>& b, DType t,
                  const std::string& what) {
    ASSERT_EQ(a.size(), b.size());
    for (size_t g = 0; g < a.size(); ++g) {
      ASSERT_EQ(a[g].size(), b[g].size());
      if (mpi_->size() == 1) {
        ASSERT_EQ(std::memcmp(a[g].data(), b[g].data(), a[g].size()), 0) << what << ": group " << g << " differs";
        continue;
      }
      for (size_t i = 0; i < a[g].size() / DTypeSize(t); ++i) {
        const float x = LoadAsFloat(a[g].data(), static_cast<int64_t>(i), t), y = LoadAsFloat(b[g].data(), static_cast<int64_t>(i), t);
        ASSERT_NEAR(x, y, 1e-2f * std::abs(x) + 1e-3f) << what << ": group " << g << " element " << i;
      }
    }
  }

  EngineConfig Config(int stage, OffloadTarget opt, OffloadTarget params) {
    EngineConfig c;
    c.stage = stage;
    c.bucket_bytes = 1 << 16;  // several buckets per step, groups spanning buckets
    c.adam.lr = 1e-2;
    c.adam.weight_decay = 0.01;
    c.offload.optimizer = opt;
    c.offload.params = params;
    c.offload.nvme_dir = dir_.string();
    c.offload.sub_group_elements = 8192;
    return c;
  }

  CpuDevice cpu_;
  fs::path dir_;
};

TEST_F(EngineGpuTest, MatchesTheCpuEngine) {
  using T = OffloadTarget;
  struct Case {
    int stage;
    T opt, params;
    DType dtype;
  };
  const Case cases[] = {{0, T::kNone, T::kNone, DType::kBF16}, {1, T::kNone, T::kNone, DType::kF32},
                        {2, T::kNone, T::kNone, DType::kF16},  {3, T::kNone, T::kNone, DType::kBF16},
                        {2, T::kHost, T::kNone, DType::kBF16}, {3, T::kHost, T::kHost, DType::kBF16},
                        {3, T::kNvme, T::kNvme, DType::kBF16}, {1, T::kNvme, T::kNone, DType::kF32}};
  for (const Case& c : cases) {
    const std::string what = "stage " + std::to_string(c.stage) + " optimizer " + std::string(OffloadTargetName(c.opt)) +
                             " params " + std::string(OffloadTargetName(c.params)) + " " + std::string(DTypeName(c.dtype));
    auto ref = Make(mpi_.get(), &cpu_, Config(c.stage, T::kNone, T::kNone), c.dtype, InitFn());
    ASSERT_TRUE(ref.ok()) << ref.status();
    auto gpu = Make(nccl_.get(), gpu_.get(), Config(c.stage, c.opt, c.params), c.dtype, InitFn());
    ASSERT_TRUE(gpu.ok()) << what << ": " << gpu.status();
    Train(**ref, &cpu_, 0, 5);
    Train(**gpu, gpu_.get(), 0, 5);
    ExpectSame(Params(**ref, &cpu_), Params(**gpu, gpu_.get()), c.dtype, what);
    if (c.opt == T::kNone) {
      EXPECT_GT((*gpu)->memory().current_of(MemCategory::kOptimizerState), 0) << what;
    }
  }
}

TEST_F(EngineGpuTest, CheckpointsOfDeviceStateResumeOnCpuAndGpu) {
  auto gpu = Make(nccl_.get(), gpu_.get(), Config(2, OffloadTarget::kNone, OffloadTarget::kNone), DType::kBF16, InitFn());
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  Train(**gpu, gpu_.get(), 0, 3);
  auto pinned = HostMemory::Create(0, "checkpoint staging");
  const std::string root = (dir_ / "ckpt").string();
  {
    auto ck = ckpt::Checkpointer::Create(mpi_.get(), pinned.get(), {.root = root});
    ASSERT_TRUE(ck.ok()) << ck.status();
    ASSERT_TRUE((*ck)->SaveAsync((*gpu)->state_view()).ok());
    Train(**gpu, gpu_.get(), 3, 4);  // the GPU trains on while the snapshot is written
    ASSERT_TRUE((*ck)->Wait().ok());
  }
  auto dir = ckpt::FindLatestComplete(root);
  ASSERT_TRUE(dir.ok()) << dir.status();
  // Resumed at stage 3 on the CPU engine and on a fresh GPU engine (the load writes device memory).
  for (bool on_gpu : {false, true}) {
    Communicator* comm = on_gpu ? static_cast<Communicator*>(nccl_.get()) : mpi_.get();
    Device* dev = on_gpu ? static_cast<Device*>(gpu_.get()) : &cpu_;
    auto e = Make(comm, dev, Config(3, OffloadTarget::kNone, OffloadTarget::kNone), DType::kBF16,
                  [](int64_t, int64_t, int64_t n, float* out) { std::fill(out, out + n, 9.0f); });
    ASSERT_TRUE(e.ok()) << e.status();
    auto r = ckpt::Load(*dir, (*e)->state_view());
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE((*e)->Restore(r->counters).ok());
    Train(**e, dev, 3, 4);
    ExpectSame(Params(**gpu, gpu_.get()), Params(**e, dev), DType::kBF16, on_gpu ? "resumed on the gpu" : "resumed on the cpu");
  }
}

// The memory tier copies device state on its own thread (the snapshot stream) while the GPU trains
// on: the next Step waits at the view's hold before its Adam changes the state. The snapshot is the
// state at the save, and a fresh GPU engine resumes it.
TEST_F(EngineGpuTest, MemoryTierCopiesDeviceStateInTheBackground) {
  auto gpu = Make(nccl_.get(), gpu_.get(), Config(2, OffloadTarget::kNone, OffloadTarget::kNone), DType::kBF16, InitFn());
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  Train(**gpu, gpu_.get(), 0, 3);
  const auto saved = StateNow(**gpu);
  auto pinned = HostMemory::Create(0, "checkpoint staging");
  ckpt::MemoryTierOptions tier;
  tier.dir = (dir_ / "shm").string();
  tier.ranks_per_node = 1;
  fs::create_directories(tier.dir);
  const std::string root = (dir_ / "ckpt").string();
  {
    auto ck = ckpt::Checkpointer::Create(mpi_.get(), pinned.get(), {.root = root, .memory = tier});
    ASSERT_TRUE(ck.ok()) << ck.status();
    ASSERT_TRUE((*ck)->SaveToMemory((*gpu)->state_view()).ok());
    Train(**gpu, gpu_.get(), 3, 4);
    EXPECT_NE(StateNow(**gpu), saved);
    Status w = (*ck)->Wait();
    ASSERT_TRUE(w.ok()) << w;
    EXPECT_EQ((*ck)->memory_stats()->step, 3);
  }  // the tier keeps step 3 (no disk checkpoint)
  ASSERT_TRUE(mpi_->Barrier().ok());
  auto e = Make(nccl_.get(), gpu_.get(), Config(2, OffloadTarget::kNone, OffloadTarget::kNone), DType::kBF16,
                [](int64_t, int64_t, int64_t n, float* out) { std::fill(out, out + n, 9.0f); });
  ASSERT_TRUE(e.ok()) << e.status();
  auto ck = ckpt::Checkpointer::Create(mpi_.get(), pinned.get(), {.root = root, .memory = tier});
  ASSERT_TRUE(ck.ok()) << ck.status();
  auto r = (*ck)->Resume((*e)->state_view());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->step, 3);
  EXPECT_EQ(r->source, "memory");
  EXPECT_TRUE(StateNow(**e) == saved) << "rank " << rank() << ": the snapshot is not the state saved";
}

TEST_F(EngineGpuTest, MpiOnDeviceMemoryIsRefused) {
  auto e = ZeroEngine::Create(mpi_.get(), gpu_.get(), Config(2, OffloadTarget::kNone, OffloadTarget::kNone));
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("NcclCommunicator"), std::string::npos) << e.status();
}

}  // namespace
}  // namespace zrt
