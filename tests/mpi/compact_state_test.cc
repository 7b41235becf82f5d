// Compact optimizer state (EngineConfig::state, core/quant_math.h) in the engine at 1..4 ranks:
// every precision trains at every stage with the ranks in agreement, close to the f32-state run; a
// resume continues bit for bit; a checkpoint saved by K ranks and loaded by M (another stage, another
// layout) holds the very same state, a load into the same precision taking it as stored; a stored
// form encoding never writes is refused; a checkpoint of another precision loads (converted); what
// the engine cannot do yet is an error that says so; the state takes the bytes it should.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "tests/support/scratch_root.h"
#include "zrt/checkpoint/checkpointer.h"
#include "zrt/checkpoint/codec.h"
#include "zrt/checkpoint/format.h"
#include "zrt/checkpoint/interchange/interchange.h"
#include "zrt/checkpoint/load.h"
#include "zrt/checkpoint/tensor_reader.h"
#include "zrt/checkpoint/tier/memory_tier.h"
#include "zrt/core/mpi_communicator.h"
#include "zrt/runtime/engine.h"

namespace zrt {
namespace {

namespace fs = std::filesystem;

// Awkward sizes: a tensor smaller than a q8 block, one not divisible by any world size, an embedding
// in a group of its own (f32 moments there, as the 8-bit Adam paper advises).
const std::vector<std::tuple<std::string, std::vector<int64_t>, std::string>> kModel = {
    {"embed", {37, 29}, "embed"}, {"w1", {1001}, "g1"}, {"b1", {3}, "g1"}, {"w2", {4099}, "g2"}, {"tiny", {1}, "g2"}};

struct NamedPrecision {
  const char* name;
  StatePrecision state;
};
const NamedPrecision kPrecisions[] = {
    {"f32", {}},
    {"bf16 moments", {Precision::kBF16, Precision::kBF16, true, 256}},
    {"q8 moments", {Precision::kQ8, Precision::kQ8, true, 64}},
    {"q8 moments, no master", {Precision::kQ8, Precision::kQ8, false, 256}},
    {"bf16 m, q8 v, no master", {Precision::kBF16, Precision::kQ8, false, 128}},
    {"q4 moments", {Precision::kQ4, Precision::kQ4, true, 64}},
    {"q4 moments, no master", {Precision::kQ4, Precision::kQ4, false, 128}},
    {"q4 m, q8 v", {Precision::kQ4, Precision::kQ8, true, 256}},
};

class CompactStateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    comm_ = MpiCommunicator::Create(MPI_COMM_WORLD).value();
    root_ = testing::SharedScratchRoot(comm_.get(), "zrt_compact");
    ASSERT_FALSE(root_.empty());
  }
  void TearDown() override { ASSERT_TRUE(testing::RemoveSharedScratchRoot(comm_.get(), root_).ok()); }

  // The embedding keeps f32 moments with a master; the rest takes `state`.
  Result<std::unique_ptr<ZeroEngine>> Make(Communicator* comm, int stage, const StatePrecision& state, EngineConfig cfg = {}) {
    cfg.stage = stage;
    cfg.bucket_bytes = 4096;
    cfg.alignment = stage == 2 ? 8 : 4;
    cfg.adam.lr = 1e-2;
    cfg.adam.weight_decay = 0.01;
    cfg.state = state;
    ASSIGN_OR_RETURN(auto e, ZeroEngine::Create(comm, &device_, cfg));
    for (const auto& [name, shape, group] : kModel) {
      ParamOptions o{.group = group};
      if (group == "embed") o.state = StatePrecision{};
      RETURN_IF_ERROR(e->AddParam(name, shape, DType::kBF16, o));
    }
    RETURN_IF_ERROR(e->Finalize([](int64_t p, int64_t off, int64_t n, float* out) {
      for (int64_t i = 0; i < n; ++i) out[i] = 0.3f * std::sin(0.7f * static_cast<float>(off + i) + static_cast<float>(p));
    }));
    return e;
  }

  // One step of a quadratic loss toward cos targets; every rank's gradient is the same.
  static void Train(ZeroEngine& e, int64_t step) {
    for (int g = e.num_groups() - 1; g >= 0; --g) {
      ASSERT_TRUE(e.Gather(g).ok());
      for (int64_t p = 0; p < static_cast<int64_t>(kModel.size()); ++p) {
        if (e.group({p}) != g) continue;
        auto w = e.Param({p}).value();
        auto gr = e.Grad({p}).value();
        for (int64_t i = 0; i < w.numel(); ++i) {
          const float target = std::cos(0.01f * static_cast<float>(i + 31 * p + 7 * step));
          StoreFromFloat(gr.data, i, gr.dtype, LoadAsFloat(w.data, i, w.dtype) - target);
        }
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
        auto w = e.Param({p}).value();
        for (int64_t i = 0; i < w.numel(); ++i) out.push_back(LoadAsFloat(w.data, i, w.dtype));
      }
      EXPECT_TRUE(e.Release(g).ok());
    }
    return out;
  }

  // Every rank's full parameters equal rank 0's.
  void ExpectRanksAgree(const std::vector<float>& mine) {
    std::vector<float> root = mine;
    ASSERT_TRUE(comm_->Broadcast(root.data(), root.size() * 4, DType::kBytes, 0).ok());
    EXPECT_EQ(0, std::memcmp(root.data(), mine.data(), mine.size() * 4)) << "rank " << comm_->rank() << " differs from rank 0";
  }

