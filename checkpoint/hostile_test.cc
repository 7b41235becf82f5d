// Checkpoints as untrusted input (../shared/DESIGN.md "Checkpoints" 7 and 8): each class of damage or
// forgery found by the read-side campaign (issue: "The read side held to the write side's standard")
// is refused by verify and by load, cannot crash, loop, allocate or read outside the directory, and a
// resume on in-process ranks falls back to the previous checkpoint on every rank. Forged files are
// resealed (a valid checksum), so only the rules can catch them.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "tests/support/reference.h"
#include "tests/support/resident_owner.h"
#include "tests/support/synthetic_state.h"
#include "zrt/checkpoint/catalog.h"
#include "zrt/checkpoint/checkpointer.h"
#include "zrt/checkpoint/codec.h"
#include "zrt/checkpoint/files.h"
#include "zrt/checkpoint/format.h"
#include "zrt/checkpoint/load.h"
#include "zrt/core/communicator.h"

namespace zrt::ckpt {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int kRanks = 2;

std::string Slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void Spit(const fs::path& p, const std::string& s) { std::ofstream(p, std::ios::binary | std::ios::trunc) << s; }

class HostileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = fs::temp_directory_path() / ("zrt_hostile_" + std::to_string(::getpid()));
    fs::remove_all(base_);
    root_ = base_ / "root";
    for (int step : {10, 20}) Save(step);
    dir_ = root_ / "step-00000020";
  }
  void TearDown() override { fs::remove_all(base_); }

  void Save(int step, const std::vector<std::string>& kinds = testing::StateKinds()) {
    ASSERT_TRUE(RunLoopbackRanks(kRanks, [&](Communicator& comm) -> Status {
      CpuDevice staging;
      CheckpointOptions o;
      o.root = root_.string();
      o.chunk_elements = 1024;
      ASSIGN_OR_RETURN(auto ck, Checkpointer::Create(&comm, &staging, o));
      testing::SyntheticState state(testing::SmallModel(), kRanks, comm.rank(), 16, true, 3, step, kinds);
      state.view.counters.step = step;
      RETURN_IF_ERROR(ck->SaveAsync(state.view));
      return ck->Wait();
    }).ok());
  }
  // Rewrites a JSON file of the newest checkpoint through `edit`, resealed (a valid checksum).
  void Forge(const std::string& name, const std::function<void(json&)>& edit) {
    json j = json::parse(Slurp(dir_ / name));
    j.erase("checksum");
    edit(j);
    Spit(dir_ / name, internal::Seal(std::move(j)));
  }
  std::vector<std::string> Problems(const fs::path& dir, VerifyLevel level = VerifyLevel::kFull) {
    std::vector<std::string> p;
    EXPECT_TRUE(CheckComplete(dir.string(), level, &p).ok());
    return p;
  }
  // A resume of kRanks in-process ranks: the directory every rank loaded (every rank the same), and
  // whether every rank's state holds that checkpoint's values.
  std::string ResumeAll(StatusCode* code = nullptr) {
    std::vector<std::string> dirs(kRanks);
    std::vector<StatusCode> codes(kRanks);
    std::vector<int> restored(kRanks, 0);
    Status s = RunLoopbackRanks(kRanks, [&](Communicator& comm) -> Status {
      testing::SyntheticState target(testing::SmallModel(), kRanks, comm.rank(), 8, false);
      testing::ResidentOwner owner(&target.view, [&](const StateCounters& c) {
        restored[static_cast<size_t>(comm.rank())] = static_cast<int>(c.step);
        return Status();
      });
      target.view.owner = &owner;
      auto r = Resume(&comm, {.root = root_.string()}, target.view);
      codes[static_cast<size_t>(comm.rank())] = r.status().code();
      if (!r.ok()) return Status();
      dirs[static_cast<size_t>(comm.rank())] = r->dir;
      const int salt = static_cast<int>(r->loaded.counters.step);
      EXPECT_TRUE(target.HoldsValues(salt)) << "rank " << comm.rank() << " does not hold the values of " << r->dir;
      EXPECT_EQ(restored[static_cast<size_t>(comm.rank())], salt);
      return Status();
    });
    EXPECT_TRUE(s.ok()) << s;  // no rank hung or failed alone
    for (int r = 1; r < kRanks; ++r) {
      EXPECT_EQ(codes[r], codes[0]) << "ranks disagree";
      EXPECT_EQ(dirs[r], dirs[0]) << "ranks disagree";
    }
    if (code) *code = codes[0];
    return dirs[0].empty() ? "" : fs::path(dirs[0]).filename().string();
  }
  fs::path base_, root_, dir_;
};

