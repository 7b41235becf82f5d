// The memory tier at 1..4 MPI ranks with the real engine (stages 0, 2, 3, NVMe-offloaded state, and
// state in emulated device memory): a restart resumes the newest snapshot and continues bit for bit as
// the uninterrupted run; a rank whose own copy is gone or corrupt is served by its peer's replica (a
// live one at stage 0; every rank agrees), a corrupt replica caught where it lands; the loss of a
// whole (emulated) node is survived; a rank with no copy at all makes every rank fall back to disk;
// budgets, superseding and end-of-run cleanup; snapshots and disk saves captured in the background
// while the owner goes on, its waits counted in the save's stall. Kills: tests/crash/tier_kill.sh.
#include <gtest/gtest.h>
#include <mpi.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "zrt/checkpoint/catalog.h"
#include "zrt/checkpoint/checkpointer.h"
#include "zrt/checkpoint/format.h"
#include "zrt/checkpoint/tier/memory_tier.h"
#include "zrt/core/mpi_communicator.h"
#include "zrt/runtime/engine.h"
#include "tests/support/scratch_root.h"
#include "tests/support/state_values.h"

namespace zrt::ckpt {
namespace {

namespace fs = std::filesystem;

struct Case {
  int stage;
  bool nvme;
  bool device_memory = false;  // the engine's state in "device" memory (CpuDevice(false): read through copies)
};

std::vector<std::vector<float>> StateNow(ZeroEngine& e) { return testing::ReadState(e.state_view()); }

class TierTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    auto c = MpiCommunicator::Create(MPI_COMM_WORLD);
    ASSERT_TRUE(c.ok());
    comm_ = std::move(*c);
    char path[512] = {};
    if (comm_->rank() == 0) {
      const std::string p = (fs::temp_directory_path() / ("zrt_tier_" + std::to_string(::getpid()))).string();
      fs::remove_all(p);
      fs::create_directories(p + "/swap");
      std::snprintf(path, sizeof(path), "%s", p.c_str());
    }
    ASSERT_TRUE(comm_->Broadcast(path, sizeof(path), DType::kBytes, 0).ok());
    base_ = path;
    root_ = base_ + "/ckpt";
    // Two emulated nodes at 4 ranks; one rank per node below.
    tier_.dir = testing::TierScratchDir(base_);
    if (comm_->rank() == 0) {
      fs::remove_all(tier_.dir);
      fs::create_directories(tier_.dir);
    }
    ASSERT_TRUE(comm_->Barrier().ok());
    tier_.ranks_per_node = n() == 4 ? 2 : 1;
  }
  void TearDown() override {
    ASSERT_TRUE(comm_->Barrier().ok());
    if (comm_->rank() == 0) {
      fs::remove_all(tier_.dir);
      fs::remove_all(base_);
    }
  }
  int n() const { return comm_->size(); }
  // Stage 0 on several ranks: the ranks' own copies are each other's replicas (tier_dir.h), no replica files.
  bool Live() const { return GetParam().stage == 0 && n() > 1; }
  int rank() const { return comm_->rank(); }

