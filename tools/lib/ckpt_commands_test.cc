// The ckpt commands as library functions, on a checkpoint written in-process by the offline writer
// (no MPI): output text, JSON, and errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <limits>
#include <sstream>

#include <nlohmann/json.hpp>

#include "zrt/checkpoint/fs_util.h"
#include "zrt/checkpoint/catalog.h"
#include "zrt/checkpoint/files.h"
#include "zrt/checkpoint/interchange/interchange.h"
#include "zrt/checkpoint/whole_group.h"
#include "zrt/checkpoint/shard_writer.h"
#include "tools/lib/ckpt_commands.h"

namespace zrt::tools {
namespace {

namespace fs = std::filesystem;
using namespace zrt::ckpt;

class CkptCommands : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = (fs::temp_directory_path() / ("zrt_cli_" + std::to_string(::getpid()))).string();
    fs::remove_all(root_);
    dir_ = Write(root_, [](int64_t, float v) { return v; });
  }
  // A 3-shard checkpoint of two tensors with known values: element i of tensor t = t*1000 + i (master;
  // through `edit(flat, v)`), moments = -(that).
  std::string Write(const std::string& root, const std::function<float(int64_t tensor_element, float v)>& edit) {
    Manifest m;
    m.nonce = "feedfacecafebeef";
    m.step = 42;
    m.world_size = world_;
    m.shards = 3;
    m.stage = 3;
    m.trainer_state = {{"seed", 9}};
    m.engine_state = {{"lr", 0.002}, {"weight_decay", 0.1}};
    m.groups.push_back({"g", 1e-3, 0, 4, {{"a", {5, 7}, DType::kBF16, 0, 35}, {"b", {9}, DType::kBF16, 36, 9}}, {"master", "exp_avg"}});
    const std::string dir = root + "/" + StepDirName(42);
    EXPECT_TRUE(MakeDirs(dir).ok());
    auto layout = SavedLayout(m, 0);
    auto io = IoEngine::Create(IoOptions{});
    EXPECT_TRUE(layout.ok() && io.ok());
    for (int r = 0; r < 3; ++r) {
      std::vector<std::vector<float>> data(2, std::vector<float>(static_cast<size_t>(layout->shard_size()), 0.0f));
      for (const ShardPiece& p : layout->RankPieces(r)) {
        for (int64_t i = 0; i < p.count; ++i) {
          const float v = static_cast<float>(p.tensor * 1000 + p.tensor_offset + i);
          data[0][static_cast<size_t>(p.shard_offset + i)] = edit(p.tensor * 1000 + p.tensor_offset + i, v);
          data[1][static_cast<size_t>(p.shard_offset + i)] = -v;
        }
      }
      StateView state;
      state.groups.push_back({"g", {}, *layout, {{"master", DType::kF32, data[0].data(), layout->shard_size()},
                                                 {"exp_avg", DType::kF32, data[1].data(), layout->shard_size()}}});
      EXPECT_TRUE(WriteShard(**io, dir, m, r, state).ok());
    }
    EXPECT_TRUE(WriteFileDurably(**io, dir, "manifest.json", EncodeManifest(m)).ok());
    return dir;
  }
  void TearDown() override { fs::remove_all(root_); }
  std::string root_, dir_;
  int world_ = 3;  // ranks that saved the 3 shards (6: two replica groups, hybrid sharding)
};

TEST_F(CkptCommands, LsInspectVerify) {
  std::ostringstream ls;
  ASSERT_TRUE(CkptLs(root_, false, ls).ok());
  EXPECT_NE(ls.str().find("step-00000042"), std::string::npos) << ls.str();
  EXPECT_NE(ls.str().find("complete"), std::string::npos);
  std::ostringstream js;
  ASSERT_TRUE(CkptInspect(dir_, "", true, true, js).ok());
  const auto j = nlohmann::json::parse(js.str());
  EXPECT_EQ(j["step"], 42);
  EXPECT_EQ(j["groups"][0]["ranks"].size(), 3u);
  const auto& a = j["groups"][0]["tensors"][0];
  EXPECT_EQ(a["name"], "a");
  EXPECT_EQ(a["stats"]["min"], 0);
  EXPECT_EQ(a["stats"]["max"], 34);
  EXPECT_EQ(j["groups"][0]["tensors"][1]["stats"]["max"], 1008);
  std::ostringstream text;
  ASSERT_TRUE(CkptInspect(dir_, "b", false, false, text).ok());
  EXPECT_NE(text.str().find("rank 2"), std::string::npos) << text.str();
  std::ostringstream v;
  EXPECT_TRUE(CkptVerify(dir_, false, v).ok()) << v.str();
  EXPECT_NE(v.str().find("OK"), std::string::npos);
}