  std::unique_ptr<ckpt::Checkpointer> Checkpointer(Communicator* comm, const std::string& sub) {
    ckpt::CheckpointOptions o;
    o.root = root_ + "/" + sub;
    o.chunk_elements = 1024;  // many chunks per shard
    return ckpt::Checkpointer::Create(comm, &device_, o).value();
  }
  // A checkpointer of root_/sub with `tier` as its memory tier.
  std::unique_ptr<ckpt::Checkpointer> TierCheckpointer(const std::string& sub, const ckpt::MemoryTierOptions& tier) {
    ckpt::CheckpointOptions o;
    o.root = root_ + "/" + sub;
    o.chunk_elements = 1024;
    o.memory = tier;
    return ckpt::Checkpointer::Create(comm_.get(), &device_, o).value();
  }
  static void LoadInto(ZeroEngine& e, const std::string& dir) {
    auto r = ckpt::Load(dir, e.state_view());
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(e.Restore(r->counters).ok());
  }

  // Every buffer's f32 view of the checkpoint `dir` loaded by a stage-0 engine of `comm` (one rank).
  std::vector<float> LoadedState(Communicator* comm, const StatePrecision& st, const std::string& dir) {
    auto e = Make(comm, 0, st).value();
    LoadInto(*e, dir);
    std::vector<float> all;
    const StateView view = e->state_view();
    for (size_t g = 0; g < view.groups.size(); ++g) {
      for (size_t b = 0; b < view.groups[g].buffers.size(); ++b) {
        std::vector<float> v(static_cast<size_t>(view.groups[g].buffers[b].count));
        EXPECT_TRUE(view.owner->Read(static_cast<int>(g), static_cast<int>(b), 0, view.groups[g].buffers[b].count, v.data()).ok());
        all.insert(all.end(), v.begin(), v.end());
      }
    }
    return all;
  }

  CpuDevice device_;
  std::unique_ptr<MpiCommunicator> comm_;
  std::string root_;
};

TEST_F(CompactStateTest, EveryPrecisionTrainsAtEveryStageCloseToF32State) {
  for (int run = 0; run < 10; ++run) {  // stages 0-3, then 1-3 with the optimizer offloaded to the host, then to NVMe
    const OffloadTarget where = run < 4 ? OffloadTarget::kNone : run < 7 ? OffloadTarget::kHost : OffloadTarget::kNvme;
    const int stage = run < 4 ? run : run < 7 ? run - 3 : run - 6;
    EngineConfig cfg;
    cfg.offload.optimizer = where;
    cfg.offload.nvme_dir = root_ + "/swap";
    fs::create_directories(cfg.offload.nvme_dir);
    std::vector<float> f32;
    for (const NamedPrecision& pr : kPrecisions) {
      SCOPED_TRACE(std::string(pr.name) + ", stage " + std::to_string(stage) + ", optimizer offloaded to " + std::string(OffloadTargetName(where)));
      auto e = Make(comm_.get(), stage, pr.state, cfg);
      ASSERT_TRUE(e.ok()) << e.status();
      for (int s = 1; s <= 8; ++s) Train(**e, s);
      const auto p = FullParams(**e);
      ExpectRanksAgree(p);
      if (f32.empty()) {
        f32 = p;
        continue;
      }
      // Eight steps of lr 1e-2 move each parameter by up to 0.08: compact state stays within a few
      // bf16 steps of the f32-state run (q4's first moment, 8 magnitudes a block, within 0.05).
      double worst = 0;
      for (size_t i = 0; i < p.size(); ++i) worst = std::max(worst, std::fabs(static_cast<double>(p[i]) - f32[i]));
      EXPECT_LT(worst, pr.state.exp_avg == Precision::kQ4 ? 0.05 : 0.02) << "largest difference from the f32-state run";
    }
  }
}

TEST_F(CompactStateTest, ResumeContinuesBitForBit) {
  for (int stage = 0; stage <= 3; ++stage) {
    for (const NamedPrecision& pr : kPrecisions) {
      SCOPED_TRACE(std::string(pr.name) + ", stage " + std::to_string(stage));
      auto e = Make(comm_.get(), stage, pr.state).value();
      const std::string sub = "resume" + std::to_string(stage) + std::string(pr.name).substr(0, 4) + std::to_string(pr.state.q8_block);
      auto ck = Checkpointer(comm_.get(), sub);
      for (int s = 1; s <= 3; ++s) Train(*e, s);
      ASSERT_TRUE(ck->SaveAsync(e->state_view()).ok());
      Train(*e, 4);  // while the save is written
      Train(*e, 5);
      ASSERT_TRUE(ck->Wait().ok());
      const auto want = FullParams(*e);
      auto e2 = Make(comm_.get(), stage, pr.state).value();
      LoadInto(*e2, root_ + "/" + sub + "/step-00000003");
      Train(*e2, 4);
      Train(*e2, 5);
      const auto got = FullParams(*e2);
      ASSERT_EQ(got.size(), want.size());
      EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * 4)) << "the resumed run differs";
    }
  }
}