  // `big` > 0: a third tensor of that many elements in group "a" (a copy that takes a while) and,
  // where the parameters are host memory, a frozen group "f" (its values read through casts; on a
  // device those run on the compute stream and the snapshot copies at once).
  std::unique_ptr<ZeroEngine> Engine(int64_t big = 0) {
    EngineConfig cfg;
    cfg.stage = GetParam().stage;
    cfg.adam.lr = 1e-2;
    if (GetParam().nvme) {
      cfg.offload.optimizer = OffloadTarget::kNvme;
      cfg.offload.nvme_dir = base_ + "/swap";
      cfg.offload.sub_group_elements = 1024;
    }
    auto e = ZeroEngine::Create(comm_.get(), &engine_device_, cfg);
    EXPECT_TRUE(e.ok()) << e.status();
    EXPECT_TRUE((*e)->AddParam("w", {37, 29}, DType::kBF16, {.group = "a"}).ok());
    EXPECT_TRUE((*e)->AddParam("b", {1001}, DType::kBF16, {.group = "b"}).ok());
    big_ = big;
    if (big > 0) {
      EXPECT_TRUE((*e)->AddParam("big", {big}, DType::kBF16, {.group = "a"}).ok());
      if (!GetParam().device_memory) {
        EXPECT_TRUE((*e)->AddParam("frozen", {3001}, DType::kBF16, {.group = "f", .frozen = true}).ok());
      }
    }
    const Status finalized = (*e)->Finalize([](int64_t p, int64_t off, int64_t k, float* out) {
      for (int64_t i = 0; i < k; ++i) out[i] = 0.01f * static_cast<float>((p * 7919 + off + i) % 101) - 0.5f;
    });
    EXPECT_TRUE(finalized.ok()) << finalized;
    return std::move(*e);
  }
  std::unique_ptr<Checkpointer> Ck(MemoryTierOptions t) {
    auto ck = Checkpointer::Create(comm_.get(), &device_, {.root = root_, .chunk_elements = 1024, .memory = t});
    EXPECT_TRUE(ck.ok()) << ck.status();
    return std::move(*ck);
  }
  // Steps [from, to): gradients a function of (step, rank); a tier snapshot after every step, a disk
  // save every `disk_every` steps; Poll each step.
  // `dense`: every gradient element set (the step changes every rank's shard), not the first 500.
  void Train(ZeroEngine& e, Checkpointer* ck, int from, int to, int disk_every = 0, bool dense = false) {
    for (int s = from; s < to; ++s) {
      for (int g = 0; g < 2; ++g) {
        ASSERT_TRUE(e.Gather(g).ok());
        auto gb = e.GradBuffer(g);
        ASSERT_TRUE(gb.ok());
        auto* p = static_cast<uint16_t*>(*gb);
        const int64_t k = !dense ? 500 : g == 1 ? 1001 : 37 * 29 + big_;
        for (int64_t i = 0; i < k; ++i) p[i] = FloatToBf16(0.001f * static_cast<float>(i % 13 + rank() + s));
        ASSERT_TRUE(e.Release(g).ok());
        ASSERT_TRUE(e.GradsReady(g).ok());
      }
      ASSERT_TRUE(e.Step().ok());
      if (ck == nullptr) continue;
      if (disk_every > 0 && (s + 1) % disk_every == 0) {
        ASSERT_TRUE(ck->SaveAsync(e.state_view(), {{"s", s + 1}}).ok());
      }
      Status saved = ck->SaveToMemory(e.state_view(), {{"s", s + 1}});
      ASSERT_TRUE(saved.ok()) << saved;
      Status polled = ck->Poll();
      ASSERT_TRUE(polled.ok()) << polled;
    }
  }
  std::vector<std::vector<uint16_t>> Params(ZeroEngine& e) {
    std::vector<std::vector<uint16_t>> out;
    for (int g = 0; g < 2; ++g) {
      auto p = e.Gather(g);
      EXPECT_TRUE(p.ok());
      const size_t k = g == 0 ? 37 * 29 : 1001;
      out.emplace_back(static_cast<const uint16_t*>(*p), static_cast<const uint16_t*>(*p) + k);
      EXPECT_TRUE(e.Release(g).ok());
    }
    return out;
  }
  // The uninterrupted run's parameters after `steps`.
  std::vector<std::vector<uint16_t>> Reference(int steps) {
    auto e = Engine();
    Train(*e, nullptr, 0, steps);
    return Params(*e);
  }
  // Trains 0..5 with a tier snapshot every step and a disk save at step 2, then "dies" (the objects go
  // away without a final save: the tier keeps its newer state).
  void RunAndDie() {
    auto e = Engine();
    auto ck = Ck(tier_);
    Train(*e, ck.get(), 0, 5, 2);
    ASSERT_TRUE(ck->Wait().ok());
    const MemoryTierStats* st = ck->memory_stats();
    ASSERT_NE(st, nullptr);
    EXPECT_EQ(st->step, 5);
    EXPECT_GT(st->snapshot_bytes, 0);
    EXPECT_GE(st->bytes_held, st->snapshot_bytes * (n() > 1 ? 2 : 1));
    EXPECT_LE(st->bytes_held, st->budget_bytes);
    ck.reset();
    ASSERT_TRUE(comm_->Barrier().ok());  // every rank's objects gone before the test touches the files
  }
  // Resumes a fresh engine, checks every rank resumed the same step, trains to 8, compares to the
  // reference. Returns this rank's source.
  std::string ResumeAndFinish(int64_t want_step) {
    auto e = Engine();
    auto ck = Ck(tier_);
    auto r = ck->Resume(e->state_view());
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return "";
    EXPECT_EQ(e->steps(), want_step);
    EXPECT_EQ(r->loaded.trainer_state.value("s", -1), want_step);
    EXPECT_EQ(r->step, want_step);
    Train(*e, ck.get(), static_cast<int>(e->steps()), 8);
    EXPECT_TRUE(ck->Wait().ok());
    EXPECT_EQ(Params(*e), reference_) << "rank " << rank() << " did not continue as the uninterrupted run";
    return r->source;
  }
  std::string OwnData(int r, int64_t step) {
    const std::string d = MemoryTier::RankDir(root_, tier_, r) + "/own/" + StepDirName(step);
    for (const auto& f : fs::directory_iterator(d)) {
      if (f.path().extension() == ".data") return f.path().string();
    }
    return "";
  }
  // Rank q's replica's directory (on its holder).
  std::string ReplicaOf(int q, int64_t step) {
    const int d = n() > tier_.ranks_per_node ? tier_.ranks_per_node : 1;
    char name[32];
    std::snprintf(name, sizeof(name), "replica-%05d", q);
    return MemoryTier::RankDir(root_, tier_, (q + d) % n()) + "/" + name + "/" + StepDirName(step);
  }
  // The newest disk checkpoint is of `step` and holds `want` (resumed into a fresh engine, no tier).
  void ExpectDiskHolds(int64_t step, const std::vector<std::vector<float>>& want) {
    auto e = Engine();
    auto ck = Checkpointer::Create(comm_.get(), &device_, {.root = root_, .chunk_elements = 1024});
    ASSERT_TRUE(ck.ok());
    auto r = (*ck)->Resume(e->state_view());
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->step, step);
    EXPECT_EQ(StateNow(*e), want);
  }
  // Rank 0 changes files; everyone waits for it.
  template <class F>
  void OnRank0(F f) {
    if (rank() == 0) f();
    ASSERT_TRUE(comm_->Barrier().ok());
  }
  // Every rank's source, on rank 0.
  std::vector<std::string> Gather(const std::string& mine) {
    char buf[16] = {};
    std::snprintf(buf, sizeof(buf), "%s", mine.c_str());
    std::vector<char> all(16 * static_cast<size_t>(n()));
    EXPECT_TRUE(comm_->AllGather(buf, all.data(), 16, DType::kBytes).ok());
    std::vector<std::string> out;
    for (int r = 0; r < n(); ++r) out.emplace_back(all.data() + 16 * r);
    return out;
  }

  CpuDevice device_;  // the checkpoints' staging
  CpuDevice engine_device_{!GetParam().device_memory};
  std::unique_ptr<MpiCommunicator> comm_;
  std::string base_, root_;
  MemoryTierOptions tier_;
  int64_t big_ = 0;  // Engine's
  std::vector<std::vector<uint16_t>> reference_;
};

