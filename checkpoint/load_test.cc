// Load on in-process ranks: a checkpoint saved by N ranks (1-4) at any alignment loads into M ranks
// (1-4) at another alignment and grouping, every element in place and padding zero; params_only
// loads master alone; a tensor the checkpoint lacks or with another size is an error naming it. Each
// on disk and in memory (tmpfs, where data files are mapped instead of read: chunk_source.h), a
// corrupt chunk named by both.
#include "zrt/checkpoint/load.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <linux/magic.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "tests/support/synthetic_state.h"
#include "zrt/checkpoint/catalog.h"
#include "zrt/checkpoint/checkpointer.h"
#include "zrt/checkpoint/format.h"
#include "zrt/core/communicator.h"

namespace zrt::ckpt {
namespace {

namespace fs = std::filesystem;

// Saves the synthetic state from `ranks` in-process ranks; returns the checkpoint directory.
std::string Save(const fs::path& root, int ranks, int64_t alignment, const testing::GroupShapes& shapes = testing::SmallModel()) {
  Status s = RunLoopbackRanks(ranks, [&](Communicator& comm) -> Status {
    CpuDevice staging;
    CheckpointOptions o;
    o.root = root.string();
    o.chunk_elements = 1024;
    ASSIGN_OR_RETURN(auto ck, Checkpointer::Create(&comm, &staging, o));
    testing::SyntheticState state(shapes, ranks, comm.rank(), alignment, true);
    RETURN_IF_ERROR(ck->SaveAsync(state.view, {{"epoch", 3}}));
    return ck->Wait();
  });
  EXPECT_TRUE(s.ok()) << s;
  auto dir = FindLatestComplete(root.string());
  EXPECT_TRUE(dir.ok()) << dir.status();
  return dir.ok() ? *dir : "";
}

// Where a suite's checkpoints go: the temporary directory (disk), or /dev/shm (memory: tmpfs), or ""
// when this machine has no tmpfs there.
fs::path Scratch(bool in_memory) {
  if (!in_memory) return fs::temp_directory_path();
  struct statfs st {};
  return ::statfs("/dev/shm", &st) == 0 && st.f_type == TMPFS_MAGIC ? fs::path("/dev/shm") : fs::path();
}

class LoadTest : public ::testing::TestWithParam<std::tuple<int, int, bool>> {
 protected:
  void SetUp() override {
    const fs::path at = Scratch(std::get<2>(GetParam()));
    if (at.empty()) GTEST_SKIP() << "/dev/shm is not a tmpfs here: the in-memory load is not exercised";
    root_ = at / ("zrt_load_" + std::to_string(::getpid()) + "_" + std::to_string(std::get<0>(GetParam())) + "_" +
                  std::to_string(std::get<1>(GetParam())) + (std::get<2>(GetParam()) ? "_mem" : ""));
    fs::remove_all(root_);
  }
  void TearDown() override { fs::remove_all(root_); }
  fs::path root_;
};

TEST_P(LoadTest, AnyRanksToAnyRanksAtAnotherAlignmentAndGrouping) {
  const auto [saved, loaded, in_memory] = GetParam();
  const std::string dir = Save(root_, saved, 16);
  // Another grouping: every tensor in one group, at another alignment.
  testing::GroupShapes merged = {{"all", {}}};
  for (const auto& [name, tensors] : testing::SmallModel()) merged[0].second.insert(merged[0].second.end(), tensors.begin(), tensors.end());
  for (const auto& shapes : {testing::SmallModel(), merged}) {
    for (int r = 0; r < loaded; ++r) {
      testing::SyntheticState target(shapes, loaded, r, 8, false);
      auto res = Load(dir, target.view);
      ASSERT_TRUE(res.ok()) << res.status();
      EXPECT_EQ(res->counters.step, 7);
      EXPECT_EQ(res->saved_world_size, saved);
      EXPECT_EQ(res->counters.loss_scale, 1024);
      EXPECT_EQ(res->trainer_state["epoch"], 3);
      target.ExpectValues();
    }
  }
}

// In memory, data files another user owns (as root) or others may write are read, not mapped (a
// mapped file its owner truncates would kill the reader): they load exactly all the same.
TEST(LoadInMemory, FilesOthersMayChangeAreReadNotMappedAndLoadTheSame) {
  const fs::path at = Scratch(true);
  if (at.empty()) GTEST_SKIP() << "/dev/shm is not a tmpfs here";
  const fs::path root = at / ("zrt_load_others_" + std::to_string(::getpid()));
  fs::remove_all(root);
  const std::string dir = Save(root, 2, 16);
  for (int r = 0; r < 2; ++r) {
    const std::string data = dir + "/" + DataFileName(r);
    if (::geteuid() == 0) {
      ASSERT_EQ(::chown(data.c_str(), 65534, 65534), 0);
    } else {
      fs::permissions(data, fs::perms::group_write | fs::perms::others_write, fs::perm_options::add);
    }
  }
  for (int r = 0; r < 2; ++r) {
    testing::SyntheticState target(testing::SmallModel(), 2, r, 16, false);
    auto res = Load(dir, target.view);
    ASSERT_TRUE(res.ok()) << res.status();
    target.ExpectValues();
  }
  testing::SyntheticState whole(testing::SmallModel(), 1, 0, 8, false);
  ASSERT_TRUE(Load(dir, whole.view).ok());
  whole.ExpectValues();
  fs::remove_all(root);
}

INSTANTIATE_TEST_SUITE_P(Ranks, LoadTest, ::testing::Combine(::testing::Values(1, 2, 3, 4), ::testing::Values(1, 3, 4), ::testing::Bool()));

class LoadErrorTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    const fs::path at = Scratch(GetParam());
    if (at.empty()) GTEST_SKIP() << "/dev/shm is not a tmpfs here: the in-memory load is not exercised";
    root_ = at / ("zrt_load_err_" + std::to_string(::getpid()) + (GetParam() ? "_mem" : ""));
    fs::remove_all(root_);
    dir_ = Save(root_, 2, 16);
  }
  void TearDown() override { fs::remove_all(root_); }
  fs::path root_;
  std::string dir_;
};

