// Checkpoints at 1..4 ranks: resume is bit-exact at every stage; any N -> M reshard (N, M in 1..world,
// different stages) preserves every byte of state; corruption is detected and named, and the newest
// complete checkpoint is found instead; a failing write or rename leaves the previous checkpoint
// intact; retention; leftovers of dead saves are cleaned.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "zrt/checkpoint/catalog.h"
#include "zrt/checkpoint/checkpointer.h"
#include "zrt/checkpoint/files.h"
#include "zrt/checkpoint/load.h"
#include "zrt/core/mpi_communicator.h"
#include "zrt/runtime/engine.h"
#include "tests/support/checkpointer_testing.h"
#include "tests/support/io_hooks.h"
#include "tests/support/reference.h"

namespace zrt::ckpt {
namespace {

namespace fs = std::filesystem;

const std::vector<std::tuple<std::string, std::vector<int64_t>, std::string>> kModel = {
    {"embed", {37, 29}, "g0"}, {"w1", {1001}, "g1"}, {"b1", {3}, "g1"}, {"w2", {4099}, "g2"}, {"tiny", {1}, "g2"}};

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto c = MpiCommunicator::Create(MPI_COMM_WORLD);
    ASSERT_TRUE(c.ok());
    comm_ = std::move(*c);
    char path[512] = {};
    if (comm_->rank() == 0) {
      const std::string p = (fs::temp_directory_path() / ("zrt_ckpt_" + std::to_string(::getpid()) + "_" +
                                                          ::testing::UnitTest::GetInstance()->current_test_info()->name())).string();
      fs::remove_all(p);
      std::snprintf(path, sizeof(path), "%s", p.c_str());
    }
    ASSERT_TRUE(comm_->Broadcast(path, sizeof(path), DType::kBytes, 0).ok());
    root_ = path;
  }
  void TearDown() override {
    ASSERT_TRUE(comm_->Barrier().ok());
    if (comm_->rank() == 0) fs::remove_all(root_);
  }
  int rank() const { return comm_->rank(); }
  int size() const { return comm_->size(); }

  std::unique_ptr<ZeroEngine> MakeEngine(Communicator* comm, int stage, bool amsgrad = false) {
    EngineConfig cfg;
    cfg.stage = stage;
    cfg.bucket_bytes = 8192;
    cfg.alignment = stage == 2 ? 8 : 4;  // alignment may differ between save and load
    cfg.adam.lr = 1e-2;
    cfg.adam.amsgrad = amsgrad;
    cfg.loss_scale.mode = LossScaleMode::kDynamic;
    cfg.loss_scale.init_scale = 256;
    auto e = ZeroEngine::Create(comm, &device_, cfg);
    EXPECT_TRUE(e.ok()) << e.status();
    for (const auto& [name, shape, group] : kModel) EXPECT_TRUE((*e)->AddParam(name, shape, DType::kF32, {.group = group}).ok());
    EXPECT_TRUE((*e)->Finalize([](int64_t p, int64_t off, int64_t n, float* out) {
      for (int64_t i = 0; i < n; ++i) out[i] = 0.3f * std::sin(0.7f * static_cast<float>(off + i) + static_cast<float>(p));
    }).ok());
    return std::move(*e);
  }

  // One deterministic step: every rank's gradient depends on the step only (any world size agrees).
  static void Train(ZeroEngine& e, int64_t step) {
    for (int g = e.num_groups() - 1; g >= 0; --g) {
      ASSERT_TRUE(e.Gather(g).ok());
      for (int64_t p = 0; p < static_cast<int64_t>(kModel.size()); ++p) {
        if (e.group({p}) != g) continue;
        std::span<const float> w = e.Param({p}).value().as<float>();
        std::span<float> grad = e.Grad({p}).value().as<float>();
        for (size_t i = 0; i < w.size(); ++i) grad[i] = 256.0f * (w[i] - std::cos(0.01f * static_cast<float>(static_cast<int64_t>(i) + 31 * p + 7 * step)));
      }
      ASSERT_TRUE(e.Release(g).ok());
      ASSERT_TRUE(e.GradsReady(g).ok());
    }
    auto r = e.Step();
    ASSERT_TRUE(r.ok()) << r.status();
  }