TEST_P(TierTest, RestartResumesTheNewestSnapshotAndContinuesBitForBit) {
  reference_ = Reference(8);
  RunAndDie();
  const auto sources = Gather(ResumeAndFinish(5));
  for (const std::string& s : sources) EXPECT_EQ(s, "memory");
}

TEST_P(TierTest, AMissingOrCorruptOwnCopyIsServedByThePeersReplica) {
  if (n() == 1) GTEST_SKIP() << "replicas need a peer";
  reference_ = Reference(8);
  RunAndDie();
  const bool both = !(Live() && n() == 2);  // live replicas on 2 ranks: the shard's only two copies
  OnRank0([&] {
    if (both) fs::remove_all(fs::path(OwnData(n() - 1, 5)).parent_path());  // the last rank's copy is gone
    std::fstream f(OwnData(0, 5), std::ios::in | std::ios::out | std::ios::binary);  // a byte of rank 0's flips
    f.seekp(100);
    f.put('\x5a');
  });
  const auto sources = Gather(ResumeAndFinish(5));
  EXPECT_EQ(sources[0], "peer");
  EXPECT_EQ(sources[static_cast<size_t>(n() - 1)], both ? "peer" : "memory");
  for (int r = 1; r < n() - 1; ++r) EXPECT_EQ(sources[static_cast<size_t>(r)], "memory");
}

TEST_P(TierTest, TheLossOfANodeIsSurvivedThroughReplicasOnTheOtherNode) {
  if (n() == 1) GTEST_SKIP() << "one rank: no other node";
  reference_ = Reference(8);
  RunAndDie();
  // Node 0's memory is gone: its ranks' own copies and the replicas they held for node 1.
  OnRank0([&] {
    for (int r = 0; r < tier_.ranks_per_node; ++r) fs::remove_all(MemoryTier::RankDir(root_, tier_, r));
  });
  const auto sources = Gather(ResumeAndFinish(5));
  for (int r = 0; r < n(); ++r) EXPECT_EQ(sources[static_cast<size_t>(r)], r < tier_.ranks_per_node ? "peer" : "memory") << r;
}

TEST_P(TierTest, ARankWithNoUsableCopyMakesEveryRankResumeFromDisk) {
  reference_ = Reference(8);
  RunAndDie();
  OnRank0([&] {
    const std::string d = fs::path(OwnData(0, 5)).parent_path().string();
    fs::remove_all(d);
    for (int r = 1; Live() && r < n(); ++r) fs::remove_all(fs::path(OwnData(r, 5)).parent_path());  // every live replica
    if (!Live() && n() > 1) fs::remove_all(ReplicaOf(0, 5));
  });
  // The disk checkpoint of step 4 (saves at 2 and 4).
  const auto sources = Gather(ResumeAndFinish(4));
  for (const std::string& s : sources) EXPECT_EQ(s, "disk");
}

TEST_P(TierTest, AReplicaThatIsNotWhatItsRankNeedsIsRefusedAndEveryRankUsesDisk) {
  if (n() == 1 || Live()) GTEST_SKIP() << "no replica files: one rank, or live replicas (hybrid_test corrupts those)";
  reference_ = Reference(8);
  RunAndDie();
  // Rank 0's own copy gone, and the replica its holder would send has grown by a few MiB (a bad file
  // must not make rank 0 allocate what the file says, nor be loaded).
  OnRank0([&] {
    fs::remove_all(fs::path(OwnData(0, 5)).parent_path());
    for (const auto& f : fs::directory_iterator(ReplicaOf(0, 5))) {
      if (f.path().extension() == ".data") fs::resize_file(f.path(), fs::file_size(f.path()) + (4 << 20));
    }
  });
  const auto sources = Gather(ResumeAndFinish(4));
  for (const std::string& s : sources) EXPECT_EQ(s, "disk");
}