// Saved by the first K ranks, loaded by the first M at another stage and saved again: rank 0 alone
// loads both and finds the same state, every buffer's f32 view byte for byte.
TEST_F(CompactStateTest, AnyNToAnyMKeepsTheState) {
  for (const NamedPrecision& pr : kPrecisions) {
    SCOPED_TRACE(pr.name);
    for (int k = 1; k <= comm_->size(); ++k) {
      auto sub = comm_->Split(comm_->rank() < k ? 0 : -1, comm_->rank()).value();
      if (sub) {
        auto e = Make(sub.get(), (k + 2) % 4, pr.state).value();
        for (int s = 1; s <= 3; ++s) Train(*e, s);
        auto ck = Checkpointer(sub.get(), "orig" + std::to_string(k));
        ASSERT_TRUE(ck->SaveAsync(e->state_view()).ok());
        ASSERT_TRUE(ck->Wait().ok());
      }
      ASSERT_TRUE(comm_->Barrier().ok());
      const int m = comm_->size() + 1 - k;
      auto msub = comm_->Split(comm_->rank() < m ? 0 : -1, comm_->rank()).value();
      if (msub) {
        auto e = Make(msub.get(), (m + 1) % 4, pr.state).value();
        LoadInto(*e, root_ + "/orig" + std::to_string(k) + "/step-00000003");
        auto ck = Checkpointer(msub.get(), "re" + std::to_string(k));
        ASSERT_TRUE(ck->SaveAsync(e->state_view()).ok());
        ASSERT_TRUE(ck->Wait().ok());
      }
      ASSERT_TRUE(comm_->Barrier().ok());
      auto self = comm_->Split(comm_->rank() == 0 ? 0 : -1, 0).value();
      if (self) {
        const auto want = LoadedState(self.get(), pr.state, root_ + "/orig" + std::to_string(k) + "/step-00000003");
        const auto got = LoadedState(self.get(), pr.state, root_ + "/re" + std::to_string(k) + "/step-00000003");
        ASSERT_EQ(got.size(), want.size());
        EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * 4)) << k << " -> " << m << " ranks changed the state";
      }
      ASSERT_TRUE(comm_->Barrier().ok());
    }
  }
}

// A disk checkpoint stores the compact state as it is kept (the manifest's "stored" and "block"; the
// embeddings' f32 state as before) in the bytes its formats take; `zrt ckpt reshard` to 3, 2, then 1
// ranks keeps every stored byte's meaning: each resharded checkpoint loads the very same state.
TEST_F(CompactStateTest, CheckpointsStoreTheCompactFormAndReshardBitExactly) {
  auto stored_bytes = [](const std::string& dir) {  // the chunks' (data files also hold alignment gaps)
    auto reader = ckpt::TensorReader::Open(dir);
    EXPECT_TRUE(reader.ok()) << reader.status();
    const auto stored = reader.ok() ? (*reader)->StoredBytes() : Result<ckpt::TensorReader::Stored>(reader.status());
    int64_t n = 0;
    if (stored.ok()) {
      for (const auto& [kind, rs] : stored->bytes) n += rs.second;
    }
    return n;
  };
  for (const NamedPrecision& pr : kPrecisions) {
    SCOPED_TRACE(pr.name);
    const std::string sub = "form" + std::to_string(&pr - kPrecisions);
    auto e = Make(comm_.get(), 3, pr.state).value();
    for (int s = 1; s <= 3; ++s) Train(*e, s);
    ckpt::CheckpointOptions o;
    o.root = root_ + "/" + sub;
    o.chunk_elements = 1024;
    o.compression.codec = ckpt::Codec::kRaw;  // the stored forms' own sizes
    auto ck = ckpt::Checkpointer::Create(comm_.get(), &device_, o).value();
    ASSERT_TRUE(ck->SaveAsync(e->state_view()).ok());
    ASSERT_TRUE(ck->Wait().ok());
    EXPECT_EQ(ck->last_stats().encoded_elements, 0) << "moved as kept: nothing decoded and encoded again";
    const std::string dir = root_ + "/" + sub + "/step-00000003";
    auto self = comm_->Split(comm_->rank() == 0 ? 0 : -1, 0).value();
    if (self) {
      auto m = ckpt::ReadManifest(dir).value();
      for (const ckpt::GroupEntry& ge : m.groups) {
        const bool compact = ge.name != "embed" && &pr != kPrecisions;
        ASSERT_EQ(ge.stored.empty(), !compact) << ge.name;
        if (!compact) continue;
        EXPECT_EQ(ge.stored[0], pr.state.master ? Precision::kF32 : Precision::kBF16) << ge.name;
        EXPECT_EQ(ge.stored[1], pr.state.exp_avg) << ge.name;
        EXPECT_EQ(ge.stored[2], pr.state.exp_avg_sq) << ge.name;
        const bool q8 = IsBlockwise(pr.state.exp_avg) || IsBlockwise(pr.state.exp_avg_sq);
        EXPECT_EQ(ge.block, q8 ? pr.state.q8_block : 0) << ge.name;
      }
      // Exactly each kind's form over the padded group (raw chunks): 4 bytes per element for f32, 2
      // for bf16, 1 and a scale per block for q8, 1/2 and a scale per block for q4.
      int64_t expected = 0;
      for (int g = 0; g < static_cast<int>(m.groups.size()); ++g) {
        const ckpt::GroupEntry& ge = m.groups[static_cast<size_t>(g)];
        for (size_t k = 0; k < ge.kinds.size(); ++k) expected += ge.format(k).Bytes(ckpt::SavedLayout(m, g)->padded_size());
      }
      const int64_t bytes = stored_bytes(dir);
      EXPECT_EQ(bytes, expected);

      const auto want = LoadedState(self.get(), pr.state, dir);
      std::string from = dir;
      for (int n : {3, 2, 1}) {
        const std::string out_root = root_ + "/" + sub + "-to" + std::to_string(n);
        auto r = ckpt::Reshard(from, out_root, {.world_size = n, .stage = 3});
        ASSERT_TRUE(r.ok()) << r.status();
        const auto rm = ckpt::ReadManifest(*r).value();
        for (size_t g = 0; g < m.groups.size(); ++g) {
          EXPECT_EQ(rm.groups[g].stored, m.groups[g].stored) << "resharded to " << n;
          EXPECT_EQ(rm.groups[g].block, m.groups[g].block) << "resharded to " << n;
        }
        const auto got = LoadedState(self.get(), pr.state, *r);
        ASSERT_EQ(got.size(), want.size());
        EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * 4)) << "resharded to " << n << " ranks";
        from = *r;
      }
    }
    ASSERT_TRUE(comm_->Barrier().ok());
  }
}