  static std::vector<float> FullParams(ZeroEngine& e) {
    std::vector<float> out;
    for (int g = 0; g < e.num_groups(); ++g) {
      EXPECT_TRUE(e.Gather(g).ok());
      for (int64_t p = 0; p < static_cast<int64_t>(kModel.size()); ++p) {
        if (e.group({p}) != g) continue;
        std::span<const float> w = e.Param({p}).value().as<float>();
        out.insert(out.end(), w.begin(), w.end());
      }
      EXPECT_TRUE(e.Release(g).ok());
    }
    return out;
  }

  std::unique_ptr<Checkpointer> MakeCheckpointer(Communicator* comm, CheckpointOptions o = {}, IoHooks* hooks = nullptr) {
    o.root = root_ + (o.root.empty() ? "" : "/" + o.root);
    o.chunk_elements = 1024;  // many chunks: partial reads and chunk boundaries get exercised
    auto c = internal::CheckpointerTesting::Create(comm, &device_, o, hooks);
    EXPECT_TRUE(c.ok()) << c.status();
    return std::move(*c);
  }

  // Loads dir into the engine and restores counters.
  static void LoadInto(ZeroEngine& e, const std::string& dir, bool params_only = false) {
    LoadOptions lo;
    lo.params_only = params_only;
    auto r = Load(dir, e.state_view(), lo);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(e.Restore(params_only ? StateCounters{} : r->counters).ok());
  }

  CpuDevice device_;
  std::unique_ptr<MpiCommunicator> comm_;
  std::string root_;
};

TEST_F(CheckpointTest, ResumeIsBitExactAtEveryStage) {
  for (int stage = 0; stage <= 3; ++stage) {
    for (Codec codec : {Codec::kRaw, Codec::kByteGroupZstd}) {
      SCOPED_TRACE("stage " + std::to_string(stage) + " codec " + std::string(CodecName(codec)));
      auto e = MakeEngine(comm_.get(), stage, stage == 1);
      CheckpointOptions o;
      o.root = "s" + std::to_string(stage) + std::string(CodecName(codec));
      o.compression.codec = codec;
      o.writer_threads = codec == Codec::kRaw ? 1 : 3;  // compressed chunks encoded on 3 threads
      auto ck = MakeCheckpointer(comm_.get(), o);
      for (int s = 1; s <= 3; ++s) Train(*e, s);
      ASSERT_TRUE(ck->SaveAsync(e->state_view(), {{"data_position", 3000}, {"rng", "seed-42"}}).ok());
      Train(*e, 4);  // training goes on while the save is written
      Train(*e, 5);
      ASSERT_TRUE(ck->Wait().ok());
      EXPECT_GE(ck->last_stats().stall_seconds, 0.0);
      const auto want = FullParams(*e);
      const double scale = e->loss_scale();

      auto dir = FindLatestComplete(root_ + "/" + o.root);
      ASSERT_TRUE(dir.ok()) << dir.status();
      EXPECT_EQ(fs::path(*dir).filename(), "step-00000003");
      auto e2 = MakeEngine(comm_.get(), stage, stage == 1);
      auto r = Load(*dir, e2->state_view());
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->trainer_state["data_position"], 3000);
      EXPECT_EQ(r->trainer_state["rng"], "seed-42");
      ASSERT_TRUE(e2->Restore(r->counters).ok());
      EXPECT_EQ(e2->steps(), 3);
      Train(*e2, 4);
      Train(*e2, 5);
      const auto got = FullParams(*e2);
      ASSERT_EQ(got.size(), want.size());
      EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * 4)) << "resumed run differs";
      EXPECT_EQ(e2->loss_scale(), scale);
    }
  }
}