// Rank 0's own copy gone and a byte of the replica its holder sends flipped: the replica is received
// (straight into the state where it is host memory, else as a file) and fails its check there; every
// rank falls back to disk together. The same with the replica's index naming another checksum.
TEST_P(TierTest, ACorruptReplicaIsCaughtWhereItLandsAndEveryRankUsesDisk) {
  if (n() == 1 || Live()) GTEST_SKIP() << "no replica files: one rank, or live replicas (hybrid_test corrupts those)";
  for (const bool in_index : {false, true}) {
    SCOPED_TRACE(in_index ? "index" : "data");
    reference_ = Reference(8);
    RunAndDie();
    OnRank0([&] {
      fs::remove_all(fs::path(OwnData(0, 5)).parent_path());
      std::string index, data;
      for (const auto& f : fs::directory_iterator(ReplicaOf(0, 5))) {
        if (f.path().extension() == ".data") data = f.path().string();
        if (f.path().filename().string().starts_with("rank-") && f.path().extension() == ".json") index = f.path().string();
      }
      std::ifstream in(index);
      auto idx = DecodeIndex(std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()), index);
      ASSERT_TRUE(idx.ok()) << idx.status();
      ChunkEntry& c = idx->chunks.back();
      if (in_index) {
        c.xxh3 ^= 1;
        std::ofstream(index, std::ios::trunc) << EncodeIndex(*idx);
      } else {  // a byte inside the last chunk's data
        std::fstream d(data, std::ios::in | std::ios::out | std::ios::binary);
        const char flipped = static_cast<char>(d.seekg(c.file_offset + c.stored_bytes / 2).get() ^ 0x01);
        d.seekp(c.file_offset + c.stored_bytes / 2).put(flipped);
      }
    });
    const auto sources = Gather(ResumeAndFinish(4));
    for (const std::string& s : sources) EXPECT_EQ(s, "disk");
    OnRank0([&] { fs::remove_all(root_), fs::remove_all(tier_.dir), fs::create_directories(tier_.dir); });
  }
}

TEST_P(TierTest, BudgetsSupersedingAndCleanup) {
  {  // a budget below two generations is refused at the first snapshot, on every rank, naming the sizes
    MemoryTierOptions small = tier_;
    small.budget_bytes = 4096;
    auto e = Engine();
    auto ck = Ck(small);
    Status s = ck->SaveToMemory(e->state_view());
    EXPECT_EQ(s.code(), StatusCode::kOutOfMemory) << s;
    EXPECT_NE(s.message().find("budget of 4096 bytes"), std::string_view::npos) << s;
  }
  {
    auto e = Engine();
    auto ck = Ck(tier_);
    Train(*e, ck.get(), 0, 3);
    ASSERT_TRUE(ck->Wait().ok());
    EXPECT_EQ(ck->memory_stats()->step, 3);
    // Only the newest generation is kept once committed, and the data file of one before it to be
    // written over by the next (its memory pages are already there).
    std::vector<std::string> gens;
    for (const auto& f : fs::directory_iterator(MemoryTier::RankDir(root_, tier_, rank()) + "/own")) gens.push_back(f.path().filename());
    std::sort(gens.begin(), gens.end());
    EXPECT_EQ(gens, (std::vector<std::string>{"spare.data", StepDirName(3)}));
    // A spare.data that is not a plain file (a link planted there) is never written through.
    const std::string victim = root_ + "-victim-" + std::to_string(rank());
    std::ofstream(victim) << "keep";
    fs::remove(MemoryTier::RankDir(root_, tier_, rank()) + "/own/spare.data");
    fs::create_symlink(victim, MemoryTier::RankDir(root_, tier_, rank()) + "/own/spare.data");
    Train(*e, ck.get(), 3, 4);
    ASSERT_TRUE(ck->Wait().ok());
    EXPECT_EQ(ck->memory_stats()->step, 4);
    EXPECT_EQ(fs::file_size(victim), 4u) << "written through a link";
    fs::remove(victim);
    // A disk checkpoint of a newer step supersedes the tier's files.
    Train(*e, nullptr, 4, 5);
    ASSERT_TRUE(ck->SaveAsync(e->state_view()).ok());
    ASSERT_TRUE(ck->Wait().ok());
    EXPECT_EQ(ck->memory_stats()->step, -1);
    EXPECT_TRUE(fs::is_empty(MemoryTier::RankDir(root_, tier_, rank()) + "/own"));
    // End of a run whose last disk checkpoint holds everything: the tier's directory is removed.
    ASSERT_TRUE(ck->SaveToMemory(e->state_view()).ok());  // step 5 again: as new as the disk's
    ASSERT_TRUE(ck->Wait().ok());
  }
  ASSERT_TRUE(comm_->Barrier().ok());
  EXPECT_FALSE(fs::exists(MemoryTier::RankDir(root_, tier_, rank())));
  if (rank() == 0) {
    EXPECT_FALSE(fs::exists(MemoryTier::JobDir(root_, tier_)));
  }
  // A half-written snapshot left by a kill is removed at start-up and never used.
  OnRank0([&] { fs::create_directories(MemoryTier::RankDir(root_, tier_, 0) + "/own/step-00000009.tmp/junk"); });
  {
    auto ck = Ck(tier_);
    EXPECT_FALSE(fs::exists(MemoryTier::RankDir(root_, tier_, 0) + "/own/step-00000009.tmp"));
  }
}

// A sink between the engine and a saver that counts the parts, or fails on one rank the way an
// owner's delivery can: a Put that fails, or parts that never come though the owner says it is done;
// or that wrecks each part's source memory as soon as the saver returned from its Put (a saver must
// have copied it by then). It adds up what the owner said this capture made it wait.
class Relay final : public StateSink {
 public:
  enum Mode { kPass, kPutFails, kPartsLost, kWreck };
  Relay(std::shared_ptr<StateSink> inner, Mode mode, int* puts, double* charged)
      : inner_(std::move(inner)), mode_(mode), puts_(puts), charged_(charged) {}
  Status Put(int group, int buffer, int64_t offset, int64_t n, const float* data) override {
    if (++*puts_ >= 3 && mode_ == kPutFails) return DataLossError("sabotaged put");
    if (*puts_ >= 3 && mode_ == kPartsLost) return Status();  // dropped
    Status s = inner_->Put(group, buffer, offset, n, data);
    if (mode_ == kWreck) std::fill_n(const_cast<float*>(data), n, 1e30f);
    return s;
  }
  void Waited(double seconds) override {
    *charged_ += seconds;
    inner_->Waited(seconds);
  }
  void Close(const Status& status) override { inner_->Close(status); }