// NVMe offload streams the compact form (moments as kept, q8 scales in a file of their own, no master
// file without a master) in windows of whole blocks: a 2.5M-element group in ~10 sub-groups, params
// on NVMe too, trains bit for bit as the host-offloaded store does; a save taken from NVMe loads into
// the host store with the very same state; and an f32 checkpoint saved by other ranks at another
// alignment (pieces that split q8 blocks) loads into both with the very same codes.
TEST_F(CompactStateTest, NvmeOffloadStreamsTheCompactFormBitForBit) {
  const int64_t numel = 2'500'003;
  int engines = 0;
  auto make = [&](Communicator* comm, const StatePrecision& st, OffloadTarget where, int64_t alignment) {
    EngineConfig cfg;
    cfg.stage = 3;
    cfg.alignment = alignment;
    cfg.adam.lr = 1e-2;
    cfg.state = st;
    cfg.offload.optimizer = where;
    cfg.offload.params = where;
    cfg.offload.nvme_dir = root_ + "/swap" + std::to_string(engines++);  // one directory per live engine
    fs::create_directories(cfg.offload.nvme_dir);
    cfg.offload.sub_group_elements = 4096;  // rounded up to whole 4 KiB of scales: 256K elements with blocks of 64
    auto e = ZeroEngine::Create(comm, &device_, cfg).value();
    Status made = e->AddParam("w", {numel}, DType::kBF16).status();
    if (made.ok()) {
      made = e->Finalize([](int64_t, int64_t off, int64_t n, float* out) {
        for (int64_t i = 0; i < n; ++i) out[i] = 0.2f * std::sin(0.001f * static_cast<float>(off + i));
      });
    }
    if (!made.ok()) {
      ADD_FAILURE() << made;
      std::abort();  // the ranks cannot go on apart
    }
    return e;
  };
  auto step = [](ZeroEngine& e, int64_t t) {
    ASSERT_TRUE(e.Gather(0).ok());
    auto w = e.Param(ParamHandle{0}).value();
    auto g = e.Grad(ParamHandle{0}).value();
    for (int64_t i = 0; i < w.numel(); ++i) {
      StoreFromFloat(g.data, i, g.dtype, LoadAsFloat(w.data, i, w.dtype) - std::cos(0.003f * static_cast<float>(i + 17 * t)));
    }
    ASSERT_TRUE(e.Release(0).ok());
    ASSERT_TRUE(e.GradsReady(0).ok());
    ASSERT_TRUE(e.Step().ok());
  };
  auto params = [](ZeroEngine& e) {
    EXPECT_TRUE(e.Gather(0).ok());
    auto w = e.Param(ParamHandle{0}).value();
    std::vector<uint16_t> out(static_cast<size_t>(w.numel()));
    std::memcpy(out.data(), w.data, out.size() * 2);
    EXPECT_TRUE(e.Release(0).ok());
    return out;
  };
  // f32 state saved at alignment 4 by every rank: its pieces split this run's q8 blocks.
  auto f32 = make(comm_.get(), {}, OffloadTarget::kHost, 4);
  for (int t = 1; t <= 2; ++t) step(*f32, t);
  auto ckf = Checkpointer(comm_.get(), "nvme-f32");
  ASSERT_TRUE(ckf->SaveAsync(f32->state_view()).ok());
  ASSERT_TRUE(ckf->Wait().ok());
  for (const StatePrecision& st : {StatePrecision{Precision::kQ8, Precision::kQ8, true, 64},
                                   StatePrecision{Precision::kBF16, Precision::kQ8, false, 128},
                                   StatePrecision{Precision::kQ4, Precision::kQ4, false, 64}}) {
    SCOPED_TRACE(StatePrecisionName(st));
    auto nvme = make(comm_.get(), st, OffloadTarget::kNvme, 8);
    auto host = make(comm_.get(), st, OffloadTarget::kHost, 8);
    for (int t = 1; t <= 3; ++t) {
      step(*nvme, t);
      step(*host, t);
    }
    EXPECT_EQ(params(*nvme), params(*host)) << "NVMe and host offload differ";
    const std::string sub = std::string("nvme-") + (st.master ? "m" : "nm") + std::string(PrecisionName(st.exp_avg));
    auto ck = Checkpointer(comm_.get(), sub);
    ASSERT_TRUE(ck->SaveAsync(nvme->state_view()).ok());  // streamed by the next step
    step(*nvme, 4);
    ASSERT_TRUE(ck->Wait().ok());
    EXPECT_EQ(ck->last_stats().encoded_elements, 0) << "the windows' codes, scales and bf16 values moved as kept";
    auto from_nvme = make(comm_.get(), st, OffloadTarget::kHost, 8);
    LoadInto(*from_nvme, root_ + "/" + sub + "/step-00000003");
    step(*from_nvme, 4);
    EXPECT_EQ(params(*from_nvme), params(*nvme)) << "the save from NVMe resumes on the host store differently";
    from_nvme.reset();
    auto again = make(comm_.get(), st, OffloadTarget::kNvme, 8);
    LoadInto(*again, root_ + "/" + sub + "/step-00000003");
    step(*again, 4);
    EXPECT_EQ(params(*again), params(*nvme)) << "the save from NVMe resumes on NVMe differently";
    // The f32 checkpoint into both stores: quantized on load, the same codes.
    auto a = make(comm_.get(), st, OffloadTarget::kNvme, 8);
    auto b = make(comm_.get(), st, OffloadTarget::kHost, 8);
    LoadInto(*a, root_ + "/nvme-f32/step-00000002");
    LoadInto(*b, root_ + "/nvme-f32/step-00000002");
    for (int t = 3; t <= 4; ++t) {
      step(*a, t);
      step(*b, t);
    }
    EXPECT_EQ(params(*a), params(*b)) << "the f32 checkpoint loaded into NVMe and host stores differs";
    // Writes through the view that split blocks (the NVMe store keeps such blocks as values until the
    // next step encodes each once, as the host store does with its staged values).
    const StateView va = a->state_view(), vb = b->state_view();
    const int64_t shard = va.groups[0].buffers[1].count;
    std::vector<float> m(static_cast<size_t>(shard));
    for (int64_t i = 0; i < shard; ++i) m[static_cast<size_t>(i)] = 1e-4f * std::sin(0.37f * static_cast<float>(i + comm_->rank()));
    for (const auto& [lo, hi] : {std::pair<int64_t, int64_t>{0, 1000}, {1000, 70001}, {70001, shard}}) {
      ASSERT_TRUE(va.owner->Write(0, 1, lo, hi - lo, m.data() + lo).ok());
      ASSERT_TRUE(vb.owner->Write(0, 1, lo, hi - lo, m.data() + lo).ok());
    }
    step(*a, 5);
    step(*b, 5);
    EXPECT_EQ(params(*a), params(*b)) << "after writes that split blocks";
    for (int k = 0; k < 3; ++k) {
      std::vector<float> xa(static_cast<size_t>(va.groups[0].buffers[static_cast<size_t>(k)].count)), xb(xa.size());
      ASSERT_TRUE(va.owner->Read(0, k, 0, static_cast<int64_t>(xa.size()), xa.data()).ok());
      ASSERT_TRUE(vb.owner->Read(0, k, 0, static_cast<int64_t>(xb.size()), xb.data()).ok());
      EXPECT_EQ(0, std::memcmp(xa.data(), xb.data(), xa.size() * 4)) << "state kind " << k;
    }
  }
}

