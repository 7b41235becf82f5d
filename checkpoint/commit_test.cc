// The commit protocol on in-process ranks (1-3): a save becomes ROOT/step-N with `latest` only when
// every rank's write succeeded and the directory is complete; a failure on any one rank (or of the
// commit itself) is every rank's error, leaves no temp directory and never touches the previous
// checkpoint; retention keeps the newest K and every multiple; dead saves are removed at start-up.
#include "zrt/checkpoint/commit.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tests/support/io_hooks.h"
#include "tests/support/synthetic_state.h"
#include "zrt/checkpoint/catalog.h"
#include "zrt/checkpoint/format.h"
#include "zrt/checkpoint/fs_util.h"
#include "zrt/checkpoint/shard_writer.h"
#include "zrt/core/communicator.h"

namespace zrt::ckpt {
namespace {

namespace fs = std::filesystem;

class CommitTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("zrt_commit_" + std::to_string(::getpid()) + "_" + std::to_string(GetParam()));
    fs::remove_all(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  // Every rank writes its shard of the synthetic state for `step`; `fail_rank` fails its write.
  Status SaveStep(int64_t step, int fail_rank = -1, IoHooks* leader_hooks = nullptr, const Retention& retention = {}) {
    const int n = GetParam();
    std::string nonce = NewNonce();
    return RunLoopbackRanks(n, [&](Communicator& comm) -> Status {
      testing::SyntheticState state(testing::SmallModel(), n, comm.rank(), 16, true);
      Manifest m;
      m.nonce = nonce;
      m.step = step;
      m.world_size = m.shards = n;
      m.stage = 3;
      m.chunk_elements = 1024;
      for (const StateGroup& g : state.view.groups) {
        GroupEntry ge{g.name, g.lr, 0, g.layout.alignment(), {}, testing::StateKinds()};
        for (size_t t = 0; t < g.tensors.size(); ++t) {
          ge.tensors.push_back({g.tensors[t].name, g.tensors[t].shape, g.tensors[t].dtype, g.layout.tensor_offset(static_cast<int64_t>(t)),
                                g.tensors[t].numel()});
        }
        m.groups.push_back(std::move(ge));
      }
      ASSIGN_OR_RETURN(auto io, IoEngine::Create({}, comm.rank() == 0 ? leader_hooks : nullptr));
      const SaveDir save = SaveDirFor(root_.string(), step, nonce);
      Status local = BeginSave(save);
      if (local.ok()) local = WriteShard(*io, save.tmp, m, comm.rank(), state.view);
      if (local.ok() && comm.rank() == 0) local = PublishFile(*io, save.tmp, kManifestFile, EncodeManifest(m));
      if (comm.rank() == fail_rank) local = IoError("injected failure on rank ", fail_rank);
      Status s = Commit(&comm, local, save, retention, *io);
      if (fail_rank >= 0 && comm.rank() != fail_rank && !s.ok()) {
        EXPECT_NE(s.message().find("failed on rank " + std::to_string(fail_rank)), std::string_view::npos) << s;
      }
      return s;
    });
  }
  std::vector<std::string> Names() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(root_)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
  std::string Latest() const {
    std::ifstream in(root_ / "latest");
    std::string s;
    std::getline(in, s);
    return s;
  }
  fs::path root_;
};

TEST_P(CommitTest, ACompleteSaveBecomesTheStepDirectoryAndLatest) {
  ASSERT_TRUE(SaveStep(5).ok());
  EXPECT_EQ(Names(), (std::vector<std::string>{"latest", "step-00000005"}));
  EXPECT_EQ(Latest(), "step-00000005");
  std::vector<std::string> problems;
  ASSERT_TRUE(CheckComplete((root_ / "step-00000005").string(), VerifyLevel::kFull, &problems).ok());
  EXPECT_TRUE(problems.empty()) << problems.front();
}

TEST_P(CommitTest, AFailureOnAnyRankOrOfTheCommitKeepsThePreviousCheckpoint) {
  ASSERT_TRUE(SaveStep(1).ok());
  for (int victim = 0; victim < GetParam(); ++victim) {
    Status s = SaveStep(2, victim);
    EXPECT_FALSE(s.ok());
    EXPECT_EQ(Names(), (std::vector<std::string>{"latest", "step-00000001"})) << "victim " << victim;
  }
  testing::FnIoHooks commit_fails;
  commit_fails.file_op = [](std::string_view op, const std::string&) { return op == "commit" ? EIO : 0; };
  Status s = SaveStep(3, -1, &commit_fails);
  EXPECT_EQ(s.code(), StatusCode::kIo) << s;
  EXPECT_EQ(Names(), (std::vector<std::string>{"latest", "step-00000001"}));
  EXPECT_EQ(Latest(), "step-00000001");
}

TEST_P(CommitTest, RetentionKeepsTheNewestAndEveryMultiple) {
  for (int64_t step = 1; step <= 7; ++step) ASSERT_TRUE(SaveStep(step, -1, nullptr, Retention{2, 3}).ok());
  EXPECT_EQ(Names(), (std::vector<std::string>{"latest", "step-00000003", "step-00000006", "step-00000007"}));
  // An incomplete directory is never deleted by retention (it may be being repaired by hand).
  fs::create_directories(root_ / "step-00000002");
  ASSERT_TRUE(SaveStep(8, -1, nullptr, Retention{1, 0}).ok());
  EXPECT_EQ(Names(), (std::vector<std::string>{"latest", "step-00000002", "step-00000008"}));
}

TEST_P(CommitTest, StartupRepairsWhatAKillLeftAtAnyStep) {
  for (int64_t step = 1; step <= 3; ++step) ASSERT_TRUE(SaveStep(step).ok());
  auto io = IoEngine::Create();
  ASSERT_TRUE(io.ok());
  // Killed inside a save, inside a retention deletion (after the rename to a dead name), after a
  // commit's rename but before `latest` moved, and inside the pointer's own write.
  fs::create_directories(root_ / "step-00000004.tmp-0123456789abcdef");
  fs::rename(root_ / "step-00000001", root_ / "step-00000001.dead-0123456789abcdef");
  std::ofstream(root_ / "latest", std::ios::trunc) << "step-00000002\n";
  std::ofstream(root_ / "latest.tmp") << "step-00000004";
  ASSERT_TRUE(RepairRoot(root_.string(), Retention{1, 0}, **io).ok());
  EXPECT_EQ(Names(), (std::vector<std::string>{"latest", "step-00000003"}));
  EXPECT_EQ(Latest(), "step-00000003");
  // Nothing to repair: nothing changes.
  ASSERT_TRUE(RepairRoot(root_.string(), Retention{1, 0}, **io).ok());
  EXPECT_EQ(Names(), (std::vector<std::string>{"latest", "step-00000003"}));
}

TEST_P(CommitTest, ACommitRemovesEarlierDeadAttemptsAtTheSameStep) {
  fs::create_directories(root_ / "step-00000009.tmp-00000000000000aa");  // a killed reshard of step 9
  fs::create_directories(root_ / "step-00000010.tmp-00000000000000bb");  // another step: not touched
  ASSERT_TRUE(SaveStep(9).ok());
  EXPECT_EQ(Names(), (std::vector<std::string>{"latest", "step-00000009", "step-00000010.tmp-00000000000000bb"}));
}

INSTANTIATE_TEST_SUITE_P(Ranks, CommitTest, ::testing::Values(1, 2, 3));

TEST(Nonce, SixteenHexDigitsAndFresh) {
  const std::string a = NewNonce(), b = NewNonce();
  EXPECT_EQ(a.size(), 16u);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_NE(a, b);
}

}  // namespace
}  // namespace zrt::ckpt