 private:
  std::shared_ptr<StateSink> inner_;
  Mode mode_;
  int* puts_;
  double* charged_;
};
// The engine as its views' owner, with every capture's sink wrapped in a Relay; what the savers told
// it they made it wait (Stalled) added up too.
class RelayOwner final : public StateOwner {
 public:
  RelayOwner(StateOwner* inner, Relay::Mode mode) : inner_(inner), mode_(mode) {}
  Status Capture(std::shared_ptr<StateSink> sink) override {
    return inner_->Capture(std::make_shared<Relay>(std::move(sink), mode_, &puts, &charged));
  }
  Status Settle() override { return inner_->Settle(); }
  Status Read(int g, int b, int64_t off, int64_t n, float* out) override { return inner_->Read(g, b, off, n, out); }
  Status Write(int g, int b, int64_t off, int64_t n, const float* in) override { return inner_->Write(g, b, off, n, in); }
  Status Restore(const StateCounters& saved) override { return inner_->Restore(saved); }
  void Stalled(double seconds) override {
    charged += seconds;
    inner_->Stalled(seconds);
  }
  int puts = 0;
  double charged = 0;

 private:
  StateOwner* inner_;
  Relay::Mode mode_;
};
// `v` owned through `relay`.
StateView Relayed(StateView v, RelayOwner* relay) {
  v.owner = relay;
  return v;
}

// State offloaded to NVMe is snapshotted by the owner's next step (no read while training waits),
// beside a disk save of the same step waiting for the same step; a commit before any step has it
// delivered at once. Both copies hold the state as it was when saved.
// The tier's directory under /dev/shm has a predictable name: what zrt makes there is the user's
// alone (directories 0700, files 0600), and one that another user made or may write is never used.
TEST_P(TierTest, ItsDirectoriesAndFilesAreTheUsersAlone) {
  const std::string job = MemoryTier::JobDir(root_, tier_);
  auto mode = [](const fs::path& p) {
    struct stat st {};
    EXPECT_EQ(::lstat(p.c_str(), &st), 0) << p;
    return st.st_mode & 07777;
  };
  {
    auto e = Engine();
    auto ck = Ck(tier_);
    Train(*e, ck.get(), 0, 2);
    ASSERT_TRUE(ck->Wait().ok());
    ASSERT_TRUE(comm_->Barrier().ok());
    OnRank0([&] {
      EXPECT_EQ(mode(job), 0700u);
      int files = 0;
      for (const auto& f : fs::recursive_directory_iterator(job)) {
        if (f.is_symlink()) continue;
        EXPECT_EQ(mode(f.path()), f.is_directory() ? 0700u : 0600u) << f.path();
        files += f.is_regular_file();
      }
      EXPECT_GE(files, 3 * n());  // each rank's data, index and manifest at least
    });
    if (GetParam().nvme) {  // the swap files beside them
      const fs::path swap = fs::path(base_) / "swap" / ("zrt-swap.rank" + std::to_string(rank()));
      EXPECT_EQ(mode(swap), 0700u);
      for (const auto& f : fs::directory_iterator(swap)) EXPECT_EQ(mode(f.path()), 0600u) << f.path();
    }
  }
  ASSERT_TRUE(comm_->Barrier().ok());  // every rank's tier gone (the last of a node removes the job's directory) before the plant
  // Planted before the job starts: a directory of the tier's name that another user owns (as root),
  // or that others may write. Every rank refuses it, and writes nothing into it.
  OnRank0([&] {
    fs::remove_all(job);
    fs::create_directories(job);
    if (::geteuid() == 0) {
      EXPECT_EQ(::chown(job.c_str(), 65534, 65534), 0);
    } else {
      fs::permissions(job, fs::perms::all);
    }
  });
  auto ck = Checkpointer::Create(comm_.get(), &device_, {.root = root_, .chunk_elements = 1024, .memory = tier_});
  ASSERT_FALSE(ck.ok());
  EXPECT_EQ(ck.status().code(), StatusCode::kFailedPrecondition) << ck.status();
  EXPECT_NE(ck.status().message().find(job + " is "), std::string_view::npos) << ck.status();
  EXPECT_NE(ck.status().message().find("refused"), std::string_view::npos) << ck.status();
  OnRank0([&] {
    EXPECT_TRUE(fs::is_empty(job));
    fs::remove_all(job);
  });
}