// The memory tier holds the compact form as a disk checkpoint does (bytes as kept, each chunk
// checksummed): a restart from its own copy, then from the peer's replica after the node's memory is
// lost, continues bit for bit; a snapshot of q8 state without a master takes fewer bytes than f32's.
TEST_F(CompactStateTest, TheMemoryTierHoldsTheCompactFormAndRestartsBitForBit) {
  ckpt::MemoryTierOptions tier;
  tier.dir = testing::TierScratchDir(root_);
  tier.ranks_per_node = comm_->size() == 4 ? 2 : 1;
  fs::create_directories(tier.dir);
  auto ck_for = [&](const std::string& sub) { return TierCheckpointer(sub, tier); };
  int64_t f32_bytes = 0;
  for (const NamedPrecision& pr : kPrecisions) {
    SCOPED_TRACE(pr.name);
    const std::string sub = "tier" + std::to_string(&pr - kPrecisions);
    {
      auto e = Make(comm_.get(), 3, pr.state).value();
      auto ck = ck_for(sub);
      for (int s = 1; s <= 3; ++s) Train(*e, s);
      ASSERT_TRUE(ck->SaveToMemory(e->state_view()).ok());
      ASSERT_TRUE(ck->Wait().ok());
      const int64_t bytes = ck->memory_stats()->snapshot_bytes;
      int64_t expected = 0;  // each buffer's stored form, 4 KiB-aligned
      for (const StateGroup& g : e->state_view().groups) {
        for (const StateBuffer& b : g.buffers) expected = (expected + 4095) / 4096 * 4096 + b.format.Bytes(b.count);
      }
      EXPECT_EQ(bytes, expected);
      if (f32_bytes == 0) f32_bytes = bytes;
      if (!pr.state.master && pr.state.exp_avg == Precision::kQ8) {
        EXPECT_LT(bytes, f32_bytes) << "a snapshot of q8 state, no master";
      }
    }
    auto want_engine = Make(comm_.get(), 3, pr.state).value();
    for (int s = 1; s <= 5; ++s) Train(*want_engine, s);
    const auto want = FullParams(*want_engine);
    for (const char* from : {"memory", "peer"}) {
      if (std::string(from) == "peer") {
        if (comm_->size() == 1) break;  // no other node
        if (comm_->rank() == 0) {
          for (int r = 0; r < tier.ranks_per_node; ++r) fs::remove_all(ckpt::MemoryTier::RankDir(root_ + "/" + sub, tier, r));
        }
        ASSERT_TRUE(comm_->Barrier().ok());
      }
      auto e = Make(comm_.get(), 3, pr.state).value();
      auto ck = ck_for(sub);
      auto r = ck->Resume(e->state_view());
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->step, 3);
      const bool lost = std::string(from) == "peer" && comm_->rank() < tier.ranks_per_node;
      EXPECT_EQ(r->source, lost ? "peer" : "memory") << from;
      if (lost) {  // received in place: no file on the way
        EXPECT_FALSE(fs::exists(ckpt::MemoryTier::RankDir(root_ + "/" + sub, tier, comm_->rank()) + "/own/" + ckpt::StepDirName(3)));
      }
      Train(*e, 4);
      Train(*e, 5);
      EXPECT_EQ(FullParams(*e), want) << "restarted from " << r->source;
      ASSERT_TRUE(ck->Wait().ok());
    }
  }
}

