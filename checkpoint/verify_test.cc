// CheckComplete and the catalog on checkpoints written by in-process ranks: a complete checkpoint has
// no problems at either level; each kind of damage is found at the level that can see it and named;
// the catalog lists newest first and FindLatestComplete skips what is not complete.
#include "zrt/checkpoint/catalog.h"

#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "tests/support/synthetic_state.h"
#include "zrt/checkpoint/checkpointer.h"
#include "zrt/checkpoint/files.h"
#include "zrt/checkpoint/format.h"
#include "zrt/core/communicator.h"

namespace zrt::ckpt {
namespace {

namespace fs = std::filesystem;

class VerifyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("zrt_verify_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    for (int64_t step : {10, 20}) {
      ASSERT_TRUE(RunLoopbackRanks(3, [&](Communicator& comm) -> Status {
        CpuDevice staging;
        CheckpointOptions o;
        o.root = root_.string();
        o.chunk_elements = 1024;
        ASSIGN_OR_RETURN(auto ck, Checkpointer::Create(&comm, &staging, o));
        testing::SyntheticState state(testing::SmallModel(), 3, comm.rank(), 16, true);
        state.view.counters.step = step;
        RETURN_IF_ERROR(ck->SaveAsync(state.view));
        return ck->Wait();
      }).ok());
    }
    dir_ = (root_ / "step-00000020").string();
  }
  void TearDown() override { fs::remove_all(root_); }
  std::vector<std::string> Problems(VerifyLevel level) {
    std::vector<std::string> p;
    EXPECT_TRUE(CheckComplete(dir_, level, &p).ok());
    return p;
  }
  fs::path root_;
  std::string dir_;
};

TEST_F(VerifyTest, CompleteAtBothLevels) {
  EXPECT_TRUE(Problems(VerifyLevel::kMetadata).empty());
  EXPECT_TRUE(Problems(VerifyLevel::kFull).empty());
  EXPECT_EQ(CheckComplete((root_ / "nowhere").string(), VerifyLevel::kFull, nullptr).code(), StatusCode::kNotFound);
}

TEST_F(VerifyTest, AFlippedDataByteIsFoundByFullVerificationAndNamed) {
  auto cd = CheckpointDir::Open(dir_);
  auto m = ReadManifest(dir_);
  ASSERT_TRUE(cd.ok() && m.ok());
  auto idx = ReadIndex(*cd, *m, *SavedLayouts(*m), 1);
  ASSERT_TRUE(idx.ok()) << idx.status();
  const ChunkEntry& c = idx->chunks[2];
  {
    std::fstream f(fs::path(dir_) / idx->data_file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(c.file_offset + 5);
    char b = 0;
    f.read(&b, 1);
    b = static_cast<char>(b ^ 0x10);
    f.seekp(c.file_offset + 5);
    f.write(&b, 1);
  }
  EXPECT_TRUE(Problems(VerifyLevel::kMetadata).empty());
  const auto p = Problems(VerifyLevel::kFull);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_NE(p[0].find("rank-00001.data chunk 2"), std::string::npos) << p[0];
  EXPECT_NE(p[0].find("checksum mismatch"), std::string::npos) << p[0];
  // The catalog at full level falls back to the previous checkpoint.
  EXPECT_EQ(*FindLatestComplete(root_.string(), VerifyLevel::kMetadata), dir_);
  EXPECT_EQ(fs::path(*FindLatestComplete(root_.string(), VerifyLevel::kFull)).filename(), "step-00000010");
}

TEST_F(VerifyTest, MetadataDamageIsFoundAtEveryLevel) {
  const fs::path d(dir_);
  auto check = [&](const char* what, auto damage, auto repair) {
    damage();
    const auto p = Problems(VerifyLevel::kMetadata);
    EXPECT_FALSE(p.empty()) << what;
    auto list = ListCheckpoints(root_.string());
    ASSERT_TRUE(list.ok());
    EXPECT_EQ((*list)[0].step, 20);
    EXPECT_FALSE((*list)[0].complete) << what;
    EXPECT_EQ(fs::path(*FindLatestComplete(root_.string())).filename(), "step-00000010") << what;
    repair();
    EXPECT_TRUE(Problems(VerifyLevel::kFull).empty()) << what;
  };
  const fs::path index = d / IndexFileName(2), data = d / DataFileName(0), manifest = d / "manifest.json";
  check("missing index", [&] { fs::rename(index, index.string() + ".away"); }, [&] { fs::rename(index.string() + ".away", index); });
  const auto size = fs::file_size(data);
  std::string saved;
  {
    std::ifstream in(data, std::ios::binary);
    saved.assign(std::istreambuf_iterator<char>(in), {});
  }
  check("truncated data", [&] { fs::resize_file(data, size - 1); },
        [&] { std::ofstream(data, std::ios::binary | std::ios::trunc) << saved; });
  std::string m;
  {
    std::ifstream in(manifest);
    m.assign(std::istreambuf_iterator<char>(in), {});
  }
  check("garbage manifest", [&] { std::ofstream(manifest, std::ios::trunc) << "{ garbage"; },
        [&] { std::ofstream(manifest, std::ios::trunc) << m; });
  // An index from another save (the step-10 one) under this directory.
  const fs::path other = root_ / "step-00000010" / IndexFileName(2);
  std::string mine;
  {
    std::ifstream in(index);
    mine.assign(std::istreambuf_iterator<char>(in), {});
  }
  check("index of another save", [&] { fs::copy_file(other, index, fs::copy_options::overwrite_existing); },
        [&] { std::ofstream(index, std::ios::trunc) << mine; });
}

TEST_F(VerifyTest, CatalogListsNewestFirstAndSavesInProgress) {
  fs::create_directories(root_ / "step-00000030.tmp-0123456789abcdef");
  auto list = ListCheckpoints(root_.string());
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 3u);
  EXPECT_EQ((*list)[0].step, 30);
  EXPECT_TRUE((*list)[0].in_progress);
  EXPECT_FALSE((*list)[0].complete);
  EXPECT_EQ((*list)[1].step, 20);
  EXPECT_TRUE((*list)[1].complete);
  EXPECT_EQ((*list)[1].world_size, 3);
  EXPECT_GT((*list)[1].bytes, 0);
  EXPECT_EQ(*FindLatestComplete(root_.string()), dir_);
  EXPECT_EQ(FindLatestComplete((root_ / "nowhere").string()).status().code(), StatusCode::kNotFound);
}

// A job renames and deletes directories under the root while an operator lists it: entries that
// vanish mid-listing are skipped, never an error (nor an exception).
TEST_F(VerifyTest, ListingSurvivesEntriesVanishingUnderIt) {
  std::atomic<bool> stop{false};
  std::thread churn([&] {
    for (int i = 0; !stop.load(); ++i) {
      std::error_code ec;
      const fs::path tmp = root_ / ("step-00000040.tmp-" + std::to_string(i));
      fs::copy(root_ / "step-00000010", tmp, fs::copy_options::recursive, ec);
      fs::rename(tmp, root_ / "step-00000040", ec);
      fs::remove_all(root_ / "step-00000040", ec);
    }
  });
  int listed = 0;
  for (int i = 0; i < 200; ++i) {
    auto list = ListCheckpoints(root_.string());
    ASSERT_TRUE(list.ok()) << list.status();
    auto latest = FindLatestComplete(root_.string());
    ASSERT_TRUE(latest.ok()) << latest.status();
    listed += static_cast<int>(list->size());
  }
  stop = true;
  churn.join();
  EXPECT_GE(listed, 400);
}

}  // namespace
}  // namespace zrt::ckpt
