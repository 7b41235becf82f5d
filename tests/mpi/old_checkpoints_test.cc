// Checkpoints written by an earlier zrt load bit for bit (CHANGELOG: "checkpoints written by any
// earlier version keep loading"). tests/fixtures/checkpoints/<precision>/ holds one checkpoint per
// state precision, written by 2 ranks at stage 3 after 3 steps of a small bf16 model, with the hash
// of every tensor's master, exp_avg and exp_avg_sq values as the writer's engine held them
// (expected.json). Each is loaded here at 1-4 ranks and stages 0-3 into an engine of that
// precision and must give back exactly those values and the step.
//
// Writing the fixtures (with the version whose files they preserve; they are never rewritten):
//   ZRT_WRITE_FIXTURES=<dir> mpirun -n 2 zrt_old_checkpoints_mpi_test
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tests/support/scratch_root.h"
#include "zrt/checkpoint/checkpointer.h"
#include "zrt/checkpoint/load.h"
#include "zrt/core/mpi_communicator.h"
#include "zrt/runtime/engine.h"
#include "zrt/runtime/full_state.h"

namespace zrt {
namespace {

namespace fs = std::filesystem;

// Sizes no world size divides, a tensor smaller than a q8 block, an f32-state embedding group.
const std::vector<std::tuple<std::string, std::vector<int64_t>, std::string>> kModel = {
    {"embed", {13, 11}, "embed"}, {"w1", {301}, "g1"}, {"b1", {3}, "g1"}, {"w2", {2600}, "g2"}, {"tiny", {1}, "g2"}};
constexpr int64_t kSteps = 3;

struct Fixture {
  const char* dir;
  StatePrecision state;
};
// kernels::MomentFormat with 0.1's kBf16: the names a trainer of the fixtures' version wrote.
const Fixture kFixtures[] = {
    {"f32", {}},
    {"bf16", {kernels::MomentFormat::kBf16, kernels::MomentFormat::kBf16, true, 256}},
    {"q8", {kernels::MomentFormat::kQ8, kernels::MomentFormat::kQ8, true, 64}},
    {"q8-no-master", {kernels::MomentFormat::kQ8, kernels::MomentFormat::kQ8, false, 64}},
};

uint64_t Fnv1a(const void* data, size_t bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < bytes; ++i) h = (h ^ static_cast<const unsigned char*>(data)[i]) * 0x100000001b3ull;
  return h;
}

CpuDevice device;

Result<std::unique_ptr<ZeroEngine>> Make(Communicator* comm, int stage, const StatePrecision& state) {
  EngineConfig cfg;
  cfg.stage = stage;
  cfg.bucket_bytes = 4096;
  cfg.alignment = 8;
  cfg.adam.lr = 1e-2;
  cfg.adam.weight_decay = 0.01;
  cfg.state = state;
  ASSIGN_OR_RETURN(auto e, ZeroEngine::Create(comm, &device, cfg));
  for (const auto& [name, shape, group] : kModel) {
    ParamOptions o{.group = group};
    if (group == "embed") o.state = StatePrecision{};
    RETURN_IF_ERROR(e->AddParam(name, shape, DType::kBF16, o).status());
  }
  RETURN_IF_ERROR(e->Finalize([](int64_t p, int64_t off, int64_t n, float* out) {
    for (int64_t i = 0; i < n; ++i) out[i] = 0.3f * std::sin(0.7f * static_cast<float>(off + i) + static_cast<float>(p));
  }));
  return e;
}

// One step of a quadratic loss toward cos targets; every rank's gradient is the same.
Status Train(ZeroEngine& e, int64_t step) {
  for (int g = e.num_groups() - 1; g >= 0; --g) {
    RETURN_IF_ERROR(e.Gather(g).status());
    for (int64_t p = 0; p < static_cast<int64_t>(kModel.size()); ++p) {
      if (e.group({p}) != g) continue;
      ASSIGN_OR_RETURN(TensorView w, e.Param({p}));
      ASSIGN_OR_RETURN(TensorView gr, e.Grad({p}));
      for (int64_t i = 0; i < w.numel(); ++i) {
        StoreFromFloat(gr.data, i, gr.dtype, LoadAsFloat(w.data, i, w.dtype) - std::cos(0.01f * static_cast<float>(i + 31 * p + 7 * step)));
      }
    }
    RETURN_IF_ERROR(e.Release(g));
    RETURN_IF_ERROR(e.GradsReady(g));
  }
  return e.Step().status();
}

// "tensor/kind" -> the hash of its full f32 values, on rank 0 (empty elsewhere).
Result<std::map<std::string, std::string>> StateHashes(Communicator* comm, ZeroEngine& e) {
  std::map<std::string, std::string> out;
  FullStateOptions o;
  o.kinds = {"master", "exp_avg", "exp_avg_sq"};
  RETURN_IF_ERROR(ForEachFullTensor(comm, e.state_view(), o, [&](const TensorSpec& t, std::string_view kind, std::span<const float> v) {
    std::ostringstream hex;
    hex << std::hex << Fnv1a(v.data(), v.size_bytes());
    out[t.name + "/" + std::string(kind)] = hex.str();
    return Status();
  }));
  return out;
}

class OldCheckpointsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    comm_ = MpiCommunicator::Create(MPI_COMM_WORLD).value();
    root_ = testing::SharedScratchRoot(comm_.get(), "zrt_old_ckpt");
    ASSERT_FALSE(root_.empty());
  }
  void TearDown() override { ASSERT_TRUE(testing::RemoveSharedScratchRoot(comm_.get(), root_).ok()); }

  std::unique_ptr<MpiCommunicator> comm_;
  std::string root_;
};