TEST_P(TierTest, NvmeStateIsTakenByTheNextStepBesideADiskSave) {
  if (!GetParam().nvme) GTEST_SKIP() << "resident state is copied at once";
  auto e = Engine();
  auto ck = Ck(tier_);
  Train(*e, ck.get(), 0, 2);
  ASSERT_TRUE(ck->Wait().ok());
  Train(*e, nullptr, 2, 3);
  const auto saved = StateNow(*e);
  ASSERT_TRUE(ck->SaveAsync(e->state_view()).ok());
  RelayOwner relay(e->state_view().owner, Relay::kPass);
  ASSERT_TRUE(ck->SaveToMemory(Relayed(e->state_view(), &relay)).ok());
  ASSERT_TRUE(ck->Poll().ok());
  // Nothing of step 3 was read or sealed before the step that hands it over, here or on any rank.
  EXPECT_EQ(relay.puts, 0);
  EXPECT_EQ(ck->memory_stats()->step, 2);
  EXPECT_FALSE(fs::exists(MemoryTier::RankDir(root_, tier_, rank()) + "/own/" + StepDirName(3)));
  Train(*e, nullptr, 3, 4);  // hands step 3's state to both saves before changing it
  EXPECT_GT(relay.puts, 0);
  ASSERT_TRUE(ck->Poll().ok());
  ASSERT_TRUE(ck->Wait().ok());
  EXPECT_EQ(ck->memory_stats()->step, 3);
  // Step 4, committed before any step came: delivered at once.
  const auto saved4 = StateNow(*e);
  ASSERT_TRUE(ck->SaveToMemory(e->state_view()).ok());
  ASSERT_TRUE(ck->Wait().ok());
  EXPECT_EQ(ck->memory_stats()->step, 4);
  ck.reset();
  e.reset();
  ASSERT_TRUE(comm_->Barrier().ok());
  {  // the tier holds step 4 as it was
    auto e2 = Engine();
    auto ck2 = Ck(tier_);
    auto r = ck2->Resume(e2->state_view());
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->step, 4);
    EXPECT_EQ(r->source, "memory");
    EXPECT_EQ(StateNow(*e2), saved4);
    // Step 3's tier copy (removed once 4 committed) was checked through the disk save beside it.
  }
  ASSERT_TRUE(comm_->Barrier().ok());
  ExpectDiskHolds(3, saved);  // the disk save of step 3 that waited beside the tier's snapshot
}

// One rank's hand-over fails (or, NVMe state, its engine goes before the step that owes it): the
// snapshot is dropped on every rank, the previous generation stays the newest, nothing half-written
// stays, and the next works; a disk save of the same step beside it is unharmed.
TEST_P(TierTest, AFailedHandOverOnOneRankDropsTheSnapshotOnEveryRank) {
  for (int mode : {0, 1, 2}) {  // Put fails, parts lost, the engine destroyed before the step
    if (mode == 2 && !GetParam().nvme) continue;  // memory is captured whole before the engine goes
    SCOPED_TRACE(mode);
    auto e = Engine();
    auto ck = Ck(tier_);
    Train(*e, ck.get(), 0, 2);
    ASSERT_TRUE(ck->Wait().ok());
    Train(*e, nullptr, 2, 3);
    const Relay::Mode how = mode < 2 && rank() == n() - 1 ? static_cast<Relay::Mode>(mode + 1) : Relay::kPass;
    RelayOwner relay(e->state_view().owner, how);
    const auto saved = StateNow(*e);
    if (mode < 2) {
      ASSERT_TRUE(ck->SaveAsync(e->state_view()).ok());
    }
    ASSERT_TRUE(ck->SaveToMemory(Relayed(e->state_view(), &relay)).ok());
    if (mode == 2) {
      e.reset();
    } else {
      Train(*e, nullptr, 3, 4);
    }
    const Status polled = ck->Poll();  // the failure comes at the commit: this Poll's or the Wait's
    const Status waited = ck->Wait();  // which also commits the disk save beside it
    const Status s = polled.ok() ? waited : polled;
    EXPECT_FALSE(s.ok()) << "rank " << rank() << " committed a snapshot another rank lacks";
    // The previous generation is the newest, unless the disk save of step 3 superseded it.
    EXPECT_EQ(ck->memory_stats()->step, mode < 2 ? -1 : 2);
    const std::string own = MemoryTier::RankDir(root_, tier_, rank()) + "/own/";
    EXPECT_FALSE(fs::exists(own + StepDirName(3)));
    EXPECT_FALSE(fs::exists(own + StepDirName(3) + ".tmp"));
    EXPECT_EQ(fs::exists(own + StepDirName(2)), mode == 2);
    if (e) {  // the next snapshot works
      ASSERT_TRUE(ck->SaveToMemory(e->state_view()).ok());
      Train(*e, nullptr, 4, 5);
      ASSERT_TRUE(ck->Wait().ok());
      EXPECT_EQ(ck->memory_stats()->step, 4);
    }
    ck.reset();
    e.reset();
    ASSERT_TRUE(comm_->Barrier().ok());
    if (mode < 2) ExpectDiskHolds(3, saved);  // the disk save beside it is whole
    ASSERT_TRUE(comm_->Barrier().ok());
    OnRank0([&] {
      fs::remove_all(MemoryTier::JobDir(root_, tier_));
      fs::remove_all(root_);
    });
  }
}

