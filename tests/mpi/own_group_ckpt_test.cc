// Checkpoints of a model with tensors over a data-parallel group of their own (the experts of a
// mixture-of-experts model over their expert-data-parallel group; docs/checkpoint-format.md "Groups
// over a mesh of their own") at 1, 2, 3, 4 and 6 ranks, every expert-parallel size EP dividing the
// world: saved, verified, read by name, and resumed bit for bit at stages 0-3 (host offload, compact
// state); resumed on fewer and on more ranks with EP fixed (the data-parallel size changes), the
// parameters exactly as saved; offline resharded and resumed; a corrupt byte in one rank's file makes
// every rank fall back together; a tensor no rank's model has refused (strict) or reported, one that
// only some ranks have accepted; exported to safetensors and initialised from it on another mesh;
// the memory tier's snapshots restored from own copies and peers' replicas.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "tests/mpi/engine_fixture.h"
#include "tests/mpi/own_group_model.h"
#include "tests/support/scratch_root.h"
#include "zrt/checkpoint/catalog.h"
#include "zrt/checkpoint/checkpointer.h"
#include "zrt/checkpoint/format.h"
#include "zrt/checkpoint/interchange/interchange.h"
#include "zrt/checkpoint/interchange/safetensors.h"
#include "zrt/checkpoint/tensor_reader.h"
#include "zrt/checkpoint/tier/memory_tier.h"

namespace zrt {
namespace {

using namespace own_group;  // NOLINT: the shared model

using Values = std::map<std::string, std::vector<float>>;  // tensor name -> its full values

class OwnGroupCheckpointTest : public EngineTest {
 protected:
  // One job of the model on `world` (this rank's experts: EP rank world->rank() % ep's).
  struct Job {
    Communicator* world = nullptr;
    std::unique_ptr<Communicator> edp;
    std::unique_ptr<ZeroEngine> e;
    std::vector<int64_t> keys;
  };
  Result<Job> Start(Communicator* world, const EngineConfig& c, int ep, const std::string& skip = "") {
    Job j;
    j.world = world;
    ASSIGN_OR_RETURN(j.edp, world->Split(world->rank() % ep, world->rank()));
    ASSIGN_OR_RETURN(j.e, ZeroEngine::Create(world, &device_, c));
    RETURN_IF_ERROR(AddModel(*j.e, ep, {world->rank() % ep}, j.edp.get(), &j.keys, skip));
    return j;
  }

  // `steps` optimizer steps of the model's gradients (rank q's as in own_group_test).
  void Train(Job& j, int steps) {
    const int me = j.world->rank();
    for (int s = 0; s < steps; ++s) {
      EngineTest::Backward(*j.e, j.keys.size(), [&](int64_t p, int64_t i, float v) { return Grad(me, j.keys[static_cast<size_t>(p)], i, v); });
      auto r = j.e->Step();
      ASSERT_TRUE(r.ok()) << r.status();
    }
  }

  Values Snapshot(Job& j) {
    Values out;
    const auto all = Params(*j.e, j.keys.size());
    for (size_t p = 0; p < j.keys.size(); ++p) out[j.e->spec(ParamHandle{static_cast<int64_t>(p)}).name] = all[p];
    return out;
  }

  static void ExpectSame(const Values& got, const Values& want, const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    for (const auto& [name, v] : want) {
      const auto it = got.find(name);
      ASSERT_NE(it, got.end()) << what << ": " << name;
      ASSERT_EQ(it->second.size(), v.size()) << what << ": " << name;
      EXPECT_EQ(0, std::memcmp(it->second.data(), v.data(), v.size() * sizeof(float))) << what << ": tensor '" << name << "' differs";
    }
  }

  // Saves `j` under `root` (collective over j.world) and returns the committed directory.
  std::string Save(Job& j, const std::string& root) {
    auto ck = ckpt::Checkpointer::Create(j.world, &device_, {.root = root});
    EXPECT_TRUE(ck.ok()) << ck.status();
    if (!ck.ok()) return "";
    Status s = (*ck)->SaveAsync(j.e->state_view());
    if (s.ok()) s = (*ck)->Wait();
    EXPECT_TRUE(s.ok()) << s;
    return (*ck)->last_stats().dir;
  }