TEST_P(LoadErrorTest, ParamsOnlyLoadsMasterAndZerosTheMoments) {
  testing::SyntheticState target(testing::SmallModel(), 3, 1, 8, false);
  LoadOptions o;
  o.params_only = true;
  ASSERT_TRUE(Load(dir_, target.view, o).ok());
  target.ExpectValues({"master"});
}

TEST_P(LoadErrorTest, AMissingOrResizedTensorIsAnErrorNamingIt) {
  testing::GroupShapes extra = testing::SmallModel();
  extra[1].second.push_back({"w3", {4}});
  testing::SyntheticState a(extra, 1, 0, 8, false);
  Status s = Load(dir_, a.view).status();
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s;
  EXPECT_NE(s.message().find("'w3'"), std::string_view::npos) << s;
  testing::GroupShapes resized = testing::SmallModel();
  resized[2].second[0].shape = {4};
  testing::SyntheticState b(resized, 1, 0, 8, false);
  s = Load(dir_, b.view).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("'bias'"), std::string_view::npos) << s;
}

// A same-layout load reads every buffer in place in one pipeline: a chunk failing its checksum
// anywhere in it (here the last of rank 1's file, read while the others are in flight) fails the load
// naming its group and kind; the other rank's file loads exactly; a resharding load (one rank at
// another alignment: every chunk through the cache of decoded chunks) fails on a corrupt chunk of the
// first tensor, naming its file.
TEST_P(LoadErrorTest, ACorruptChunkInTheInPlacePipelineIsNamedAndTheOtherRankLoads) {
  auto text = [](const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  auto m = DecodeManifest(text(dir_ + "/manifest.json"), "manifest");
  ASSERT_TRUE(m.ok()) << m.status();
  auto idx = DecodeIndex(text(dir_ + "/" + IndexFileName(1)), "index");
  ASSERT_TRUE(idx.ok()) << idx.status();
  ASSERT_GE(idx->chunks.size(), 4u);
  const ChunkEntry last = *std::max_element(idx->chunks.begin(), idx->chunks.end(),
                                            [](const ChunkEntry& a, const ChunkEntry& b) { return a.file_offset < b.file_offset; });
  auto flip = [&](int rank, int64_t at) {
    std::fstream f(dir_ + "/" + DataFileName(rank), std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(at);
    char c = 0;
    f.read(&c, 1);
    c ^= 0x20;
    f.seekp(at);
    f.write(&c, 1);
  };
  flip(1, last.file_offset + 1);
  testing::SyntheticState t1(testing::SmallModel(), 2, 1, 16, false);
  Status s = Load(dir_, t1.view).status();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s;
  const GroupEntry& g = m->groups[static_cast<size_t>(last.group)];
  const std::string named = "loading group '" + g.name + "' (" + g.kinds[static_cast<size_t>(last.kind)] + ")";
  EXPECT_NE(s.message().find(named), std::string_view::npos) << s;
  EXPECT_NE(s.message().find("checksum"), std::string_view::npos) << s;
  testing::SyntheticState t0(testing::SmallModel(), 2, 0, 16, false);
  Status ok = Load(dir_, t0.view).status();
  ASSERT_TRUE(ok.ok()) << ok;
  t0.ExpectValues();
  // Rank 0's first chunk (the first tensor's first elements) read by a resharding load.
  flip(0, 3);
  testing::SyntheticState whole(testing::SmallModel(), 1, 0, 8, false);
  s = Load(dir_, whole.view).status();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("checksum"), std::string_view::npos) << s;
  EXPECT_NE(s.message().find(DataFileName(0)), std::string_view::npos) << s;
}

INSTANTIATE_TEST_SUITE_P(Where, LoadErrorTest, ::testing::Bool(), [](const auto& i) { return i.param ? "Memory" : "Disk"; });

}  // namespace
}  // namespace zrt::ckpt