TEST_F(HostileTest, TheUntouchedCheckpointIsCompleteAndResumed) {
  EXPECT_TRUE(Problems(dir_).empty());
  EXPECT_EQ(ResumeAll(), "step-00000020");
}

TEST_F(HostileTest, AnExtraOverlappingChunkWithAValidChecksumIsRefused) {
  // A second chunk for the second half of chunk 1's elements, over the first half of its bytes, with
  // their true checksum: every byte it names is intact; only the overlap gives it away.
  const std::string data = Slurp(dir_ / DataFileName(1));
  Forge(IndexFileName(1), [&](json& j) {
    json c = j["chunks"][1];
    const int64_t n = c[3].get<int64_t>(), half = n / 2, file_offset = c[4].get<int64_t>();
    c[2] = c[2].get<int64_t>() + half;
    c[3] = n - half;
    c[5] = (n - half) * 4;
    char hex[17];
    std::snprintf(hex, sizeof(hex), "%016llx",
                  static_cast<unsigned long long>(Checksum(data.data() + file_offset, static_cast<size_t>((n - half) * 4))));
    c[7] = hex;
    j["chunks"].push_back(c);
  });
  const auto p = Problems(dir_, VerifyLevel::kMetadata);
  ASSERT_FALSE(p.empty());
  EXPECT_NE(p[0].find("overlap"), std::string::npos) << p[0];
  EXPECT_EQ(ResumeAll(), "step-00000010");
}

TEST_F(HostileTest, ChunkEntriesRepeatedThousandsOfTimesAreRefused) {
  Forge(IndexFileName(0), [](json& j) {
    const json c = j["chunks"][0];
    for (int i = 0; i < 20000; ++i) j["chunks"].push_back(c);
  });
  EXPECT_FALSE(Problems(dir_, VerifyLevel::kMetadata).empty());
  EXPECT_EQ(ResumeAll(), "step-00000010");
}

TEST_F(HostileTest, AManifestThatDisagreesWithItsIndexesOrItsDirectoryIsRefused) {
  const std::string manifest = Slurp(dir_ / "manifest.json");
  auto expect_refused = [&](const char* what, const std::function<void(json&)>& edit, const char* message) {
    SCOPED_TRACE(what);
    Forge("manifest.json", edit);
    const auto p = Problems(dir_, VerifyLevel::kMetadata);
    ASSERT_FALSE(p.empty());
    EXPECT_NE(p[0].find(message), std::string::npos) << p[0];
    EXPECT_EQ(ResumeAll(), "step-00000010");
    Spit(dir_ / "manifest.json", manifest);
  };
  expect_refused("a dropped state kind", [](json& j) { j["groups"][0]["kinds"].erase(2); }, "unknown state kind 2");
  expect_refused("an unknown state kind", [](json& j) { j["groups"][1]["kinds"][1] = "exp_avg_v2"; }, "unknown state kind 'exp_avg_v2'");
  expect_refused("a repeated state kind", [](json& j) { j["groups"][1]["kinds"][2] = "exp_avg"; }, "repeated");
  expect_refused("a step that is not the directory's", [](json& j) { j["step"] = 21; }, "directory named for step 20");
  expect_refused("a shape that disagrees with numel", [](json& j) { j["groups"][1]["tensors"][0]["shape"] = {8, 34}; }, "shape has 272");
  expect_refused("duplicate tensor names", [](json& j) { j["groups"][1]["tensors"][1]["name"] = "w1"; }, "repeated");
  expect_refused("no groups", [](json& j) { j["groups"] = json::array(); }, "no parameter groups");
  expect_refused("fewer shards than index files", [](json& j) {
    j["shards"] = 1;
    j["world_size"] = 1;
  }, "");
  // A renamed but known kind is consistent on its own; the strict load refuses it (the model has no
  // max_exp_avg_sq and the checkpoint no exp_avg_sq).
  Forge("manifest.json", [](json& j) { j["groups"][0]["kinds"][2] = "max_exp_avg_sq"; });
  EXPECT_EQ(ResumeAll(), "step-00000010");
}