// Corrupts the first q8 chunk of the tier copy in `dir` (rank 0's shard): a code flipped, a scale
// flipped, or (`form`) a negative scale under the checksum of what is there.
void CorruptQ8Chunk(const std::string& dir, const std::string& how) {
  const std::string data = dir + "/rank-00000.data", index = dir + "/rank-00000.index.json";
  ASSERT_TRUE(fs::exists(data) && fs::exists(index)) << dir;
  std::ifstream in(index);
  auto idx = ckpt::DecodeIndex(std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()), index).value();
  auto m = ckpt::ReadManifest(dir).value();
  auto c = std::find_if(idx.chunks.begin(), idx.chunks.end(), [&](const ckpt::ChunkEntry& e) {
    return m.groups[static_cast<size_t>(e.group)].stored_as(static_cast<size_t>(e.kind)) == Precision::kQ8;
  });
  ASSERT_NE(c, idx.chunks.end());
  std::fstream f(data, std::ios::in | std::ios::out | std::ios::binary);
  std::string bytes(static_cast<size_t>(c->stored_bytes), '\0');
  f.seekg(c->file_offset).read(bytes.data(), c->stored_bytes);
  if (how == "code") bytes[1] ^= 0x01;
  if (how == "scale") bytes[static_cast<size_t>(c->elements) + 1] ^= 0x01;
  if (how == "form") {
    const float bad = -1.0f;
    std::memcpy(bytes.data() + c->elements, &bad, 4);
    c->xxh3 = ckpt::Checksum(bytes.data(), bytes.size());
    std::ofstream(index, std::ios::trunc) << ckpt::EncodeIndex(idx);
  }
  f.seekp(c->file_offset).write(bytes.data(), c->stored_bytes);
}

// q8 state restored from the tier lands straight in the state's codes and scales: the own copy copied
// there as it is hashed, a peer's replica received there (no file on the way: the lost rank's own copy
// is not written again). Each is checked where it lands as a load checks it: a flipped code, a flipped
// scale, and a scale no encoding writes under a matching checksum are each caught; a bad own copy is
// served by the peer's replica, a bad replica sends every rank to the older disk checkpoint together;
// either way training goes on bit for bit.
TEST_F(CompactStateTest, Q8StateFromTheTierLandsInPlaceAndIsCheckedThere) {
  if (comm_->size() == 1) GTEST_SKIP() << "no peer to hold a replica";
  const StatePrecision q8 = kPrecisions[3].state;  // q8 moments, no master
  ckpt::MemoryTierOptions tier;
  tier.dir = testing::TierScratchDir(root_);
  tier.ranks_per_node = comm_->size() == 4 ? 2 : 1;
  fs::create_directories(tier.dir);
  auto want_engine = Make(comm_.get(), 3, q8).value();
  for (int s = 1; s <= 5; ++s) Train(*want_engine, s);
  const auto want = FullParams(*want_engine);
  const int d = comm_->size() > tier.ranks_per_node ? tier.ranks_per_node : 1;  // rank 0's replica is on rank d
  for (const std::string where : {"replica", "own"}) {
    for (const std::string how : {"intact", "code", "scale", "form"}) {
      SCOPED_TRACE(where + " " + how);
      const std::string sub = "q8-" + where + "-" + how;
      {
        auto e = Make(comm_.get(), 3, q8).value();
        auto ck = TierCheckpointer(sub, tier);
        for (int s = 1; s <= 2; ++s) Train(*e, s);
        ASSERT_TRUE(ck->SaveAsync(e->state_view()).ok());
        ASSERT_TRUE(ck->Wait().ok());
        Train(*e, 3);
        ASSERT_TRUE(ck->SaveToMemory(e->state_view()).ok());
        ASSERT_TRUE(ck->Wait().ok());
      }
      const std::string own0 = ckpt::MemoryTier::RankDir(root_ + "/" + sub, tier, 0) + "/own/" + ckpt::StepDirName(3);
      if (comm_->rank() == 0 && where == "replica") {
        fs::remove_all(own0);
        if (how != "intact") CorruptQ8Chunk(ckpt::MemoryTier::RankDir(root_ + "/" + sub, tier, d) + "/replica-00000/" + ckpt::StepDirName(3), how);
      }
      if (comm_->rank() == 0 && where == "own" && how != "intact") CorruptQ8Chunk(own0, how);
      ASSERT_TRUE(comm_->Barrier().ok());
      auto e = Make(comm_.get(), 3, q8).value();
      auto ck = TierCheckpointer(sub, tier);
      auto r = ck->Resume(e->state_view());
      ASSERT_TRUE(r.ok()) << r.status();
      if (where == "replica" && how != "intact") {
        EXPECT_EQ(r->step, 2);
        EXPECT_EQ(r->source, "disk");
        std::string skipped;
        for (const std::string& why : r->skipped) skipped += why + "\n";
        if (comm_->rank() == 0) {
          EXPECT_NE(skipped.find(how == "form" ? "q8 block" : "checksum mismatch"), std::string::npos) << skipped;
        }
      } else {
        EXPECT_EQ(r->step, 3);
        EXPECT_EQ(r->source, comm_->rank() == 0 && (where == "replica" || how != "intact") ? "peer" : "memory");
        if (comm_->rank() == 0 && where == "replica") {
          EXPECT_FALSE(fs::exists(own0)) << "received through a file, not in place";
        }
      }
      for (int64_t s = r->step + 1; s <= 5; ++s) Train(*e, s);
      EXPECT_EQ(FullParams(*e), want) << "resumed from " << r->source;
      ASSERT_TRUE(ck->Wait().ok());
    }
  }
}