TEST_F(CkptCommands, InspectShowsTheMesh) {
  std::ostringstream flat;
  ASSERT_TRUE(CkptInspect(dir_, "", false, false, flat).ok());
  EXPECT_NE(flat.str().find("mesh: 3 shard(s), one per rank"), std::string::npos) << flat.str();
  world_ = 6;
  const std::string hybrid = Write(root_ + "/hybrid", [](int64_t, float v) { return v; });
  std::ostringstream text;
  ASSERT_TRUE(CkptInspect(hybrid, "", false, false, text).ok());
  EXPECT_NE(text.str().find("saved by 6 rank(s)"), std::string::npos) << text.str();
  EXPECT_NE(text.str().find("mesh: hybrid sharding, 2 replica group(s) of 3 shard(s)"), std::string::npos) << text.str();
  std::ostringstream v;
  EXPECT_TRUE(CkptVerify(hybrid, false, v).ok()) << v.str();
}

TEST_F(CkptCommands, ReshardDiffExportImportAgree) {
  for (int threads : {1, 3}) {
    const std::string out = root_ + "/re" + std::to_string(threads);
    std::ostringstream os;
    ASSERT_TRUE(CkptReshard(dir_, out, 5, os, -1, threads).ok()) << os.str();
    std::ostringstream d;
    ASSERT_TRUE(CkptDiff(dir_, out + "/step-00000042", false, d).ok());
    EXPECT_NE(d.str().find("identical"), std::string::npos) << d.str();
    EXPECT_EQ(ReadManifest(out + "/step-00000042")->shards, 5);
  }
  std::ostringstream s0;
  ASSERT_TRUE(CkptReshard(dir_, root_ + "/s0", 4, s0, 0).ok());
  EXPECT_EQ(ReadManifest(root_ + "/s0/step-00000042")->shards, 1);
  std::ostringstream e, i, d;
  ASSERT_TRUE(CkptExport(dir_, root_ + "/x.h5", {.states = "all", .dtype = "f32"}, e).ok());
  ASSERT_TRUE(CkptImport(root_ + "/x.h5", root_ + "/imp", {.world_size = 2, .stage = 3}, i).ok());
  ASSERT_TRUE(CkptDiff(dir_, root_ + "/imp/step-00000042", true, d).ok());
  const auto diff = nlohmann::json::parse(d.str());  // keep it alive: the loop iterates a sub-object
  for (const auto& row : diff["tensors"]) EXPECT_EQ(row["max_abs"], 0.0) << row.dump();
  // What the engine restores travels through reshard and HDF5 too.
  for (const std::string& copy : {root_ + "/s0/step-00000042", root_ + "/imp/step-00000042"}) {
    auto m = ReadManifest(copy);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->engine_state["lr"], 0.002) << copy;
    EXPECT_EQ(m->trainer_state["seed"], 9) << copy;
  }
}

TEST_F(CkptCommands, DiffSeesNanAndInfinityAndExitsNonZeroWhenDifferent) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::string both_nan_a = Write(root_ + "/na", [&](int64_t e, float v) { return e == 3 ? nan : v; });
  const std::string both_nan_b = Write(root_ + "/nb", [&](int64_t e, float v) { return e == 3 ? nan : v; });
  std::ostringstream same;
  EXPECT_TRUE(CkptDiff(both_nan_a, both_nan_b, false, same).ok()) << same.str();  // NaN where the other has NaN
  for (const auto& [what, value] : std::vector<std::pair<const char*, float>>{{"NaN", nan}, {"inf", inf}, {"-inf", -inf}, {"1e-7", 1e-7f}}) {
    SCOPED_TRACE(what);
    const std::string other = Write(root_ + "/" + what, [&](int64_t e, float v) { return e == 1 ? v + value : v; });
    std::ostringstream text, js;
    Status s = CkptDiff(dir_, other, false, text);
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << text.str();
    EXPECT_NE(text.str().find("differ\n"), std::string::npos) << text.str();
    EXPECT_FALSE(CkptDiff(dir_, other, true, js).ok());
    const auto j = nlohmann::json::parse(js.str());
    EXPECT_FALSE(j["identical"].get<bool>());
    EXPECT_EQ(j["elements_differing"], 1);
  }
}

TEST_F(CkptCommands, ProblemsAreStatuses) {
  std::ostringstream os;
  EXPECT_EQ(CkptLs(root_ + "/none", false, os).code(), StatusCode::kNotFound);
  EXPECT_FALSE(CkptInspect(root_, "", false, false, os).ok());
  fs::remove(dir_ + "/" + IndexFileName(1));
  std::ostringstream v;
  Status s = CkptVerify(dir_, false, v);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(v.str().find("rank-00001.index.json: missing"), std::string::npos) << v.str();
  EXPECT_EQ(CkptReshard(dir_, root_ + "/r", 2, os).code(), StatusCode::kDataLoss);  // incomplete input
  EXPECT_EQ(CkptReshard(dir_, root_ + "/r", 0, os).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(CkptExport(dir_, root_ + "/y.h5", {.dtype = "f64"}, os).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zrt::tools