  Result<ckpt::ResumeResult> Resume(Job& j, const std::string& root, bool strict = true) {
    ckpt::CheckpointOptions o{.root = root};
    ckpt::ResumeOptions ro;
    ro.load.strict = strict;
    return ckpt::Resume(j.world, o, j.e->state_view(), ro);
  }

  std::vector<int> Eps() const {
    std::vector<int> out;
    for (int ep = 1; ep <= size(); ++ep) {
      if (size() % ep == 0) out.push_back(ep);
    }
    return out;
  }

  // Save after 2 steps, train 2 more; a fresh job resumes and trains the same 2: the same bits.
  void RoundTrip(const EngineConfig& c, int ep, const std::string& what) {
    SCOPED_TRACE(what + " EP " + std::to_string(ep));
    const std::string root = testing::SharedScratchRoot(comm_.get(), "zrt_own_group_ckpt");
    ASSERT_FALSE(root.empty());
    auto a = Start(comm_.get(), c, ep);
    ASSERT_TRUE(a.ok()) << a.status();
    Train(*a, 2);
    const Values saved = Snapshot(*a);
    const std::string dir = Save(*a, root);
    ASSERT_FALSE(dir.empty());
    Train(*a, 2);
    const Values after = Snapshot(*a);
    // The files: complete and every chunk sound; every tensor (this rank's experts too) read by name.
    if (rank() == 0) {
      std::vector<std::string> problems;
      ASSERT_TRUE(ckpt::CheckComplete(dir, ckpt::VerifyLevel::kFull, &problems).ok());
      EXPECT_TRUE(problems.empty()) << problems.front();
    }
    {
      auto reader = ckpt::TensorReader::Open(dir);
      ASSERT_TRUE(reader.ok()) << reader.status();
      int own = 0;
      for (const ckpt::GroupEntry& g : (*reader)->manifest().groups) own += g.files.empty() ? 0 : 1;
      EXPECT_EQ(own, ep * kExpertsPerRank + (c.stage == 0 ? 3 : 0)) << "groups listing their files";
      if (c.state.master) {
        for (const auto& [name, v] : saved) {
          std::vector<float> got(v.size());
          ASSERT_TRUE((*reader)->Read(name, "master", 0, static_cast<int64_t>(v.size()), got.data()).ok()) << name;
          EXPECT_EQ(0, std::memcmp(got.data(), v.data(), v.size() * sizeof(float))) << "master of '" << name << "' as read by name";
        }
      }
    }
    // Resharded offline (every group over the new mesh, no file lists): resumed by name, as saved.
    if (c.stage == 2) {
      const std::string flat = root + "/resharded";
      Status made;
      if (rank() == 0) {
        auto out = ckpt::Reshard(dir, flat, {.world_size = size()});
        made = out.status();
        if (out.ok()) {
          auto m = ckpt::ReadManifest(*out);
          ASSERT_TRUE(m.ok()) << m.status();
          for (const ckpt::GroupEntry& g : m->groups) EXPECT_TRUE(g.files.empty()) << g.name;
        }
      }
      ASSERT_TRUE(BroadcastStatus(comm_.get(), made, 0).ok()) << made;
      auto r = Start(comm_.get(), c, ep);
      ASSERT_TRUE(r.ok()) << r.status();
      auto res = Resume(*r, flat);
      ASSERT_TRUE(res.ok()) << res.status();
      ExpectSame(Snapshot(*r), saved, "resumed from the offline reshard");
      r->e.reset();
    }
    auto b = Start(comm_.get(), c, ep);
    ASSERT_TRUE(b.ok()) << b.status();
    auto res = Resume(*b, root);
    ASSERT_TRUE(res.ok()) << res.status();
    EXPECT_EQ(res->step, 2);
    EXPECT_TRUE(res->loaded.unexpected.empty()) << res->loaded.unexpected.front();
    ExpectSame(Snapshot(*b), saved, "resumed");
    Train(*b, 2);
    ExpectSame(Snapshot(*b), after, "trained on after the resume");
    a->e.reset();
    b->e.reset();
    ASSERT_TRUE(testing::RemoveSharedScratchRoot(comm_.get(), root).ok());
  }
};

TEST_F(OwnGroupCheckpointTest, ResumesBitForBitAtEveryStage) {
  for (int ep : Eps()) {
    for (int stage : {0, 1, 2, 3}) RoundTrip(Config({.stage = stage}), ep, "stage " + std::to_string(stage));
    RoundTrip(Config({.stage = 3, .offload = true}), ep, "stage 3 host offload");
    EngineConfig q8 = Config({.stage = 2});
    q8.alignment = 256;
    q8.state.exp_avg = q8.state.exp_avg_sq = Precision::kQ8;
    RoundTrip(q8, ep, "stage 2 q8 moments");
  }
}

// The data-parallel size changes with EP fixed: saved on all ranks, resumed on the first n (every
// multiple of EP below the world), and back.
TEST_F(OwnGroupCheckpointTest, ResumesOnAnotherDataParallelSize) {
  for (int ep : Eps()) {
    for (int n = ep; n < size(); n += ep) {
      for (int stage : {0, 2, 3}) {
        SCOPED_TRACE("EP " + std::to_string(ep) + ", " + std::to_string(size()) + " <-> " + std::to_string(n) + " ranks, stage " + std::to_string(stage));
        const EngineConfig c = Config({.stage = stage});
        auto sub = comm_->Split(rank() < n ? 0 : -1, rank());
        ASSERT_TRUE(sub.ok()) << sub.status();
        const std::string down = testing::SharedScratchRoot(comm_.get(), "zrt_own_group_down");
        const std::string up = testing::SharedScratchRoot(comm_.get(), "zrt_own_group_up");
        ASSERT_FALSE(down.empty() || up.empty());
        auto all = Start(comm_.get(), c, ep);
        ASSERT_TRUE(all.ok()) << all.status();
        Train(*all, 2);
        const Values saved = Snapshot(*all);
        ASSERT_FALSE(Save(*all, down).empty());
        if (rank() < n) {  // fewer ranks: every tensor this rank holds, exactly as saved
          auto few = Start(sub->get(), c, ep);
          ASSERT_TRUE(few.ok()) << few.status();
          auto res = Resume(*few, down);
          ASSERT_TRUE(res.ok()) << res.status();
          const Values got = Snapshot(*few);
          for (const auto& [name, v] : got) {
            ASSERT_TRUE(saved.contains(name)) << name;  // rank q holds EP rank q % ep's experts at either size
            EXPECT_EQ(0, std::memcmp(saved.at(name).data(), v.data(), v.size() * sizeof(float))) << "tensor '" << name << "'";
          }
          Train(*few, 1);
          ASSERT_FALSE(Save(*few, up).empty());
          few->e.reset();
        }
        // More ranks again, from the smaller job's save: the same tensors on every rank of the world.
        auto more = Start(comm_.get(), c, ep);
        ASSERT_TRUE(more.ok()) << more.status();
        auto res = Resume(*more, up);
        ASSERT_TRUE(res.ok()) << res.status();
        EXPECT_EQ(res->step, 3);
        const Values grown = Snapshot(*more);
        // Each tensor is the same on every rank that holds it (the dense ones on all).
        for (const auto& [name, v] : grown) {
          std::vector<float> first = v;
          Communicator* c2 = name.rfind("expert.", 0) == 0 ? more->edp.get() : comm_.get();
          ASSERT_TRUE(c2->Broadcast(first.data(), first.size() * sizeof(float), DType::kBytes, 0).ok());
          EXPECT_EQ(0, std::memcmp(first.data(), v.data(), v.size() * sizeof(float))) << "tensor '" << name << "'";
        }
        all->e.reset();
        more->e.reset();
        sub->reset();
        ASSERT_TRUE(testing::RemoveSharedScratchRoot(comm_.get(), down).ok());
        ASSERT_TRUE(testing::RemoveSharedScratchRoot(comm_.get(), up).ok());
      }
    }
  }
}

// One flipped byte in the newest save's last file (its rank's dense shard and its experts, which
// only some ranks read): every rank falls back to the save before, together, and holds it exactly.
TEST_F(OwnGroupCheckpointTest, EveryRankFallsBackTogetherFromACorruptFile) {
  const int ep = size();  // each rank its own experts: only rank N - 1 reads the spoiled file's experts
  const std::string root = testing::SharedScratchRoot(comm_.get(), "zrt_own_group_corrupt");
  ASSERT_FALSE(root.empty());
  const EngineConfig c = Config({.stage = 2});
  auto a = Start(comm_.get(), c, ep);
  ASSERT_TRUE(a.ok()) << a.status();
  Train(*a, 1);
  const Values first = Snapshot(*a);
  ASSERT_FALSE(Save(*a, root).empty());
  Train(*a, 1);
  const std::string newest = Save(*a, root);
  ASSERT_FALSE(newest.empty());
  if (rank() == 0) {
    auto m = ckpt::ReadManifest(newest);
    ASSERT_TRUE(m.ok()) << m.status();
    const std::string data = newest + "/" + ckpt::DataFileName(size() - 1);
    std::FILE* f = std::fopen(data.c_str(), "r+b");
    ASSERT_NE(f, nullptr) << data;
    ASSERT_EQ(std::fseek(f, 100, SEEK_SET), 0);
    const int b = std::fgetc(f);
    ASSERT_EQ(std::fseek(f, 100, SEEK_SET), 0);
    std::fputc(b ^ 0x40, f);
    std::fclose(f);
  }
  ASSERT_EQ(MPI_Barrier(MPI_COMM_WORLD), MPI_SUCCESS);
  auto b = Start(comm_.get(), c, ep);
  ASSERT_TRUE(b.ok()) << b.status();
  auto res = Resume(*b, root);
  ASSERT_TRUE(res.ok()) << res.status();
  EXPECT_EQ(res->step, 1);
  ASSERT_EQ(res->skipped.size(), 1u);
  EXPECT_NE(res->skipped[0].find("checksum"), std::string::npos) << res->skipped[0];
  ExpectSame(Snapshot(*b), first, "fallen back to the save before");
  a->e.reset();
  b->e.reset();
  ASSERT_TRUE(testing::RemoveSharedScratchRoot(comm_.get(), root).ok());
}

// Strictness over the world: a tensor of one expert's group only some ranks hold is expected; one no
// rank holds is not.
TEST_F(OwnGroupCheckpointTest, TensorsNoRankHasAreJudgedOverTheWorld) {
  const int ep = size() >= 2 && size() % 2 == 0 ? 2 : 1;
  const std::string root = testing::SharedScratchRoot(comm_.get(), "zrt_own_group_strict");
  ASSERT_FALSE(root.empty());
  const EngineConfig c = Config({.stage = 2});
  auto a = Start(comm_.get(), c, ep);
  ASSERT_TRUE(a.ok()) << a.status();
  Train(*a, 1);
  ASSERT_FALSE(Save(*a, root).empty());
  const std::string gone = ExpertsOf(ep, 0)[1].b.name;  // held by EP rank 0's ranks
  {
    auto b = Start(comm_.get(), c, ep, gone);
    ASSERT_TRUE(b.ok()) << b.status();
    auto res = Resume(*b, root);
    EXPECT_EQ(res.status().code(), StatusCode::kInvalidArgument) << res.status();
    EXPECT_NE(res.status().message().find(gone), std::string::npos) << res.status();
    EXPECT_NE(res.status().message().find("no rank's model"), std::string::npos) << res.status();
  }
  {
    auto b = Start(comm_.get(), c, ep, gone);
    ASSERT_TRUE(b.ok()) << b.status();
    auto res = Resume(*b, root, /*strict=*/false);
    ASSERT_TRUE(res.ok()) << res.status();
    ASSERT_EQ(res->loaded.unexpected.size(), 1u);
    EXPECT_NE(res->loaded.unexpected[0].find(gone), std::string::npos);
  }
  a->e.reset();
  ASSERT_TRUE(testing::RemoveSharedScratchRoot(comm_.get(), root).ok());
}

// Two own groups with a tensor of the same name cannot be told apart by a load: the save refuses,
// naming it, on every rank; the memory tier refuses the view.
// A save exported to safetensors (every expert in one file) initialises a fresh job at another stage
// and on fewer ranks with EP fixed: each rank's tensors exactly the saved job's full state; the
// file's experts of other EP ranks are no surprise (strictness is the world's), while a tensor no
// rank has is refused on every rank.
TEST_F(OwnGroupCheckpointTest, InitialisesFromSafetensorsOnAnotherMesh) {
  const std::string root = testing::SharedScratchRoot(comm_.get(), "zrt_own_group_safetensors");
  ASSERT_FALSE(root.empty());
  for (int ep : Eps()) {
    SCOPED_TRACE("EP " + std::to_string(ep));
    auto job = Start(comm_.get(), Config({.stage = 2}), ep);
    ASSERT_TRUE(job.ok()) << job.status();
    Train(*job, 2);
    Values full;  // every tensor, as the job has it
    ASSERT_TRUE(job->e->ForEachFullTensor({.root = -1}, [&](const TensorSpec& t, std::string_view, std::span<const float> v) {
      full[t.name].assign(v.begin(), v.end());
      return Status();
    }).ok());
    const std::string dir = Save(*job, root + "/ep" + std::to_string(ep));
    ASSERT_FALSE(dir.empty());
    job->e.reset();
    const std::string file = root + "/ep" + std::to_string(ep) + ".safetensors";
    Status st = rank() == 0 ? ckpt::ExportSafetensors(dir, file, {}) : Status();
    ASSERT_TRUE(AgreeOnStatus(comm_.get(), st).ok()) << st;
    for (const int n : {size(), ep}) {
      if (n == ep && n == size()) continue;
      SCOPED_TRACE(std::to_string(n) + " ranks");
      auto sub = comm_->Split(rank() < n ? 0 : -1, rank());
      ASSERT_TRUE(sub.ok()) << sub.status();
      if (rank() < n) {
        Communicator* world = n == size() ? comm_.get() : sub->get();
        auto fresh = Start(world, Config({.stage = n == size() ? 3 : 0}), ep);
        ASSERT_TRUE(fresh.ok()) << fresh.status();
        auto res = ckpt::LoadSafetensors(world, file, fresh->e->state_view());
        ASSERT_TRUE(res.ok()) << res.status();
        EXPECT_TRUE(res->unexpected.empty() && res->missing.empty());
        for (const auto& [name, v] : Snapshot(*fresh)) {
          ASSERT_TRUE(full.contains(name)) << name;
          EXPECT_EQ(0, std::memcmp(full.at(name).data(), v.data(), v.size() * sizeof(float))) << "tensor '" << name << "'";
        }
        fresh->e.reset();
        // Without expert 0's weight on any rank: the file's is refused, on every rank, naming it.
        auto lacking = Start(world, Config({.stage = 2}), ep, "expert.0.w");
        ASSERT_TRUE(lacking.ok()) << lacking.status();
        auto refused = ckpt::LoadSafetensors(world, file, lacking->e->state_view());
        EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument) << refused.status();
        EXPECT_NE(refused.status().message().find("expert.0.w"), std::string::npos) << refused.status();
      }
      sub->reset();
    }
  }
  ASSERT_TRUE(testing::RemoveSharedScratchRoot(comm_.get(), root).ok());
}

// The memory tier holds every rank's groups (its experts' shards in its own copy and in its replica
// on the next rank): a job that died restores from each rank's own copy, or on the rank whose copy is
// gone from its peer's replica, bit for bit (f32 at stages 0 and 2, where at stage 0 each copy holds
// the replicated shards a save records once; q8 moments at stage 3, taken as stored), and trains on
// as the job did; a tensor no rank's model has is refused.
TEST_F(OwnGroupCheckpointTest, TheMemoryTierRestoresOwnCopiesAndPeersReplicas) {
  const std::string root = testing::SharedScratchRoot(comm_.get(), "zrt_own_group_tier");
  ASSERT_FALSE(root.empty());
  ckpt::CheckpointOptions o{.root = root};
  o.memory = ckpt::MemoryTierOptions{.dir = testing::TierScratchDir(root), .ranks_per_node = 1};
  auto clear_tier = [&] {
    ASSERT_TRUE(comm_->Barrier().ok());
    if (rank() == 0) std::filesystem::remove_all(ckpt::MemoryTier::JobDir(root, *o.memory));
    ASSERT_TRUE(comm_->Barrier().ok());
  };
  for (int ep : Eps()) {
    for (const int stage : {0, 2, 3}) {
      const bool q8 = stage == 3;
      SCOPED_TRACE("EP " + std::to_string(ep) + ", stage " + std::to_string(stage) + (q8 ? " q8" : " f32"));
      EngineConfig c = Config({.stage = stage});
      if (q8) {
        c.alignment = 256;
        c.state.exp_avg = c.state.exp_avg_sq = Precision::kQ8;
      }
      Values saved, after;
      {
        auto a = Start(comm_.get(), c, ep);
        ASSERT_TRUE(a.ok()) << a.status();
        auto ck = ckpt::Checkpointer::Create(comm_.get(), &device_, o);
        ASSERT_TRUE(ck.ok()) << ck.status();
        Train(*a, 2);
        Status st = (*ck)->SaveToMemory(a->e->state_view());
        if (st.ok()) st = (*ck)->Wait();
        ASSERT_TRUE(st.ok()) << st;
        saved = Snapshot(*a);
        Train(*a, 2);
        after = Snapshot(*a);
      }  // the job dies: the tier keeps the snapshot (newer than any disk checkpoint)
      for (const bool lost : {false, true}) {
        if (lost && size() == 1) continue;
        ASSERT_TRUE(comm_->Barrier().ok());
        if (lost && rank() == 0) {
          std::filesystem::remove_all(ckpt::MemoryTier::RankDir(root, *o.memory, size() - 1) + "/own/" + ckpt::StepDirName(2));
        }
        ASSERT_TRUE(comm_->Barrier().ok());
        auto b = Start(comm_.get(), c, ep);
        ASSERT_TRUE(b.ok()) << b.status();
        auto ck = ckpt::Checkpointer::Create(comm_.get(), &device_, o);
        ASSERT_TRUE(ck.ok()) << ck.status();
        auto r = (*ck)->Resume(b->e->state_view());
        ASSERT_TRUE(r.ok()) << r.status();
        EXPECT_EQ(r->step, 2);
        EXPECT_EQ(r->source, lost && rank() == size() - 1 ? "peer" : "memory") << (lost ? "own copy lost" : "");
        ExpectSame(Snapshot(*b), saved, lost ? "restored through the replica" : "restored");
        Train(*b, 2);
        ExpectSame(Snapshot(*b), after, "trained on");
      }
      if (q8) {  // without expert 0's weight on any rank: the snapshot does not fit, nothing is loaded
        auto lacking = Start(comm_.get(), c, ep, "expert.0.w");
        ASSERT_TRUE(lacking.ok()) << lacking.status();
        auto ck = ckpt::Checkpointer::Create(comm_.get(), &device_, o);
        ASSERT_TRUE(ck.ok()) << ck.status();
        auto r = (*ck)->Resume(lacking->e->state_view());
        EXPECT_FALSE(r.ok());
        EXPECT_NE(r.status().message().find("expert.0.w"), std::string::npos) << r.status();
        EXPECT_EQ(lacking->e->steps(), 0);
      }
      clear_tier();
    }
  }
  ASSERT_TRUE(testing::RemoveSharedScratchRoot(comm_.get(), root).ok());
}

TEST_F(OwnGroupCheckpointTest, RefusesWhatItCannotRecord) {
  auto edp = comm_->Split(rank(), rank());  // EP = N: one rank each
  ASSERT_TRUE(edp.ok());
  const std::string root = testing::SharedScratchRoot(comm_.get(), "zrt_own_group_refused");
  ASSERT_FALSE(root.empty());
  auto e = ZeroEngine::Create(comm_.get(), &device_, Config({}));
  ASSERT_TRUE(e.ok());
  ASSERT_TRUE((*e)->AddParam("d", {8}, DType::kF32).ok());
  ASSERT_TRUE((*e)->AddParam("x", {8}, DType::kF32, {.group = "experts", .data_parallel = edp->get()}).ok());
  ASSERT_TRUE((*e)->Finalize(InitFn()).ok());
  for (const bool memory : {false, true}) {  // a disk save, and the memory tier's snapshot alike
    SCOPED_TRACE(memory ? "memory tier" : "disk");
    ckpt::CheckpointOptions o{.root = root};
    if (memory) o.memory = ckpt::MemoryTierOptions{.dir = testing::TierScratchDir(root)};
    auto ck = ckpt::Checkpointer::Create(comm_.get(), &device_, o);
    ASSERT_TRUE(ck.ok()) << ck.status();
    Status st = memory ? (*ck)->SaveToMemory((*e)->state_view()) : (*ck)->SaveAsync((*e)->state_view());
    if (st.ok()) st = (*ck)->Wait();
    if (size() == 1) {
      EXPECT_TRUE(st.ok()) << st;
    } else {
      EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st;
      EXPECT_NE(st.message().find("tensor 'x'"), std::string::npos) << st;
    }
  }
  e->reset();
  ASSERT_TRUE(testing::RemoveSharedScratchRoot(comm_.get(), root).ok());
}

}  // namespace
}  // namespace zrt