TEST_F(CheckpointTest, ReshardFromAnyNToAnyMKeepsEveryByte) {
  // Save with the first K ranks at stage (K-1)%4; load with the first M ranks at stage (M+1)%4 and
  // save again; then rank 0 alone loads both at stage 0 (the full state) and compares every buffer.
  for (int k = 1; k <= size(); ++k) {
    auto sub = comm_->Split(rank() < k ? 0 : -1, rank());
    ASSERT_TRUE(sub.ok());
    if (*sub) {
      auto e = MakeEngine(sub->get(), (k - 1) % 4, true);
      for (int s = 1; s <= 3; ++s) Train(*e, s);
      CheckpointOptions o;
      o.root = "orig" + std::to_string(k);
      auto ck = MakeCheckpointer(sub->get(), o);
      ASSERT_TRUE(ck->SaveAsync(e->state_view(), {{"k", k}}).ok());
      ASSERT_TRUE(ck->Wait().ok());
    }
    ASSERT_TRUE(comm_->Barrier().ok());
    for (int m = 1; m <= size(); ++m) {
      auto msub = comm_->Split(rank() < m ? 0 : -1, rank());
      ASSERT_TRUE(msub.ok());
      if (*msub) {
        auto e = MakeEngine(msub->get(), (m + 1) % 4, true);
        LoadInto(*e, root_ + "/orig" + std::to_string(k) + "/step-00000003");
        CheckpointOptions o;
        o.root = "re" + std::to_string(k) + "_" + std::to_string(m);
        auto ck = MakeCheckpointer(msub->get(), o);
        ASSERT_TRUE(ck->SaveAsync(e->state_view(), {}).ok());
        ASSERT_TRUE(ck->Wait().ok());
      }
      ASSERT_TRUE(comm_->Barrier().ok());
    }
  }
  auto self = comm_->Split(rank() == 0 ? 0 : -1, 0);
  ASSERT_TRUE(self.ok());
  if (!*self) return;
  auto full_state = [&](const std::string& dir) {
    auto e = MakeEngine(self->get(), 0, true);
    LoadInto(*e, dir);
    std::vector<float> all;
    for (const StateGroup& g : e->state_view().groups) {
      for (const StateBuffer& b : g.buffers) all.insert(all.end(), static_cast<float*>(b.data), static_cast<float*>(b.data) + b.count);
    }
    return all;
  };
  for (int k = 1; k <= size(); ++k) {
    const auto want = full_state(root_ + "/orig" + std::to_string(k) + "/step-00000003");
    for (int m = 1; m <= size(); ++m) {
      const auto got = full_state(root_ + "/re" + std::to_string(k) + "_" + std::to_string(m) + "/step-00000003");
      ASSERT_EQ(got.size(), want.size());
      EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * 4)) << k << " -> " << m << " ranks changed the state";
    }
  }
  // Parameters only: moments start at zero.
  auto e = MakeEngine(self->get(), 0, true);
  LoadInto(*e, root_ + "/orig" + std::to_string(size()) + "/step-00000003", /*params_only=*/true);
  for (const StateGroup& g : e->state_view().groups) {
    for (const StateBuffer& b : g.buffers) {
      if (b.kind == "master") continue;
      for (int64_t i = 0; i < b.count; ++i) ASSERT_EQ(static_cast<float*>(b.data)[i], 0.0f) << b.kind;
    }
  }
}