TEST_F(HostileTest, LoadsCheckShapesDtypesAndEveryStateKind) {
  testing::GroupShapes transposed = testing::SmallModel();
  transposed[1].second[0].shape = {33, 8};  // the same numel
  testing::SyntheticState t(transposed, 1, 0, 8, false);
  Status s = Load(dir_.string(), t.view).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("'w1'"), std::string_view::npos) << s;
  // A model dtype that differs: refused when strict, loaded (and listed) when not.
  testing::SyntheticState f32(testing::SmallModel(), 1, 0, 8, false);
  for (StateGroup& g : f32.view.groups) {
    for (TensorSpec& spec : g.tensors) spec.dtype = DType::kF32;
  }
  EXPECT_EQ(Load(dir_.string(), f32.view).status().code(), StatusCode::kInvalidArgument);
  LoadOptions loose;
  loose.strict = false;
  auto r = Load(dir_.string(), f32.view, loose);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->mismatched.size(), 5u);
  // A checkpoint without a state kind the model has: refused when strict; zero and listed when not.
  fs::remove_all(root_);
  Save(30, {"master", "exp_avg"});
  testing::SyntheticState full(testing::SmallModel(), 3, 1, 8, false, 3, 30);
  s = Load((root_ / "step-00000030").string(), full.view).status();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("no exp_avg_sq"), std::string_view::npos) << s;
  auto partial = Load((root_ / "step-00000030").string(), full.view, loose);
  ASSERT_TRUE(partial.ok()) << partial.status();
  EXPECT_FALSE(partial->missing.empty());
  full.ExpectValues({"master", "exp_avg"});
}

TEST_F(HostileTest, SizesBeyondTheFilesOrTheBoundsAreRefusedWithoutCrashingOrLooping) {
  const std::string manifest = Slurp(dir_ / "manifest.json"), index = Slurp(dir_ / IndexFileName(0));
  auto restore = [&] {
    Spit(dir_ / "manifest.json", manifest);
    Spit(dir_ / IndexFileName(0), index);
  };
  const std::vector<std::pair<const char*, std::function<void()>>> forgeries = {
      {"chunk of 2^40 elements", [&] { Forge(IndexFileName(0), [](json& j) { j["chunks"][0][3] = int64_t{1} << 40; }); }},
      {"numel 2^62", [&] { Forge("manifest.json", [](json& j) {
         j["groups"][0]["tensors"][0]["numel"] = int64_t{1} << 62;
         j["groups"][0]["tensors"][0]["shape"] = {int64_t{1} << 31, int64_t{1} << 31};
       }); }},
      {"numel 2^40", [&] { Forge("manifest.json", [](json& j) {
         j["groups"][0]["tensors"][0]["numel"] = int64_t{1} << 40;
         j["groups"][0]["tensors"][0]["shape"] = {int64_t{1} << 40};
       }); }},
      {"alignment 2^61", [&] { Forge("manifest.json", [](json& j) { j["groups"][0]["alignment"] = int64_t{1} << 61; }); }},
      {"a billion shards", [&] { Forge("manifest.json", [](json& j) {
         j["shards"] = 1000000000;
         j["world_size"] = 1000000000;
       }); }},
      {"more shards than files", [&] { Forge("manifest.json", [](json& j) {
         j["shards"] = 100000;
         j["world_size"] = 100000;
       }); }},
      {"chunk_elements 2^40", [&] { Forge("manifest.json", [](json& j) { j["chunk_elements"] = int64_t{1} << 40; }); }},
  };
  for (const auto& [what, forge] : forgeries) {
    SCOPED_TRACE(what);
    forge();
    EXPECT_FALSE(Problems(dir_).empty());
    EXPECT_FALSE(Problems(dir_, VerifyLevel::kMetadata).empty());
    testing::SyntheticState t(testing::SmallModel(), 1, 0, 8, false);
    EXPECT_FALSE(Load(dir_.string(), t.view).ok());
    auto list = ListCheckpoints(root_.string());
    ASSERT_TRUE(list.ok()) << list.status();
    EXPECT_EQ(fs::path(*FindLatestComplete(root_.string())).filename(), "step-00000010");
    EXPECT_EQ(ResumeAll(), "step-00000010");
    restore();
  }
  EXPECT_TRUE(Problems(dir_).empty());
}

