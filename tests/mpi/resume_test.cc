// ckpt::Resume at 1..4 MPI ranks with the real engine: the newest checkpoint damaged in one place (a
// byte of chunk data, of an index or of the manifest, a data file gone or truncated on one rank) makes
// every rank fall back to the previous checkpoint together — never a rank alone in a collective (this
// suite has a timeout: a hang fails it) — and the engine resumes with exactly that checkpoint's
// parameters and step. Untouched, the newest is resumed. A checkpoint of another model is a
// configuration error on every rank that overwrites nothing.
#include <gtest/gtest.h>
#include <mpi.h>

#include <filesystem>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>

#include "tests/support/reference.h"
#include "tests/support/state_values.h"
#include "tests/support/scratch_root.h"
#include "zrt/checkpoint/checkpointer.h"
#include "zrt/checkpoint/files.h"
#include "zrt/checkpoint/load.h"
#include "zrt/core/mpi_communicator.h"
#include "zrt/runtime/engine.h"

namespace zrt::ckpt {
namespace {

namespace fs = std::filesystem;

std::string Slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void Spit(const fs::path& p, const std::string& s) { std::ofstream(p, std::ios::binary | std::ios::trunc) << s; }

class ResumeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto c = MpiCommunicator::Create(MPI_COMM_WORLD);
    ASSERT_TRUE(c.ok());
    comm_ = std::move(*c);
    root_ = testing::SharedScratchRoot(comm_.get(), "zrt_resume");
    ASSERT_FALSE(root_.empty());
  }
  void TearDown() override { ASSERT_TRUE(testing::RemoveSharedScratchRoot(comm_.get(), root_).ok()); }

  // `w_rows`: another model when not 37 (w's shape differs).
  std::unique_ptr<ZeroEngine> Engine(int64_t w_rows = 37) {
    EngineConfig cfg;
    cfg.stage = 3;
    cfg.adam.lr = 1e-2;
    auto e = ZeroEngine::Create(comm_.get(), &device_, cfg);
    EXPECT_TRUE(e.ok());
    EXPECT_TRUE((*e)->AddParam("w", {w_rows, 29}, DType::kBF16, {.group = "a"}).ok());
    EXPECT_TRUE((*e)->AddParam("b", {1001}, DType::kBF16, {.group = "b"}).ok());
    EXPECT_TRUE((*e)->Finalize([](int64_t p, int64_t off, int64_t n, float* out) {
      for (int64_t i = 0; i < n; ++i) out[i] = 0.01f * static_cast<float>((p * 7919 + off + i) % 101) - 0.5f;
    }).ok());
    return std::move(*e);
  }
  void Train(ZeroEngine& e, int steps) {
    for (int s = 0; s < steps; ++s) {
      for (int g = 0; g < 2; ++g) {
        ASSERT_TRUE(e.Gather(g).ok());
        auto gb = e.GradBuffer(g);
        ASSERT_TRUE(gb.ok());
        auto* p = static_cast<uint16_t*>(*gb);
        for (int i = 0; i < 500; ++i) p[i] = FloatToBf16(0.001f * static_cast<float>(i % 13 + comm_->rank() + s));
        ASSERT_TRUE(e.Release(g).ok());
        ASSERT_TRUE(e.GradsReady(g).ok());
      }
      ASSERT_TRUE(e.Step().ok());
    }
  }
  // Every group's gathered parameters (bf16 bits), on every rank.
  std::vector<std::vector<uint16_t>> Params(ZeroEngine& e) {
    std::vector<std::vector<uint16_t>> out;
    for (int g = 0; g < 2; ++g) {
      auto p = e.Gather(g);
      EXPECT_TRUE(p.ok());
      const size_t n = g == 0 ? 37 * 29 : 1001;
      out.emplace_back(static_cast<const uint16_t*>(*p), static_cast<const uint16_t*>(*p) + n);
      EXPECT_TRUE(e.Release(g).ok());
    }
    return out;
  }
  // A fresh engine resumed from root_: the checkpoint's name (the same on every rank).
  std::string ResumeFresh(std::vector<std::vector<uint16_t>>* params, int64_t* step) {
    auto e = Engine();
    auto r = Resume(comm_.get(), {.root = root_}, e->state_view());
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return "";
    *params = Params(*e);
    *step = e->steps();
    char name[64] = {};
    std::snprintf(name, sizeof(name), "%s", fs::path(r->dir).filename().c_str());
    char root_name[64] = {};
    std::memcpy(root_name, name, sizeof(name));
    EXPECT_TRUE(comm_->Broadcast(root_name, sizeof(root_name), DType::kBytes, 0).ok());
    EXPECT_STREQ(name, root_name) << "ranks resumed from different checkpoints";
    return name;
  }

  CpuDevice device_;
  std::unique_ptr<MpiCommunicator> comm_;
  std::string root_;
};