// A checkpoint of f32 state loads into q8 state (quantized), that into q4 state, and back (the codes'
// values): the parameters come through exactly and training goes on.
TEST_F(CompactStateTest, AnotherPrecisionLoadsConverted) {
  auto f32 = Make(comm_.get(), 2, {}).value();
  for (int s = 1; s <= 3; ++s) Train(*f32, s);
  auto ck = Checkpointer(comm_.get(), "f32");
  ASSERT_TRUE(ck->SaveAsync(f32->state_view()).ok());
  ASSERT_TRUE(ck->Wait().ok());
  const auto params = FullParams(*f32);
  auto q8 = Make(comm_.get(), 3, kPrecisions[3].state).value();
  LoadInto(*q8, root_ + "/f32/step-00000003");
  EXPECT_EQ(FullParams(*q8), params);  // bf16 parameters: the f32 master rounds to them exactly
  Train(*q8, 4);
  auto ck2 = Checkpointer(comm_.get(), "q8");
  ASSERT_TRUE(ck2->SaveAsync(q8->state_view()).ok());
  ASSERT_TRUE(ck2->Wait().ok());
  auto back = Make(comm_.get(), 1, {}).value();
  LoadInto(*back, root_ + "/q8/step-00000004");
  EXPECT_EQ(FullParams(*back), FullParams(*q8));
  // q8 -> q4 (requantized on load) -> f32 (the q4 codes' values): the parameters come through exactly.
  auto q4 = Make(comm_.get(), 3, kPrecisions[6].state).value();  // q4 moments, no master
  LoadInto(*q4, root_ + "/q8/step-00000004");
  EXPECT_EQ(FullParams(*q4), FullParams(*q8));
  Train(*q4, 5);
  auto ck3 = Checkpointer(comm_.get(), "q4");
  ASSERT_TRUE(ck3->SaveAsync(q4->state_view()).ok());
  ASSERT_TRUE(ck3->Wait().ok());
  auto back4 = Make(comm_.get(), 2, {}).value();
  LoadInto(*back4, root_ + "/q4/step-00000005");
  EXPECT_EQ(FullParams(*back4), FullParams(*q4));
  // The manifest says which groups kept compact state (the embeddings did not), once: per kind.
  std::ifstream in(root_ + "/q8/step-00000004/manifest.json");
  const auto m = nlohmann::json::parse(in);
  for (const auto& g : m["groups"]) {
    if (g["name"] == "g1") {
      EXPECT_EQ(g["stored"], nlohmann::json({"bf16", "q8", "q8"})) << g.dump();
    }
    if (g["name"] == "embed") {
      EXPECT_FALSE(g.contains("stored")) << g.dump();
    }
  }
  EXPECT_FALSE(m["engine"]["state"].contains("state")) << "the precision is recorded once";
}

// A load into the same precision hands the owner each compact chunk as stored (nothing decoded and
// encoded again), each chunk checked first: a q8 code that encoding never writes, under a checksum
// that matches, is refused naming the chunk, as the decoding load (into f32 state) refuses it; the
// other ranks' files load (at the same layout).
TEST_F(CompactStateTest, AStoredFormEncodingNeverWritesIsRefusedAsStoredAndDecoded) {
  const StatePrecision q8 = kPrecisions[2].state;
  auto e = Make(comm_.get(), 3, q8).value();
  for (int s = 1; s <= 3; ++s) Train(*e, s);
  auto ck = Checkpointer(comm_.get(), "bad");
  ASSERT_TRUE(ck->SaveAsync(e->state_view()).ok());
  ASSERT_TRUE(ck->Wait().ok());
  const std::string dir = root_ + "/bad/step-00000003";
  if (comm_->rank() == 0) {  // rank 0's first q8 exp_avg chunk: its first code a negative zero
    std::ifstream in(dir + "/" + ckpt::IndexFileName(0));
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto idx = ckpt::DecodeIndex(text, "index");
    ASSERT_TRUE(idx.ok()) << idx.status();
    std::ifstream min(dir + "/manifest.json");
    const std::string mtext((std::istreambuf_iterator<char>(min)), std::istreambuf_iterator<char>());
    auto m = ckpt::DecodeManifest(mtext, "manifest");
    ASSERT_TRUE(m.ok()) << m.status();
    auto c = std::find_if(idx->chunks.begin(), idx->chunks.end(), [&](const ckpt::ChunkEntry& entry) {
      const ckpt::GroupEntry& g = m->groups[static_cast<size_t>(entry.group)];
      return g.stored_as(static_cast<size_t>(entry.kind)) == Precision::kQ8 && g.kinds[static_cast<size_t>(entry.kind)] == "exp_avg";
    });
    ASSERT_NE(c, idx->chunks.end());
    std::fstream d(dir + "/" + idx->data_file, std::ios::in | std::ios::out | std::ios::binary);
    std::vector<char> bytes(static_cast<size_t>(c->stored_bytes));
    d.seekg(c->file_offset);
    d.read(bytes.data(), c->stored_bytes);
    bytes[0] = static_cast<char>(0x80);
    d.seekp(c->file_offset);
    d.write(bytes.data(), c->stored_bytes);
    c->xxh3 = ckpt::Checksum(bytes.data(), bytes.size());
    std::ofstream(dir + "/" + ckpt::IndexFileName(0), std::ios::trunc) << ckpt::EncodeIndex(*idx);
  }
  ASSERT_TRUE(comm_->Barrier().ok());
  for (const StatePrecision& into : {q8, StatePrecision{}}) {
    auto e2 = Make(comm_.get(), 3, into).value();
    Status s = ckpt::Load(dir, e2->state_view()).status();
    // Rank 0 reads its own file's chunk; the others read only theirs at the same layout (the f32
    // engine lays its groups out otherwise and may read that chunk too).
    if (comm_->rank() == 0 || (!s.ok() && !(into == q8))) {
      EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s;
      EXPECT_NE(s.message().find("never written"), std::string_view::npos) << s;
      EXPECT_NE(s.message().find("rank-00000.data chunk"), std::string_view::npos) << s;
    } else {
      EXPECT_TRUE(s.ok()) << s;
    }
  }
}