// The disk save's side: one rank's capture fails (a Put refused, or parts that never come) at any
// placement: the save fails at its commit on every rank with that rank's reason, no part of it stays,
// the previous checkpoint is still the newest complete one, and the next save works.
TEST_P(TierTest, AFailedCaptureOnOneRankFailsTheDiskSaveOnEveryRank) {
  const int culprit = n() - 1;  // every rank writes (at stage 0 a part of the one shard)
  for (int mode : {0, 1}) {
    SCOPED_TRACE(mode);
    auto e = Engine();
    auto ck = Ck(tier_);
    Train(*e, ck.get(), 0, 2, 2);
    ASSERT_TRUE(ck->Wait().ok());
    Train(*e, nullptr, 2, 3);
    RelayOwner relay(e->state_view().owner, rank() == culprit ? static_cast<Relay::Mode>(mode + 1) : Relay::kPass);
    ASSERT_TRUE(ck->SaveAsync(Relayed(e->state_view(), &relay)).ok());
    Train(*e, nullptr, 3, 4);  // NVMe state is handed over here
    const Status polled = ck->Poll();
    const Status waited = ck->Wait();
    const Status s = polled.ok() ? waited : polled;
    EXPECT_FALSE(s.ok()) << "rank " << rank() << " committed a save whose capture failed on rank " << culprit;
    if (rank() != culprit) {
      EXPECT_NE(s.message().find("failed on rank " + std::to_string(culprit)), std::string_view::npos) << s;
    }
    ASSERT_TRUE(comm_->Barrier().ok());  // rank 0 removes the failed save once every rank agreed
    std::vector<std::string> left;
    for (const auto& entry : fs::directory_iterator(root_)) left.push_back(entry.path().filename().string());
    EXPECT_TRUE(std::none_of(left.begin(), left.end(), [](const std::string& x) { return x.rfind(StepDirName(3), 0) == 0; }))
        << "part of the failed save stayed";
    auto newest = FindLatestComplete(root_);
    ASSERT_TRUE(newest.ok()) << newest.status();
    EXPECT_EQ(fs::path(*newest).filename().string(), StepDirName(2));
    const auto saved = StateNow(*e);
    ASSERT_TRUE(ck->SaveAsync(e->state_view()).ok());  // the next works
    Train(*e, nullptr, 4, 5);
    ASSERT_TRUE(ck->Wait().ok());
    ck.reset();
    e.reset();
    ASSERT_TRUE(comm_->Barrier().ok());
    ExpectDiskHolds(4, saved);
    OnRank0([&] {
      fs::remove_all(MemoryTier::JobDir(root_, tier_));
      fs::remove_all(root_);
    });
  }
}

// A disk save under a staging budget: its chunk buffers never exceed it though the capture is far
// larger and a step follows at once (the step waits for the writer where it must), and the checkpoint
// holds the state saved.
TEST_P(TierTest, AStagingBudgetBoundsTheDiskSave) {
  constexpr int64_t kBudget = 64 << 10;  // 16 chunks of 1024 elements
  auto e = Engine(300'000);
  std::vector<std::vector<float>> saved;
  {
    auto ck = Checkpointer::Create(comm_.get(), &device_, {.root = root_, .chunk_elements = 1024, .staging_budget_bytes = kBudget});
    ASSERT_TRUE(ck.ok()) << ck.status();
    Train(*e, nullptr, 0, 2);
    saved = StateNow(*e);
    ASSERT_TRUE((*ck)->SaveAsync(e->state_view()).ok());
    Train(*e, nullptr, 2, 3, 0, true);
    ASSERT_TRUE((*ck)->Wait().ok());
    const SaveStats st = (*ck)->last_stats();
    EXPECT_LE(st.staging_bytes, kBudget);
    if (GetParam().stage != 0 || rank() == 0) {
      EXPECT_GT(st.staging_bytes, 0);
    }
  }
  e.reset();  // its swap directory is the next engine's
  ASSERT_TRUE(comm_->Barrier().ok());
  auto e2 = Engine(300'000);
  auto ck2 = Checkpointer::Create(comm_.get(), &device_, {.root = root_, .chunk_elements = 1024});
  ASSERT_TRUE(ck2.ok());
  auto r = (*ck2)->Resume(e2->state_view());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->step, 2);
  EXPECT_TRUE(StateNow(*e2) == saved) << "rank " << rank();
}

// The state is captured in the background after SaveToMemory or SaveAsync returns (the engine's
// capture thread); the owner's next change waits only for what it is about to change.
// (a) The engine: a Step right after the save (its Adam would otherwise change the state under the
// copy). (b) The saver's side of the contract: each part's source memory is wrecked as soon as the
// saver's Put returned, and every buffer right after the capture ended. Every snapshot holds the
// saved state, and a disk save's stall is what the owner was charged (SaveAsync and its waits).
// With the state in device memory too, and with a frozen group (its parameters cast on the thread).
TEST_P(TierTest, StateIsCopiedInTheBackgroundUntilTheOwnersNextChange) {
  if (GetParam().nvme) GTEST_SKIP() << "the state arrives with the next step";
  constexpr int64_t kBig = 3'000'000;  // 36 MB of fp32 state over the ranks: the copy outlasts what follows
  std::vector<std::vector<float>> saved;
  for (int part = 0; part < 4; ++part) {
    SCOPED_TRACE(part);
    const bool disk = part >= 2, wreck = part % 2 == 1;
    {
      auto e = Engine(kBig);
      auto ck = Ck(tier_);
      Train(*e, ck.get(), 0, 2);
      ASSERT_TRUE(ck->Wait().ok());
      Train(*e, nullptr, 2, 3);
      saved = StateNow(*e);
      RelayOwner relay(e->state_view().owner, wreck ? Relay::kWreck : Relay::kPass);
      const StateView v = Relayed(e->state_view(), &relay);
      ASSERT_TRUE((disk ? ck->SaveAsync(v) : ck->SaveToMemory(v)).ok());
      if (!wreck) {
        Train(*e, nullptr, 3, 4, 0, true);
        EXPECT_NE(StateNow(*e), saved);
      } else {
        ASSERT_TRUE(v.Settle().ok());  // the capture ends; then the owner changes everything
        for (size_t g = 0; g < v.groups.size(); ++g) {
          for (size_t b = 0; b < v.groups[g].buffers.size(); ++b) {
            const std::vector<float> junk(static_cast<size_t>(v.groups[g].buffers[b].count), -1e30f);
            ASSERT_TRUE(v.Write(static_cast<int>(g), static_cast<int>(b), 0, v.groups[g].buffers[b].count, junk.data()).ok());
          }
        }
      }
      // A pending save's stall counts the owner's waits as soon as they happened.
      if (disk) {
        EXPECT_NEAR(ck->last_stats().stall_seconds, relay.charged, 1e-9);
      }
      ASSERT_TRUE(ck->Poll().ok());
      Status w = ck->Wait();
      ASSERT_TRUE(w.ok()) << w;
      EXPECT_EQ(disk ? ck->last_stats().step : ck->memory_stats()->step, 3);
      if (disk) {
        EXPECT_NEAR(ck->last_stats().stall_seconds, relay.charged, 1e-9);
      }
    }  // the tier keeps step 3 (no disk checkpoint) / the disk holds step 3
    ASSERT_TRUE(comm_->Barrier().ok());
    auto e2 = Engine(kBig);
    auto ck2 = Ck(tier_);
    auto r = ck2->Resume(e2->state_view());
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->step, 3);
    EXPECT_EQ(r->source, disk ? "disk" : "memory");
    EXPECT_TRUE(StateNow(*e2) == saved) << "rank " << rank() << ": the snapshot is not the state saved";
    ASSERT_TRUE(ck2->SaveAsync(e2->state_view()).ok());  // supersedes the tier: the next part starts clean
    ASSERT_TRUE(ck2->Wait().ok());
    ck2.reset();
    ASSERT_TRUE(comm_->Barrier().ok());
    OnRank0([&] { fs::remove_all(root_); });
  }
}