TEST_F(ResumeTest, ADamagedNewestCheckpointFallsBackOnEveryRank) {
  std::vector<std::vector<uint16_t>> at2, at4;
  {
    auto e = Engine();
    auto ck = Checkpointer::Create(comm_.get(), &device_, {.root = root_, .chunk_elements = 1024});
    ASSERT_TRUE(ck.ok());
    Train(*e, 2);
    at2 = Params(*e);
    ASSERT_TRUE((*ck)->SaveAsync(e->state_view()).ok());
    ASSERT_TRUE((*ck)->Wait().ok());
    Train(*e, 2);
    at4 = Params(*e);
    ASSERT_TRUE((*ck)->SaveAsync(e->state_view()).ok());
    ASSERT_TRUE((*ck)->Wait().ok());
  }
  ASSERT_NE(at2, at4);
  const fs::path newest = fs::path(root_) / "step-00000004";
  const int victim = comm_->size() - 1;
  std::vector<std::vector<uint16_t>> got;
  int64_t step = -1;
  EXPECT_EQ(ResumeFresh(&got, &step), "step-00000004");
  EXPECT_EQ(got, at4);
  EXPECT_EQ(step, 4);

  // Damage, on rank 0 (a shared file system), then a resume on every rank.
  std::mt19937_64 rng(testing::TestSeed());
  const std::vector<std::pair<std::string, std::function<void(const fs::path&)>>> damages = {
      {DataFileName(victim) + ": a byte of a chunk", [&](const fs::path& d) {
         auto cd = CheckpointDir::Open(d.string());
         auto m = ReadManifest(d.string());
         auto idx = ReadIndex(*cd, *m, *SavedLayouts(*m), victim);
         const ChunkEntry& c = idx->chunks[rng() % idx->chunks.size()];
         std::string data = Slurp(d / DataFileName(victim));
         data[static_cast<size_t>(c.file_offset) + rng() % static_cast<size_t>(c.stored_bytes)] ^= 0x20;
         Spit(d / DataFileName(victim), data);
       }},
      {IndexFileName(victim) + ": a byte", [&](const fs::path& d) {
         std::string text = Slurp(d / IndexFileName(victim));
         text[rng() % text.size()] ^= 0x01;
         Spit(d / IndexFileName(victim), text);
       }},
      {"manifest.json: a byte", [&](const fs::path& d) {
         std::string text = Slurp(d / "manifest.json");
         text[rng() % text.size()] ^= 0x04;
         Spit(d / "manifest.json", text);
       }},
      {DataFileName(victim) + " gone", [&](const fs::path& d) { fs::remove(d / DataFileName(victim)); }},
      {DataFileName(victim) + " truncated", [&](const fs::path& d) {
         fs::resize_file(d / DataFileName(victim), fs::file_size(d / DataFileName(victim)) / 2);
       }},
  };
  for (const auto& [what, damage] : damages) {
    SCOPED_TRACE(what);
    ASSERT_TRUE(comm_->Barrier().ok());
    if (comm_->rank() == 0) {
      fs::copy(newest, fs::path(root_) / "saved", fs::copy_options::recursive);
      damage(newest);
    }
    ASSERT_TRUE(comm_->Barrier().ok());
    EXPECT_EQ(ResumeFresh(&got, &step), "step-00000002");
    EXPECT_EQ(got, at2);
    EXPECT_EQ(step, 2);
    ASSERT_TRUE(comm_->Barrier().ok());
    if (comm_->rank() == 0) {
      fs::remove_all(newest);
      fs::rename(fs::path(root_) / "saved", newest);
    }
  }
  ASSERT_TRUE(comm_->Barrier().ok());
  EXPECT_EQ(ResumeFresh(&got, &step), "step-00000004");
  EXPECT_EQ(got, at4);
}

// A checkpoint of another model is a configuration mistake: every rank gets the same InvalidArgument
// naming it, whichever rank finds it, and nothing of any rank's state was overwritten. A root whose
// only checkpoint is damaged is DataLoss (never a silent fresh start), and one with none is NotFound.
TEST_F(ResumeTest, AnotherModelIsAConfigurationErrorAndChangesNothing) {
  {
    auto e = Engine();
    auto ck = Checkpointer::Create(comm_.get(), &device_, {.root = root_, .chunk_elements = 1024});
    ASSERT_TRUE(ck.ok());
    Train(*e, 2);
    ASSERT_TRUE((*ck)->SaveAsync(e->state_view()).ok());
    ASSERT_TRUE((*ck)->Wait().ok());
  }
  auto other = Engine(41);
  const auto before = testing::ReadState(other->state_view());
  auto r = Resume(comm_.get(), {.root = root_}, other->state_view());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status();
  EXPECT_NE(r.status().message().find("does not fit the model"), std::string_view::npos) << r.status();
  EXPECT_NE(r.status().message().find("'w'"), std::string_view::npos) << r.status();
  EXPECT_TRUE(testing::ReadState(other->state_view()) == before) << "rank " << comm_->rank() << ": state overwritten";
  EXPECT_EQ(other->steps(), 0);

  // Only a damaged checkpoint: DataLoss, on every rank.
  ASSERT_TRUE(comm_->Barrier().ok());
  if (comm_->rank() == 0) fs::remove(fs::path(root_) / "step-00000002" / "manifest.json");
  ASSERT_TRUE(comm_->Barrier().ok());
  auto e = Engine();
  auto damaged = Resume(comm_.get(), {.root = root_}, e->state_view());
  EXPECT_EQ(damaged.status().code(), StatusCode::kDataLoss) << damaged.status();
  ASSERT_TRUE(comm_->Barrier().ok());
  if (comm_->rank() == 0) fs::remove_all(fs::path(root_) / "step-00000002");
  ASSERT_TRUE(comm_->Barrier().ok());
  EXPECT_EQ(Resume(comm_.get(), {.root = root_}, e->state_view()).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace zrt::ckpt