TEST_F(OldCheckpointsTest, EveryPrecisionLoadsBitForBitAtAnyWorldSizeAndStage) {
  if (const char* out = std::getenv("ZRT_WRITE_FIXTURES")) {
    ASSERT_EQ(comm_->size(), 2) << "the fixtures are written by 2 ranks";
    for (const Fixture& f : kFixtures) {
      auto e = Make(comm_.get(), 3, f.state).value();
      for (int64_t s = 0; s < kSteps; ++s) ASSERT_TRUE(Train(*e, s).ok());
      ckpt::CheckpointOptions o;
      o.root = std::string(out) + "/" + f.dir;
      o.chunk_elements = 1024;  // several chunks in a shard of g2
      auto ck = ckpt::Checkpointer::Create(comm_.get(), &device, o).value();
      ASSERT_TRUE(ck->SaveAsync(e->state_view(), {{"fixture", f.dir}}).ok());
      ASSERT_TRUE(ck->Wait().ok());
      const auto hashes = StateHashes(comm_.get(), *e).value();
      if (comm_->rank() == 0) std::ofstream(o.root + "/expected.json") << nlohmann::json{{"step", kSteps}, {"state", hashes}}.dump(1) << "\n";
    }
    return;
  }
  for (const Fixture& f : kFixtures) {
    SCOPED_TRACE(f.dir);
    const fs::path from = fs::path(ZRT_FIXTURES_DIR) / "checkpoints" / f.dir;
    const auto expected = nlohmann::json::parse(std::ifstream(from / "expected.json"));
    // A private copy (the loader refuses directories other users may write; a checkout's modes vary).
    const fs::path dir = fs::path(root_) / f.dir;
    char step_dir[32];
    std::snprintf(step_dir, sizeof(step_dir), "step-%08lld", static_cast<long long>(kSteps));
    if (comm_->rank() == 0) {
      fs::create_directories(dir);
      fs::copy(from / step_dir, dir, fs::copy_options::recursive);
    }
    ASSERT_TRUE(comm_->Barrier().ok());
    for (const int stage : {0, 1, 2, 3}) {
      SCOPED_TRACE("stage " + std::to_string(stage));
      auto e = Make(comm_.get(), stage, f.state).value();
      auto r = ckpt::Load(dir.string(), e->state_view());
      ASSERT_TRUE(r.ok()) << r.status();
      ASSERT_TRUE(e->Restore(r->counters).ok());
      EXPECT_EQ(e->steps(), expected["step"].get<int64_t>());
      EXPECT_EQ(r->trainer_state.value("fixture", ""), f.dir);
      const auto got = StateHashes(comm_.get(), *e).value();
      if (comm_->rank() == 0) {
        EXPECT_EQ(nlohmann::json(got), expected["state"]);
      }
      ASSERT_TRUE(Train(*e, kSteps).ok()) << "and it trains on";
    }
  }
}

}  // namespace
}  // namespace zrt