TEST_F(HostileTest, NothingIsReadOutsideTheDirectoryOrThroughALink) {
  // A copy of the checkpoint elsewhere: the target of every forged path and link.
  const fs::path outside = base_ / "outside";
  fs::copy(dir_, outside, fs::copy_options::recursive);
  const std::string index = Slurp(dir_ / IndexFileName(1));
  Forge(IndexFileName(1), [](json& j) { j["data_file"] = "../../outside/" + DataFileName(1); });
  auto p = Problems(dir_, VerifyLevel::kMetadata);
  ASSERT_FALSE(p.empty());
  EXPECT_NE(p[0].find("is not rank-00001.data"), std::string::npos) << p[0];
  EXPECT_EQ(ResumeAll(), "step-00000010");
  Spit(dir_ / IndexFileName(1), index);
  for (const std::string& name : {DataFileName(0), IndexFileName(1), std::string("manifest.json")}) {
    SCOPED_TRACE(name);
    const fs::path f = dir_ / name;
    fs::rename(f, base_ / "saved");
    fs::create_symlink(outside / name, f);
    p = Problems(dir_, VerifyLevel::kMetadata);
    ASSERT_FALSE(p.empty());
    EXPECT_NE(p[0].find("symbolic link"), std::string::npos) << p[0];
    EXPECT_EQ(ResumeAll(), "step-00000010");
    fs::remove(f);
    fs::rename(base_ / "saved", f);
  }
  // The step directory itself a link: not a checkpoint to the catalog, refused by verify.
  fs::create_directory_symlink(outside, root_ / "step-00000030");
  std::vector<std::string> problems;
  ASSERT_TRUE(CheckComplete((root_ / "step-00000030").string(), VerifyLevel::kFull, &problems).ok());
  ASSERT_FALSE(problems.empty());
  EXPECT_NE(problems[0].find("symbolic link"), std::string::npos) << problems[0];
  auto list = ListCheckpoints(root_.string());
  ASSERT_TRUE(list.ok());
  for (const CheckpointInfo& c : *list) EXPECT_NE(c.step, 30);
  EXPECT_EQ(ResumeAll(), "step-00000020");
}

TEST_F(HostileTest, ACorruptChunkOnOneRankMakesEveryRankFallBack) {
  auto cd = CheckpointDir::Open(dir_.string());
  auto m = ReadManifest(dir_.string());
  ASSERT_TRUE(cd.ok() && m.ok());
  auto idx = ReadIndex(*cd, *m, *SavedLayouts(*m), 1);
  ASSERT_TRUE(idx.ok());
  std::string data = Slurp(dir_ / DataFileName(1));
  data[static_cast<size_t>(idx->chunks[3].file_offset + 9)] ^= 0x40;
  Spit(dir_ / DataFileName(1), data);
  EXPECT_EQ(ResumeAll(), "step-00000010");  // only rank 1 reads that chunk; both fall back
}

TEST_F(HostileTest, NoCheckpointIsNotFoundAndNoneLoadableIsDataLossOnEveryRank) {
  StatusCode code = StatusCode::kOk;
  for (const char* d : {"step-00000010", "step-00000020"}) {
    std::string data = Slurp(root_ / d / DataFileName(0));
    data[100] ^= 1;
    Spit(root_ / d / DataFileName(0), data);
  }
  EXPECT_EQ(ResumeAll(&code), "");
  EXPECT_EQ(code, StatusCode::kDataLoss);
  fs::remove_all(root_);
  fs::create_directories(root_);
  EXPECT_EQ(ResumeAll(&code), "");
  EXPECT_EQ(code, StatusCode::kNotFound);
}

// Any single byte of the newest checkpoint flipped: every rank ends up holding the newest checkpoint's
// values (the byte was padding, which no load reads) or the previous one's, never a mixture, never
// one rank alone. Positions are drawn anew each run (ZRT_TEST_SEED reproduces).
TEST_F(HostileTest, AnySingleFlippedByteFallsBackOnEveryRankOrLoadsExactly) {
  std::mt19937_64 rng(testing::TestSeed());
  SCOPED_TRACE("seed " + std::to_string(testing::TestSeed()));
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir_)) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  int fell_back = 0, trials = 0;
  for (const fs::path& f : files) {
    const std::string original = Slurp(f);
    std::vector<size_t> positions = {0, original.size() - 1};
    for (int i = 0; i < 6; ++i) positions.push_back(std::uniform_int_distribution<size_t>(0, original.size() - 1)(rng));
    for (size_t pos : positions) {
      SCOPED_TRACE(f.filename().string() + " byte " + std::to_string(pos));
      std::string bad = original;
      bad[pos] = static_cast<char>(bad[pos] ^ (1 << (pos % 8)));
      Spit(f, bad);
      const std::string loaded = ResumeAll();
      EXPECT_TRUE(loaded == "step-00000020" || loaded == "step-00000010") << loaded;
      fell_back += loaded == "step-00000010";
      ++trials;
      Spit(f, original);
    }
  }
  EXPECT_GT(fell_back, trials / 2);
}

}  // namespace
}  // namespace zrt::ckpt