// The tier's filesystem has no room left (another process took it after start-up): writing into a
// mapping of a full tmpfs would kill the process (SIGBUS); instead the snapshot fails on every rank,
// naming the file, and the next one works once there is room. Needs a small tmpfs of its own: skipped
// where this process may not mount one.
TEST_P(TierTest, AFullTierFilesystemFailsTheSnapshotNotTheProcess) {
  const std::string small = base_ + "/small";
  int mounted = 0;
  if (rank() == 0) {
    fs::create_directories(small);
    mounted = ::mount("tmpfs", small.c_str(), "tmpfs", 0, "size=4m") == 0 ? 1 : 0;
  }
  ASSERT_TRUE(comm_->Broadcast(&mounted, sizeof(mounted), DType::kBytes, 0).ok());
  if (mounted == 0) GTEST_SKIP() << "cannot mount a tmpfs here";
  struct Unmount {
    bool on;
    std::string path;
    ~Unmount() {
      if (on) ::umount(path.c_str());
    }
  } unmount{rank() == 0, small};
  MemoryTierOptions t = tier_;
  t.dir = small;
  t.budget_bytes = int64_t{1} << 30;  // past the start-up check: the space goes after it
  auto e = Engine();
  auto ck = Ck(t);
  const std::string filler = small + "/filler";
  OnRank0([&] {  // take every block left
    std::ofstream f(filler, std::ios::binary);
    std::vector<char> block(4096, 'x');
    while (f.write(block.data(), static_cast<std::streamsize>(block.size())) && f.flush()) {
    }
  });
  Train(*e, nullptr, 0, 1);
  ASSERT_TRUE(ck->SaveToMemory(e->state_view()).ok());
  Train(*e, nullptr, 1, 2);  // NVMe state arrives here
  Status s = ck->Poll();  // the failure comes at the commit: this Poll's or the Wait's
  if (s.ok()) s = ck->Wait();
  EXPECT_FALSE(s.ok()) << "rank " << rank() << ": a snapshot into a full filesystem was committed";
  EXPECT_EQ(ck->memory_stats()->step, -1);
  if (rank() == 0) {
    EXPECT_NE(s.message().find("no room"), std::string_view::npos) << s;
  }
  OnRank0([&] { fs::remove(filler); });
  ASSERT_TRUE(ck->SaveToMemory(e->state_view()).ok());
  Train(*e, nullptr, 2, 3);
  Status again = ck->Wait();
  EXPECT_TRUE(again.ok()) << again;
  EXPECT_EQ(ck->memory_stats()->step, 2);
  ck.reset();
  e.reset();
  ASSERT_TRUE(comm_->Barrier().ok());
}

INSTANTIATE_TEST_SUITE_P(Stages, TierTest,
                         ::testing::Values(Case{0, false}, Case{2, false}, Case{3, false}, Case{3, true}, Case{2, false, true}),
                         [](const auto& p) {
                           return "stage" + std::to_string(p.param.stage) + (p.param.nvme ? "_nvme" : "") + (p.param.device_memory ? "_device" : "");
                         });

}  // namespace
}  // namespace zrt::ckpt