TEST_F(CompactStateTest, WhatIsNotSupportedSaysSo) {
  const StatePrecision no_master{Precision::kQ8, Precision::kQ8, false, 256};
  auto make = [&](DType dtype, EngineConfig cfg, const StatePrecision& st) -> Status {
    cfg.state = st;
    ASSIGN_OR_RETURN(auto e, ZeroEngine::Create(comm_.get(), &device_, cfg));
    RETURN_IF_ERROR(e->AddParam("w", {100}, dtype));
    return e->Finalize([](int64_t, int64_t, int64_t n, float* out) { std::fill(out, out + n, 0.5f); });
  };
  Status s = make(DType::kF32, {}, no_master);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("no master needs bf16"), std::string::npos) << s;
  EXPECT_EQ(make(DType::kF16, {}, no_master).code(), StatusCode::kInvalidArgument);
  EngineConfig ams;
  ams.adam.amsgrad = true;
  EXPECT_NE(make(DType::kBF16, ams, {Precision::kQ8, Precision::kF32, true, 256}).message().find("amsgrad"), std::string::npos);
  EXPECT_EQ(make(DType::kBF16, {}, {Precision::kQ8, Precision::kQ8, true, 100}).code(), StatusCode::kInvalidArgument);  // block
  // Two precisions in one group.
  auto e = ZeroEngine::Create(comm_.get(), &device_, {}).value();
  ASSERT_TRUE(e->AddParam("a", {10}, DType::kBF16, {.group = "g"}).ok());
  ASSERT_TRUE(e->AddParam("b", {10}, DType::kBF16, {.group = "g", .state = no_master}).ok());
  s = e->Finalize([](int64_t, int64_t, int64_t n, float* out) { std::fill(out, out + n, 0.5f); });
  EXPECT_NE(s.message().find("one state precision per group"), std::string::npos) << s;
}

// A q4 buffer through the state view from any element (an odd one: a high nibble) to any other, where
// the store keeps it in memory or on NVMe: each part reads as the whole buffer's slice, and writing a
// part back (a partial block, encoded once the block is whole) leaves every value as it was, the
// parts not written included (a store that staged zeros for them once lost them).
TEST_F(CompactStateTest, Q4PartsReadAndWriteFromAnyElement) {
  for (const OffloadTarget where : {OffloadTarget::kNone, OffloadTarget::kHost, OffloadTarget::kNvme}) {
    SCOPED_TRACE(std::string(OffloadTargetName(where)));
    EngineConfig cfg;
    cfg.offload.optimizer = where;
    cfg.offload.nvme_dir = root_ + "/swap-q4";
    fs::create_directories(cfg.offload.nvme_dir);
    auto e = Make(comm_.get(), 3, kPrecisions[5].state, cfg).value();  // q4 moments + master, blocks of 64
    for (int s = 1; s <= 2; ++s) Train(*e, s);
    const StateView view = e->state_view();
    for (int g = 0; g < static_cast<int>(view.groups.size()); ++g) {
      for (int k = 1; k <= 2; ++k) {
        const int64_t count = view.groups[static_cast<size_t>(g)].buffers[static_cast<size_t>(k)].count;
        std::vector<float> whole(static_cast<size_t>(count));
        ASSERT_TRUE(view.Read(g, k, 0, count, whole.data()).ok());
        for (const auto& [off, n] : {std::pair<int64_t, int64_t>{1, 5}, {3, 64}, {63, 2}, {count - 3, 3}}) {
          if (off < 0 || off + n > count) continue;
          std::vector<float> part(static_cast<size_t>(n));
          ASSERT_TRUE(view.Read(g, k, off, n, part.data()).ok());
          EXPECT_EQ(0, std::memcmp(part.data(), whole.data() + off, static_cast<size_t>(n) * 4)) << "group " << g << " kind " << k << " from " << off;
          ASSERT_TRUE(view.Write(g, k, off, n, part.data()).ok());
        }
        std::vector<float> again(whole.size());
        ASSERT_TRUE(view.Read(g, k, 0, count, again.data()).ok());
        EXPECT_EQ(0, std::memcmp(again.data(), whole.data(), whole.size() * 4)) << "group " << g << " kind " << k;
      }
    }
  }
}

// The optimizer state takes its formats' bytes: per element 4 (master) + 1 + 1 (q8 codes) + the
// scales, against 12 for f32 state; without a master 2 + the scales.
TEST_F(CompactStateTest, TheStateTakesItsFormatsBytes) {
  auto bytes = [&](const StatePrecision& st) {
    EngineConfig cfg;
    cfg.stage = 3;
    cfg.state = st;
    auto e = ZeroEngine::Create(comm_.get(), &device_, cfg).value();
    EXPECT_TRUE(e->AddParam("w", {1 << 16}, DType::kBF16).ok());
    EXPECT_TRUE(e->Finalize([](int64_t, int64_t, int64_t n, float* out) { std::fill(out, out + n, 0.5f); }).ok());
    return static_cast<double>(e->memory().current[static_cast<size_t>(MemCategory::kOptimizerState)]);
  };
  const double shard = std::ceil((1 << 16) / static_cast<double>(comm_->size()));
  EXPECT_NEAR(bytes({}), 12 * shard, 12.0 * 256);
  EXPECT_NEAR(bytes({Precision::kQ8, Precision::kQ8, true, 256}), (4 + 2 + 8.0 / 256) * shard, 12.0 * 256);
  EXPECT_NEAR(bytes({Precision::kQ8, Precision::kQ8, false, 256}), (2 + 8.0 / 256) * shard, 12.0 * 256);
  EXPECT_NEAR(bytes({Precision::kBF16, Precision::kBF16, false, 256}), 4 * shard, 12.0 * 256);
  EXPECT_NEAR(bytes({Precision::kQ4, Precision::kQ4, false, 256}), (1 + 8.0 / 256) * shard, 12.0 * 256);
  EXPECT_NEAR(bytes({Precision::kQ4, Precision::kQ4, true, 256}), (4 + 1 + 8.0 / 256) * shard, 12.0 * 256);
}

}  // namespace
}  // namespace zrt