TEST_F(CheckpointTest, CorruptionIsNamedAndTheNewestGoodOneIsFound) {
  auto e = MakeEngine(comm_.get(), 3);
  auto ck = MakeCheckpointer(comm_.get());
  for (int s = 1; s <= 4; ++s) {
    Train(*e, s);
    if (s % 2 == 0) {
      ASSERT_TRUE(ck->SaveAsync(e->state_view()).ok());
      ASSERT_TRUE(ck->Wait().ok());
    }
  }
  ASSERT_TRUE(comm_->Barrier().ok());
  if (rank() == 0) {
    const std::string good = root_ + "/step-00000002", dir = root_ + "/step-00000004";
    ASSERT_EQ(*FindLatestComplete(root_, VerifyLevel::kFull), dir);
    const std::string data = dir + "/" + DataFileName(size() - 1);
    auto corrupt = [&](auto&& damage, auto&& undo, VerifyLevel level, const char* what) {
      damage();
      auto found = FindLatestComplete(root_, level);
      ASSERT_TRUE(found.ok()) << found.status();
      EXPECT_EQ(*found, good) << what << ": the newest good checkpoint must be chosen";
      std::vector<std::string> problems;
      ASSERT_TRUE(CheckComplete(dir, level, &problems).ok());
      EXPECT_FALSE(problems.empty()) << what;
      if (!problems.empty()) std::printf("  %s -> %s\n", what, problems.front().c_str());
      undo();
      ASSERT_EQ(*FindLatestComplete(root_, VerifyLevel::kFull), dir) << what;
    };
    // Flip one byte in the middle of the data file.
    std::string saved_data;
    {
      std::ifstream in(data, std::ios::binary);
      saved_data.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    auto write_data = [&](const std::string& bytes) {
      std::ofstream(data, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    };
    // A byte inside a chunk in the middle of the file, and one in the padding between chunks.
    auto cd = CheckpointDir::Open(dir);
    auto m = ReadManifest(dir);
    ASSERT_TRUE(cd.ok() && m.ok());
    auto idx = ReadIndex(*cd, *m, *SavedLayouts(*m), size() - 1);
    ASSERT_TRUE(idx.ok()) << idx.status();
    const ChunkEntry& mid = idx->chunks[idx->chunks.size() / 2];
    const size_t in_chunk = static_cast<size_t>(mid.file_offset + mid.stored_bytes / 2);
    corrupt([&] {
      std::string d = saved_data;
      d[in_chunk] ^= 0x10;
      write_data(d);
    }, [&] { write_data(saved_data); }, VerifyLevel::kFull, "flipped byte in a chunk");
    for (size_t k = 0; k + 1 < idx->chunks.size(); ++k) {
      const int64_t end = idx->chunks[k].file_offset + idx->chunks[k].stored_bytes;
      if (idx->chunks[k + 1].file_offset > end) {
        corrupt([&] {
          std::string d = saved_data;
          d[static_cast<size_t>(end)] = 'x';
          write_data(d);
        }, [&] { write_data(saved_data); }, VerifyLevel::kFull, "flipped byte in padding");
        break;
      }
    }
    // Loading the corrupt data names the file, chunk and tensors.
    {
      std::string d = saved_data;
      d[in_chunk] ^= 0x10;
      write_data(d);
      auto self = MpiCommunicator::Create(MPI_COMM_SELF);  // rank 0 alone: no collective on comm_
      auto e1 = MakeEngine(self->get(), 0);
      auto r = Load(dir, e1->state_view());
      ASSERT_FALSE(r.ok());
      EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status();
      EXPECT_NE(r.status().message().find(DataFileName(size() - 1) + " chunk"), std::string_view::npos) << r.status();
      EXPECT_NE(r.status().message().find("checksum mismatch"), std::string_view::npos) << r.status();
      EXPECT_NE(r.status().message().find("tensor"), std::string_view::npos) << r.status();
      write_data(saved_data);
    }
    corrupt([&] { write_data(saved_data.substr(0, saved_data.size() - 100)); }, [&] { write_data(saved_data); },
            VerifyLevel::kMetadata, "truncated data file");
    const std::string index = dir + "/" + IndexFileName(size() - 1);
    corrupt([&] { fs::rename(index, index + ".away"); }, [&] { fs::rename(index + ".away", index); }, VerifyLevel::kMetadata,
            "deleted index");
    const std::string manifest = dir + "/manifest.json";
    std::string saved_manifest;
    {
      std::ifstream in(manifest);
      saved_manifest.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    corrupt([&] { std::ofstream(manifest, std::ios::trunc) << "{ garbage"; },
            [&] { std::ofstream(manifest, std::ios::trunc) << saved_manifest; }, VerifyLevel::kMetadata, "garbage manifest");
  }
}

// A write that fails on one rank fails the save on every rank and keeps the previous checkpoint: at
// stage 2 the victim writes its own shard; at stage 0 every rank holds the one shard and writes a part
// of it (a save spread over replicas), so a replica's failed part leaves the save incomplete.
TEST_F(CheckpointTest, FailedWritesAndRenamesKeepThePreviousCheckpoint) {
  for (int stage : {2, 0}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const std::string root = root_ + "/stage" + std::to_string(stage);
    auto e = MakeEngine(comm_.get(), stage);
    Train(*e, 1);
    {
      auto ck = MakeCheckpointer(comm_.get(), {.root = "stage" + std::to_string(stage)});
      ASSERT_TRUE(ck->SaveAsync(e->state_view()).ok());
      ASSERT_TRUE(ck->Wait().ok());
    }
    Train(*e, 2);
    for (const char* fault : {"enospc", "fsync", "rename", "commit"}) {
      SCOPED_TRACE(fault);
      CheckpointOptions o;
      o.root = "stage" + std::to_string(stage);
      const int victim = size() - 1;
      testing::FnIoHooks hooks;
      if (std::string(fault) == "enospc") {
        hooks.transfer = [&](bool write, const std::string&, int64_t off, size_t*) {
          return write && rank() == victim && off >= (stage == 0 ? 0 : 4096) ? ENOSPC : 0;
        };
      } else {
        hooks.file_op = [&, fault](std::string_view op, const std::string&) {
          return op == fault && rank() == (op == "commit" ? 0 : victim) ? EIO : 0;
        };
      }
      auto ck = MakeCheckpointer(comm_.get(), o, &hooks);
      ASSERT_TRUE(ck->SaveAsync(e->state_view()).ok());  // the write fails in the background ...
      Status s = ck->Wait();                              // ... and every rank hears of it here
      ASSERT_FALSE(s.ok());
      if (std::string(fault) == "enospc" && rank() != victim) {
        EXPECT_NE(s.message().find("failed on rank " + std::to_string(victim)), std::string_view::npos) << s;
      }
      if (std::string(fault) == "enospc") {
        EXPECT_NE(s.message().find("No space left"), std::string_view::npos) << s;
      }
      ASSERT_TRUE(comm_->Barrier().ok());
      // The previous checkpoint is still the newest complete one, and nothing half-written remains.
      auto latest = FindLatestComplete(root, VerifyLevel::kFull);
      ASSERT_TRUE(latest.ok()) << latest.status();
      EXPECT_EQ(fs::path(*latest).filename(), "step-00000001");
      for (const auto& entry : fs::directory_iterator(root)) {
        EXPECT_EQ(entry.path().filename().string().find(".tmp-"), std::string::npos) << entry.path();
      }
    }
    if (stage == 0 && rank() == 0) {
      EXPECT_EQ(ReadManifest(*FindLatestComplete(root))->parts, size()) << "spread over every rank";
    }
  }
}

TEST_F(CheckpointTest, RetentionLatestPointerAndStartupCleanup) {
  auto e = MakeEngine(comm_.get(), 1);
  CheckpointOptions o;
  o.keep_last = 2;
  o.keep_every = 4;
  {
    auto ck = MakeCheckpointer(comm_.get(), o);
    for (int s = 1; s <= 6; ++s) {
      Train(*e, s);
      ASSERT_TRUE(ck->SaveAsync(e->state_view()).ok());  // commits the previous one first
    }
    ASSERT_TRUE(ck->Wait().ok());
  }
  ASSERT_TRUE(comm_->Barrier().ok());
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(root_)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"latest", "step-00000004", "step-00000005", "step-00000006"}));
  std::ifstream latest(root_ + "/latest");
  std::string pointed;
  latest >> pointed;
  EXPECT_EQ(pointed, "step-00000006");
  // A save that died mid-write leaves a .tmp directory: listed as in progress, removed at start-up.
  ASSERT_TRUE(comm_->Barrier().ok());
  if (rank() == 0) fs::create_directories(root_ + "/step-00000007.tmp-deadbeef");
  ASSERT_TRUE(comm_->Barrier().ok());
  auto list = ListCheckpoints(root_);
  ASSERT_TRUE(list.ok());
  EXPECT_TRUE(list->front().in_progress);
  EXPECT_FALSE(list->front().complete);
  ASSERT_TRUE(comm_->Barrier().ok());
  auto ck = MakeCheckpointer(comm_.get(), o);
  EXPECT_FALSE(fs::exists(root_ + "/step-00000007.tmp-deadbeef"));
  // Saving a step that already has a complete checkpoint keeps the existing one.
  ASSERT_TRUE(ck->SaveAsync(e->state_view()).ok());
  ASSERT_TRUE(ck->Wait().ok());
  EXPECT_EQ(*FindLatestComplete(root_), root_ + "/step-00000006");
}

}  // namespace
}  // namespace zrt::ckpt
