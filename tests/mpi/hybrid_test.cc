// Hybrid sharding (EngineConfig::shard_group_size) at 1, 2, 3, 4 and 6 ranks, every divisor S of the
// world: the same training as flat ZeRO to reduction-order tolerance at stages 1-3 (f32 and bf16
// models, accumulation, clipping, compact state, host and NVMe offload, a frozen group), replicas
// bit-identical to each other and to their own reruns, an overflow on one replica skipping the step
// everywhere; checkpoints of a hybrid run hold each shard once and load on any mesh (bit for bit on
// the same one, resharded on others, sub-worlds included); the memory tier restores a hybrid run.
#include <gtest/gtest.h>
#include <mpi.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>

#include "tests/mpi/engine_fixture.h"
#include "tests/support/scratch_root.h"
#include "zrt/checkpoint/catalog.h"
#include "zrt/checkpoint/checkpointer.h"
#include "zrt/checkpoint/files.h"
#include "zrt/checkpoint/format.h"
#include "zrt/checkpoint/load.h"
#include "zrt/checkpoint/tier/memory_tier.h"
#include "zrt/core/thread_pool.h"

namespace zrt {
namespace {

namespace fs = std::filesystem;

// A frozen group among trained ones.
const std::vector<ParamDef> kHybridModel = {{"embed", {37, 29}, "g0"}, {"w1", {1001}, "g1"}, {"empty", {0, 4}, "g1"},
                                            {"b1", {3}, "g1"},         {"w2", {4099}, "g2"}, {"tiny", {1}, "g2"},
                                            {"frozen", {77}, "cold"}};

struct Mesh {
  int stage = 3;
  int shards = 0;  // shard_group_size
  DType dtype = DType::kF32;
  StatePrecision state;
  OffloadTarget offload = OffloadTarget::kNone;
  int accum = 1;
  bool quantized_weights = false;  // qwZ, blocks of 64
  bool quantized_gradients = false;  // qgZ, blocks of 64
  int quantized_gradient_bits = 8;   // qgZ's codes
  OffloadTarget offload_params = OffloadTarget::kNone;
  int secondary = 0;  // hpZ: secondary_shard_group
};

std::string Name(const Mesh& s) {
  return "stage " + std::to_string(s.stage) + " S=" + std::to_string(s.shards) + " " + std::string(DTypeName(s.dtype)) + " " +
         StatePrecisionName(s.state) + " offload " + std::string(OffloadTargetName(s.offload)) + " accum " + std::to_string(s.accum);
}

class HybridTest : public EngineTest {
 protected:
  void SetUp() override {
    EngineTest::SetUp();
    root_ = testing::SharedScratchRoot(comm_.get(), std::string("zrt_hybrid_") + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    ASSERT_FALSE(root_.empty());
    if (rank() == 0) fs::create_directories(root_);
    ASSERT_TRUE(comm_->Barrier().ok());
  }
  void TearDown() override { ASSERT_TRUE(testing::RemoveSharedScratchRoot(comm_.get(), root_).ok()); }

  // The divisors of the world size below it (the hybrid meshes; none on one rank).
  std::vector<int> HybridSizes() const {
    std::vector<int> out;
    for (int s = 1; s < size(); ++s) {
      if (size() % s == 0) out.push_back(s);
    }
    return out;
  }

  Result<std::unique_ptr<ZeroEngine>> Build(Communicator* comm, const Mesh& s) {
    EngineConfig cfg;
    cfg.stage = s.stage;
    cfg.shard_group_size = s.shards;
    cfg.bucket_bytes = 4096;  // several buckets, groups spanning buckets
    cfg.alignment = 4;
    cfg.max_grad_norm = 0.5;  // clipping active
    cfg.grad_accum_steps = s.accum;
    cfg.adam.lr = 1e-2;
    cfg.adam.weight_decay = 0.01;
    cfg.state = s.state;
    cfg.quantized_weights = s.quantized_weights;
    cfg.quantized_gradients = s.quantized_gradients;
    cfg.quantized_gradient_bits = s.quantized_gradient_bits;
    cfg.quantization_block = 64;
    cfg.secondary_shard_group = s.secondary;
    cfg.offload.optimizer = s.offload;
    cfg.offload.params = s.offload_params;
    if (s.offload == OffloadTarget::kNvme) {
      // One directory per engine: two may be alive at once (a run beside its reference).
      cfg.offload.nvme_dir = root_ + "/swap" + std::to_string(comm->rank()) + "of" + std::to_string(comm->size()) + "-" + std::to_string(engines_++);
      fs::create_directories(cfg.offload.nvme_dir);
      cfg.offload.sub_group_elements = 1024;
    }
    ASSIGN_OR_RETURN(auto e, ZeroEngine::Create(comm, &device_, cfg));
    for (const ParamDef& p : kHybridModel) {
      RETURN_IF_ERROR(e->AddParam(p.name, p.shape, s.dtype, {.group = p.group, .frozen = p.group == "cold"}));
    }
    RETURN_IF_ERROR(e->Finalize(InitFn()));
    return e;
  }

  // `steps` optimizer steps of `accum` micro-steps each; every rank's gradient is its own (world rank).
  void Train(ZeroEngine& e, int world_rank, int first, int steps, int accum) {
    for (int step = first; step < first + steps; ++step) {
      for (int m = 0; m < accum; ++m) {
        e.SetSync(m == accum - 1);
        Backward(e, kHybridModel.size(), [&](int64_t p, int64_t i, float v) { return v - Target(world_rank + m, p, i) + 0.01f * static_cast<float>(step); },
                 e.group(*e.Find("frozen")));
      }
      auto r = e.Step();
      ASSERT_TRUE(r.ok()) << r.status();
      ASSERT_FALSE(r->skipped);
    }
  }

  // Every tensor's full master weights (the frozen one's values), on every rank.
  std::vector<float> Masters(ZeroEngine& e) {
    std::vector<float> out;
    for (size_t p = 0; p < kHybridModel.size(); ++p) {
      auto m = e.FullMaster({static_cast<int64_t>(p)});
      EXPECT_TRUE(m.ok()) << m.status();
      if (m.ok()) out.insert(out.end(), m->begin(), m->end());
    }
    return out;
  }

  // This rank's own shard of every state buffer, as bytes of f32 values.
  static std::vector<float> OwnState(ZeroEngine& e) {
    std::vector<float> out;
    const StateView v = e.state_view();
    for (size_t g = 0; g < v.groups.size(); ++g) {
      for (size_t b = 0; b < v.groups[g].buffers.size(); ++b) {
        std::vector<float> part(static_cast<size_t>(v.groups[g].buffers[b].count));
        EXPECT_TRUE(v.Read(static_cast<int>(g), static_cast<int>(b), 0, static_cast<int64_t>(part.size()), part.data()).ok());
        out.insert(out.end(), part.begin(), part.end());
      }
    }
    return out;
  }

  // Every rank's FNV hash of `v`.
  std::vector<uint64_t> AllHashes(const std::vector<float>& v) {
    uint64_t h = 1469598103934665603ull;
    const auto* p = reinterpret_cast<const unsigned char*>(v.data());
    for (size_t i = 0; i < v.size() * 4; ++i) h = (h ^ p[i]) * 1099511628211ull;
    std::vector<uint64_t> all(static_cast<size_t>(size()));
    EXPECT_EQ(MPI_Allgather(&h, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD), MPI_SUCCESS);
    return all;
  }

  // The replicas of each shard hold the same bytes (ranks q and q + S, q + 2S, ...).
  void ExpectReplicasIdentical(ZeroEngine& e, int shards, const std::string& what) {
    const std::vector<uint64_t> all = AllHashes(OwnState(e));
    for (int q = shards; q < size(); ++q) EXPECT_EQ(all[static_cast<size_t>(q)], all[static_cast<size_t>(q % shards)]) << what << ": rank " << q;
  }

  // A disk checkpoint of the engine's state under `root`; its directory ("" on failure).
  std::string Save(ZeroEngine& e, const std::string& root) {
    ckpt::CheckpointOptions o;
    o.root = root;
    auto c = ckpt::Checkpointer::Create(comm_.get(), &device_, o);
    EXPECT_TRUE(c.ok()) << c.status();
    if (!c.ok()) return "";
    EXPECT_TRUE((*c)->SaveAsync(e.state_view()).ok());
    EXPECT_TRUE((*c)->Wait().ok());
    return root + "/" + ckpt::StepDirName(e.steps());
  }

  // Training with quantized collectives against exact ones: Adam moves each element by about lr per
  // step whatever the gradient's size, so an element whose tiny gradient changes sign may move the
  // other way. The mean difference is small; none exceeds what the steps could move.
  // `mean`: the bound on the mean difference (int4 codes, quantized twice over two levels, move more
  // elements the other way than int8's).
  static void ExpectCloseTraining(const std::vector<float>& got, const std::vector<float>& want, int steps, const std::string& what,
                                  double mean = 2e-3) {
    ASSERT_EQ(got.size(), want.size()) << what;
    double total = 0, worst = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      total += std::fabs(got[i] - want[i]);
      worst = std::max(worst, static_cast<double>(std::fabs(got[i] - want[i])));
    }
    EXPECT_LT(total / static_cast<double>(got.size()), mean) << what << ": mean master difference";
    EXPECT_LE(worst, steps * 2 * 1e-2 + 1e-3) << what << ": a master moved further than " << steps << " Adam steps of lr 1e-2 could";
  }

  static void ExpectNear(const std::vector<float>& got, const std::vector<float>& want, double tol, const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], tol * (1 + std::abs(want[i]))) << what << " element " << i;
    }
  }

  std::string root_;
  int engines_ = 0;
};

TEST_F(HybridTest, EveryStageMatchesFlatZeroAndReplicasStayBitIdentical) {
  for (int stage = 1; stage <= 3; ++stage) {
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      Mesh flat{.stage = stage, .dtype = dtype, .accum = 2};
      auto ref = Build(comm_.get(), flat);
      ASSERT_TRUE(ref.ok()) << ref.status();
      Train(**ref, rank(), 0, 4, 2);
      const std::vector<float> want = Masters(**ref);
      const std::vector<std::vector<float>> want_params = Params(**ref, kHybridModel.size());
      for (int s : HybridSizes()) {
        Mesh h = flat;
        h.shards = s;
        auto e = Build(comm_.get(), h);
        ASSERT_TRUE(e.ok()) << Name(h) << ": " << e.status();
        Train(**e, rank(), 0, 4, 2);
        // Averages over S then R ranks instead of N, then Adam's m / sqrt(v) (and for bf16 a parameter
        // one ulp apart, 1e-4 near 0.03, changes the next gradient): a wrong reduction is off by lr = 1e-2.
        ExpectNear(Masters(**e), want, dtype == DType::kF32 ? 1e-4 : 1e-3, Name(h));
        const auto params = Params(**e, kHybridModel.size());
        for (size_t p = 0; p < params.size(); ++p) ExpectNear(params[p], want_params[p], dtype == DType::kF32 ? 1e-4 : 1e-2, Name(h) + " params");
        ExpectReplicasIdentical(**e, s, Name(h));
        // Every rank holds the same full parameters.
        std::vector<float> flat_params;
        for (const auto& p : params) flat_params.insert(flat_params.end(), p.begin(), p.end());
        const auto all = AllHashes(flat_params);
        for (int q = 1; q < size(); ++q) EXPECT_EQ(all[static_cast<size_t>(q)], all[0]) << Name(h) << ": rank " << q << "'s parameters";
      }
    }
  }
}

TEST_F(HybridTest, RerunsAreBitIdentical) {
  for (int s : HybridSizes()) {
    Mesh h{.stage = 3, .shards = s, .dtype = DType::kBF16};
    std::vector<float> first;
    for (int run = 0; run < 2; ++run) {
      auto e = Build(comm_.get(), h);
      ASSERT_TRUE(e.ok()) << e.status();
      Train(**e, rank(), 0, 3, 1);
      const std::vector<float> m = Masters(**e);
      if (run == 0) first = m;
      else EXPECT_EQ(0, std::memcmp(first.data(), m.data(), m.size() * 4)) << Name(h);
    }
  }
}

TEST_F(HybridTest, CompactStateAndOffloadMatchFlat) {
  StatePrecision q8;
  q8.exp_avg = q8.exp_avg_sq = Precision::kQ8;
  q8.q8_block = 64;
  StatePrecision bf16_no_master;
  bf16_no_master.exp_avg = bf16_no_master.exp_avg_sq = Precision::kBf16;
  bf16_no_master.master = false;
  const std::vector<Mesh> setups = {
      {.stage = 3, .dtype = DType::kF32, .offload = OffloadTarget::kHost},
      {.stage = 2, .dtype = DType::kBF16, .offload = OffloadTarget::kNvme},
      {.stage = 3, .dtype = DType::kBF16, .offload = OffloadTarget::kNvme},
      {.stage = 1, .dtype = DType::kBF16, .state = q8},
      {.stage = 3, .dtype = DType::kBF16, .state = bf16_no_master, .offload = OffloadTarget::kHost},
  };
  for (const Mesh& flat : setups) {
    auto ref = Build(comm_.get(), flat);
    ASSERT_TRUE(ref.ok()) << Name(flat) << ": " << ref.status();
    Train(**ref, rank(), 0, 3, 1);
    const std::vector<float> want = Masters(**ref);
    ref->reset();
    for (int s : HybridSizes()) {
      Mesh h = flat;
      h.shards = s;
      auto e = Build(comm_.get(), h);
      ASSERT_TRUE(e.ok()) << Name(h) << ": " << e.status();
      Train(**e, rank(), 0, 3, 1);
      // Compact moments round what reduction order changed: a code or a bf16 ulp apart.
      ExpectNear(Masters(**e), want, flat.state.compact() ? 2e-2 : 1e-4, Name(h));
      ExpectReplicasIdentical(**e, s, Name(h));
    }
  }
}

TEST_F(HybridTest, AnOverflowOnOneReplicaSkipsTheStepEverywhere) {
  for (int s : HybridSizes()) {
    EngineConfig cfg;
    cfg.stage = 3;
    cfg.shard_group_size = s;
    cfg.loss_scale.mode = LossScaleMode::kDynamic;
    cfg.loss_scale.init_scale = 1024;
    auto e = Make(cfg, kModel, DType::kF16, InitFn());
    ASSERT_TRUE(e.ok()) << e.status();
    Backward(**e, kModel.size(), [&](int64_t p, int64_t i, float v) { return (v - Target(rank(), p, i)) * 1024.0f; });
    ASSERT_FALSE((*e)->Step()->skipped);
    const auto before = Params(**e, kModel.size());
    Backward(**e, kModel.size(), [&](int64_t p, int64_t i, float v) {
      if (rank() == size() - 1 && p == 4 && i == 17) return std::numeric_limits<float>::infinity();
      return (v - Target(rank(), p, i)) * 1024.0f;
    });
    auto r = (*e)->Step();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->skipped) << "S=" << s;
    EXPECT_EQ((*e)->loss_scale(), 512);
    EXPECT_EQ(Params(**e, kModel.size()), before);
  }
}

TEST_F(HybridTest, CommunicationStaysInsideTheShardGroupButTheReplicasAllReduce) {
  for (int s : HybridSizes()) {
    Mesh h{.stage = 3, .shards = s};
    auto e = Build(comm_.get(), h);
    ASSERT_TRUE(e.ok()) << e.status();
    Train(**e, rank(), 0, 1, 1);
    const CommStats st = (*e)->comm_stats();
    EXPECT_GT(st.replica_bytes, 0) << Name(h);
    if (s == 1) EXPECT_EQ(st.gather_bytes, 0) << "one rank per shard group gathers nothing";
    else EXPECT_GT(st.gather_bytes, 0);
  }
}

// qwZ (EngineConfig::quantized_weights) at stage 3, flat and hybrid, with the parameters resident and
// offloaded to the host: every gathered parameter, as initialised and after training, within its
// group's largest magnitude / 254 (half a block's scale at most, plus the bf16 rounding) of the
// exact one (the master rounded to bf16), and the same on every rank;
// about half the gather bytes; training close to exact gathers (the gradients see the decoded
// weights; ExpectCloseTraining); the master, replicas and a checkpoint exact (saved and loaded bit for bit); and the
// option refused where it cannot work.
TEST_F(HybridTest, QuantizedWeightGathersStayWithinTheirScaleAndTheStateExact) {
  std::vector<int> meshes = HybridSizes();
  meshes.push_back(0);
  for (int s : meshes) {
    for (OffloadTarget params : {OffloadTarget::kNone, OffloadTarget::kHost}) {
      Mesh exact{.stage = 3, .shards = s, .dtype = DType::kBF16, .offload = params, .offload_params = params};
      Mesh quant = exact;
      quant.quantized_weights = true;
      SCOPED_TRACE(Name(quant) + " params offload " + std::string(OffloadTargetName(params)));
      auto ref = Build(comm_.get(), exact);
      auto e = Build(comm_.get(), quant);
      ASSERT_TRUE(ref.ok() && e.ok()) << ref.status() << e.status();
      int64_t gathered_exact = 0, gathered_quant = 0;
      for (int round = 0; round < 2; ++round) {  // as initialised, then after training
        // What exact gathers give: the bf16 parameters, the master rounded.
        std::vector<std::vector<float>> want;
        for (size_t p = 0; p < kHybridModel.size(); ++p) {
          auto m = (*e)->FullMaster({static_cast<int64_t>(p)});
          ASSERT_TRUE(m.ok()) << m.status();
          for (float& v : *m) v = Bf16ToFloat(FloatToBf16(v));
          want.push_back(std::move(*m));
        }
        const auto got = Params(**e, kHybridModel.size());
        std::map<int, float> amax;  // per group
        for (size_t p = 0; p < want.size(); ++p) {
          for (float v : want[p]) amax[(*ref)->group({static_cast<int64_t>(p)})] = std::max(amax[(*ref)->group({static_cast<int64_t>(p)})], std::fabs(v));
        }
        std::vector<float> flat;
        for (size_t p = 0; p < want.size(); ++p) {
          ASSERT_EQ(got[p].size(), want[p].size());
          const float bound = amax[(*ref)->group({static_cast<int64_t>(p)})] / 254.0f * 1.001f;
          for (size_t i = 0; i < want[p].size(); ++i) {
            ASSERT_LE(std::fabs(got[p][i] - want[p][i]), bound + std::fabs(got[p][i]) * 0x1p-8f) << kHybridModel[p].name << " element " << i << ": " << got[p][i] << " vs " << want[p][i] << " round " << round;
          }
          flat.insert(flat.end(), got[p].begin(), got[p].end());
        }
        const std::vector<uint64_t> all = AllHashes(flat);
        for (uint64_t h : all) EXPECT_EQ(h, all[0]) << "the ranks gathered different parameters";
        if (round == 0) {  // (the bytes of the training's gathers alone)
          const int64_t r0 = (*ref)->comm_stats().gather_bytes, q0 = (*e)->comm_stats().gather_bytes;
          Train(**ref, rank(), 0, 3, 1);
          Train(**e, rank(), 0, 3, 1);
          gathered_exact = (*ref)->comm_stats().gather_bytes - r0;
          gathered_quant = (*e)->comm_stats().gather_bytes - q0;
        }
      }
      const std::vector<float> mq = Masters(**e), mr = Masters(**ref);
      ExpectCloseTraining(mq, mr, 3, "masters after 3 steps, quantized vs exact gathers");
      const int shards = s == 0 ? size() : s;
      ExpectReplicasIdentical(**e, shards, "qwZ");
      if (shards > 1) {  // codes and a scale per 64 values: 0.53 of the bf16 bytes, some more for the small groups' padding
        EXPECT_LT(gathered_quant, gathered_exact * 6 / 10) << gathered_quant << " bytes gathered quantized, " << gathered_exact << " exact";
      }
      // A checkpoint holds the exact state: a fresh engine loads the very masters.
      const std::string dir = Save(**e, root_ + "/qwz" + std::to_string(s) + std::string(OffloadTargetName(params)));
      auto fresh = Build(comm_.get(), quant);
      ASSERT_TRUE(fresh.ok()) << fresh.status();
      auto loaded = ckpt::Load(dir, (*fresh)->state_view());
      ASSERT_TRUE(loaded.ok()) << loaded.status();
      ASSERT_TRUE((*fresh)->Restore(loaded->counters).ok());
      const std::vector<float> back = Masters(**fresh);
      ASSERT_EQ(back.size(), mq.size());
      EXPECT_EQ(0, std::memcmp(back.data(), mq.data(), mq.size() * 4)) << "the saved masters";
    }
  }
  // Refused: below stage 3, a bad block.
  EngineConfig cfg;
  cfg.stage = 2;
  cfg.quantized_weights = true;
  auto r = ZeroEngine::Create(comm_.get(), &device_, cfg);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("stage 3"), std::string_view::npos) << r.status();
  cfg.stage = 3;
  cfg.quantization_block = -1;
  EXPECT_EQ(ZeroEngine::Create(comm_.get(), &device_, cfg).status().code(), StatusCode::kInvalidArgument);
  cfg.quantization_block = 0;  // each width's own: 256 for qwZ's int8
  EXPECT_TRUE(ZeroEngine::Create(comm_.get(), &device_, cfg).ok());
}

// qgZ (EngineConfig::quantized_gradients) at stages 1-3, flat and hybrid (the shard group's
// reduce-scatter quantized, the replicas' all-reduce exact), with qwZ too at stage 3, int8 codes and
// (stages 2-3) int4: training stays close to exact reductions (the mean master difference after 3
// steps small, none beyond what 3 Adam steps can move), replicas bit-identical, the reduce-scatters'
// bytes about a quarter of f32's (int8) or an eighth (int4); an int4 run resumed from its checkpoint
// goes on bit for bit as the uninterrupted one.
TEST_F(HybridTest, QuantizedGradientReductionsStayCloseToExactAndReplicasIdentical) {
  std::vector<int> meshes = HybridSizes();
  meshes.push_back(0);
  const std::string local = std::to_string(ThreadPool::LauncherRanksPerNode());
  for (int stage : {1, 2, 3}) {
    for (int s : meshes) {
      const int shards = s == 0 ? size() : s;
      for (int node : {0, 2, 3}) {  // two levels: the launcher says nodes of this many ranks
        if (node > 0 && (node >= shards || shards % node != 0)) continue;
        for (int bits : {8, 4}) {
          if (bits == 4 && stage == 1) continue;  // (the same reduce-scatter as stage 2's)
          Mesh exact{.stage = stage, .shards = s, .dtype = DType::kBF16};
          Mesh quant = exact;
          quant.quantized_gradients = true;
          quant.quantized_gradient_bits = bits;
          quant.quantized_weights = stage == 3;
          SCOPED_TRACE(Name(quant) + " int" + std::to_string(bits) + (quant.quantized_weights ? " + qwZ" : "") +
                       (node > 0 ? ", two levels, nodes of " + std::to_string(node) : ""));
          auto ref = Build(comm_.get(), exact);
          if (node > 0) ::setenv("OMPI_COMM_WORLD_LOCAL_SIZE", std::to_string(node).c_str(), 1);
          auto e = Build(comm_.get(), quant);
          ::setenv("OMPI_COMM_WORLD_LOCAL_SIZE", local.c_str(), 1);
          ASSERT_TRUE(ref.ok() && e.ok()) << ref.status() << e.status();
          Train(**ref, rank(), 0, 3, 1);
          Train(**e, rank(), 0, 3, 1);
          const std::vector<float> mq = Masters(**e), mr = Masters(**ref);
          ExpectCloseTraining(mq, mr, 3, "masters after 3 steps, quantized vs exact reductions", bits == 8 ? 2e-3 : 4e-3);
          ExpectReplicasIdentical(**e, shards, "qgZ");
          const CommStats cq = (*e)->comm_stats(), cr = (*ref)->comm_stats();
          if (shards > 1) {  // the shard group's reduce-scatter: ~1.06 (int8) or ~0.56 (int4) bytes per f32 value's 4 (blocks of 64), the replicas' all-reduce exact
            EXPECT_LT(cq.reduce_bytes - cq.replica_bytes, (cr.reduce_bytes - cr.replica_bytes) * (bits == 8 ? 4 : 2) / 10)
                << cq.reduce_bytes << " vs " << cr.reduce_bytes;
          }
          // Two levels where the launcher's nodes split the shard group (the emulated cluster's own, or
          // the ones set here): the second level's bytes counted.
          const int p = node > 0 ? node : ThreadPool::LauncherRanksPerNode();
          EXPECT_EQ(cq.across_nodes_bytes > 0, p >= 2 && p < shards && shards % p == 0);
          if (bits == 4 && node == 0 && stage >= 2) {
            // Deterministic: a run resumed from a checkpoint takes the uninterrupted run's next steps bit for bit.
            const std::string dir = Save(**e, root_ + "/qgz4-" + std::to_string(stage) + "-" + std::to_string(s));
            auto fresh = Build(comm_.get(), quant);
            ASSERT_TRUE(fresh.ok()) << fresh.status();
            auto loaded = ckpt::Load(dir, (*fresh)->state_view());
            ASSERT_TRUE(loaded.ok()) << loaded.status();
            ASSERT_TRUE((*fresh)->Restore(loaded->counters).ok());
            Train(**e, rank(), 3, 2, 1);
            Train(**fresh, rank(), 3, 2, 1);
            const std::vector<float> a = Masters(**e), b = Masters(**fresh);
            ASSERT_EQ(a.size(), b.size());
            EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << "int4 qgZ resumed vs uninterrupted";
          }
        }
      }
    }
  }
  EngineConfig cfg;
  cfg.stage = 0;
  cfg.quantized_gradients = true;
  auto r = ZeroEngine::Create(comm_.get(), &device_, cfg);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("stage 1-3"), std::string_view::npos) << r.status();
  // int4 codes go two a byte: an odd block, or a width other than 8 and 4, is refused naming it.
  cfg.stage = 2;
  cfg.quantized_gradient_bits = 4;
  cfg.quantization_block = 63;
  r = ZeroEngine::Create(comm_.get(), &device_, cfg);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("63"), std::string_view::npos) << r.status();
  cfg.quantized_gradient_bits = 2;
  cfg.quantization_block = 64;
  r = ZeroEngine::Create(comm_.get(), &device_, cfg);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("quantized_gradient_bits"), std::string_view::npos) << r.status();
}

// shard_group_size = node: the launcher's ranks per node, checked against the host names. On one
// machine that is the world (or what OMPI_COMM_WORLD_LOCAL_SIZE says); on emulated nodes
// (tests/cluster) a node, and a group that would span hosts is refused on every rank.
// hpZ (EngineConfig::secondary_shard_group) at stage 3, flat and hybrid, every P that divides the
// shard group below it, exact and with qwZ, parameters resident and offloaded to the host or NVMe: training
// bit for bit as without it (the backward's gathers give what the forward's did), the backward's
// gathers inside the P-rank groups (CommStats::secondary_gather_bytes: half of all gather bytes, the
// forward's as many again), the copies counted as parameters in memory(); refused where it cannot work.
TEST_F(HybridTest, SecondaryShardsGatherTheBackwardInsideTheirGroupBitForBit) {
  std::vector<int> meshes = HybridSizes();
  meshes.push_back(0);
  int runs = 0;
  for (int s : meshes) {
    const int shards = s == 0 ? size() : s;
    for (int p = 2; p < shards; ++p) {
      if (shards % p != 0) continue;
      for (bool qwz : {false, true}) {
        for (OffloadTarget params : {OffloadTarget::kNone, OffloadTarget::kHost, OffloadTarget::kNvme}) {
          Mesh plain{.stage = 3, .shards = s, .dtype = DType::kBF16, .offload = params, .quantized_weights = qwz, .offload_params = params};
          Mesh hpz = plain;
          hpz.secondary = p;
          SCOPED_TRACE(Name(hpz) + " P=" + std::to_string(p) + (qwz ? " qwZ" : "") + " params offload " + std::string(OffloadTargetName(params)));
          auto ref = Build(comm_.get(), plain);
          auto e = Build(comm_.get(), hpz);
          ASSERT_TRUE(ref.ok() && e.ok()) << ref.status() << e.status();
          auto params_bytes = [&] { return device_.memory().Read().current_of(MemCategory::kParameters); };
          Train(**ref, rank(), 0, 3, 1);
          const int64_t before = params_bytes();
          Train(**e, rank(), 0, 3, 1);
          if (!qwz) {  // the copies: 1/P of each gathered group, whose bytes the exact gathers tell (3 steps, 2 gathers each)
            const int64_t gathered = (*ref)->comm_stats().gather_bytes / 6 * shards / (shards - 1);
            EXPECT_EQ(params_bytes() - before, gathered / p) << "memory() counts the secondary copies as parameters";
          }
          const std::vector<float> want = Masters(**ref), got = Masters(**e);
          EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * 4)) << "hpZ changed the training";
          const CommStats st = (*e)->comm_stats();
          EXPECT_GT(st.secondary_gather_bytes, 0);
          ++runs;
          EXPECT_EQ(st.gather_bytes, (*ref)->comm_stats().gather_bytes / 2 + st.secondary_gather_bytes)
              << "the forward's gathers as before, the backward's inside the secondary group";
        }
      }
    }
  }
  EXPECT_EQ(runs > 0, size() >= 4) << "every world of 4 ranks or more has a valid P";
  EngineConfig cfg;
  cfg.stage = 2;
  cfg.secondary_shard_group = 2;
  auto bad = ZeroEngine::Create(comm_.get(), &device_, cfg);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("stage 3"), std::string::npos) << bad.status();
  cfg.stage = 3;
  for (int p : {1, size(), size() + 1}) {
    cfg.secondary_shard_group = p;
    auto e = Make(cfg, kModel, DType::kF32, InitFn());
    EXPECT_FALSE(e.ok()) << "P = " << p;
  }
}

TEST_F(HybridTest, ANodeIsTheLaunchersRanksPerNode) {
  const int per_node = ThreadPool::LauncherRanksPerNode();
  EngineConfig cfg;
  cfg.stage = 3;
  cfg.shard_group_size = EngineConfig::kShardGroupNode;
  auto e = Make(cfg, kModel, DType::kF32, InitFn());
  if (size() % per_node != 0) {
    ASSERT_FALSE(e.ok());
    return;
  }
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ((*e)->state_view().groups[0].layout.world_size(), per_node);
  // Whether the world spans several hosts: then a "node" of the whole world is refused everywhere.
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  std::vector<char> hosts(static_cast<size_t>(size()) * sizeof(host));
  ASSERT_EQ(MPI_Allgather(host, sizeof(host), MPI_CHAR, hosts.data(), sizeof(host), MPI_CHAR, MPI_COMM_WORLD), MPI_SUCCESS);
  bool several = false;
  for (int q = 1; q < size(); ++q) several = several || std::strcmp(hosts.data() + q * sizeof(host), hosts.data()) != 0;
  if (!several) return;
  const std::string saved = std::to_string(per_node);
  ::setenv("OMPI_COMM_WORLD_LOCAL_SIZE", std::to_string(size()).c_str(), 1);
  auto wrong = ZeroEngine::Create(comm_.get(), &device_, cfg);
  ::setenv("OMPI_COMM_WORLD_LOCAL_SIZE", saved.c_str(), 1);
  ASSERT_FALSE(wrong.ok()) << "a shard group spanning hosts";
  EXPECT_NE(wrong.status().message().find("not all on host"), std::string::npos) << wrong.status();
}

TEST_F(HybridTest, BadShardGroupSizesAreClearErrors) {
  EngineConfig cfg;
  cfg.stage = 3;
  cfg.shard_group_size = size() + 1;
  auto e = ZeroEngine::Create(comm_.get(), &device_, cfg);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("shard_group_size"), std::string::npos) << e.status();
  cfg.shard_group_size = -2;
  EXPECT_FALSE(ZeroEngine::Create(comm_.get(), &device_, cfg).ok());
  if (size() > 1) {
    cfg.stage = 0;
    cfg.shard_group_size = 1;
    auto z = ZeroEngine::Create(comm_.get(), &device_, cfg);
    ASSERT_FALSE(z.ok());
    EXPECT_NE(z.status().message().find("stage 0"), std::string::npos) << z.status();
  }
}

// Saved on (N, S), every shard once; resumed on (N, S) bit for bit, and on every other S of this
// world (another stage too) to reduction-order tolerance.
TEST_F(HybridTest, CheckpointsHoldEachShardOnceAndLoadOnAnyMesh) {
  for (int s : HybridSizes()) {
    Mesh h{.stage = 3, .shards = s, .dtype = DType::kBF16};
    const std::string dir_root = root_ + "/s" + std::to_string(s);
    auto e = Build(comm_.get(), h);
    ASSERT_TRUE(e.ok()) << e.status();
    Train(**e, rank(), 0, 2, 1);
    const std::string dir = Save(**e, dir_root);
    if (rank() == 0) {
      // Each shard once, spread over its replicas: every rank writes a part, every chunk is in one.
      int data = 0;
      for (const auto& f : fs::directory_iterator(dir)) data += f.path().extension() == ".data" ? 1 : 0;
      EXPECT_EQ(data, size()) << "a part per rank";
      auto cd = ckpt::CheckpointDir::Open(dir);
      auto man = ckpt::ReadManifest(dir);
      ASSERT_TRUE(cd.ok() && man.ok());
      EXPECT_EQ(man->shards, s);
      EXPECT_EQ(man->parts, size() / s);
      for (int q = 0; q < s; ++q) {
        auto parts = ckpt::ReadShardIndexes(*cd, *man, *ckpt::SavedLayouts(*man), q);  // they tile the shard once
        ASSERT_TRUE(parts.ok()) << parts.status();
        for (const ckpt::RankIndex& idx : *parts) EXPECT_FALSE(idx.chunks.empty() && man->parts <= 2) << idx.data_file;
      }
      auto m = ckpt::ListCheckpoints(dir_root);
      ASSERT_TRUE(m.ok()) << m.status();
      ASSERT_EQ(m->size(), 1u);
      EXPECT_EQ((*m)[0].world_size, size());
    }
    // The uninterrupted run, two more steps.
    Train(**e, rank(), 2, 2, 1);
    const std::vector<float> want = Masters(**e);
    e->reset();

    // Every mesh of this world: the same one resumes bit for bit, the others reshard (and change stage).
    for (int s2 = 1; s2 <= size(); ++s2) {
      if (size() % s2 != 0) continue;
      Mesh t = h;
      t.shards = s2;
      if (s2 != s) t.stage = s2 % 2 == 0 ? 2 : 1;
      auto l = Build(comm_.get(), t);
      ASSERT_TRUE(l.ok()) << l.status();
      auto r = ckpt::Load(dir, (*l)->state_view());
      ASSERT_TRUE(r.ok()) << "S=" << s2 << ": " << r.status();
      EXPECT_EQ(r->saved_world_size, size());
      ASSERT_TRUE((*l)->Restore(r->counters).ok());
      ASSERT_EQ((*l)->steps(), 2);
      Train(**l, rank(), 2, 2, 1);
      const std::vector<float> got = Masters(**l);
      if (s2 == s) {
        EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * 4)) << "the same mesh resumes bit for bit (S=" << s << ")";
      } else {
        ExpectNear(got, want, 2e-2, "resharded S=" + std::to_string(s) + " -> " + std::to_string(s2));
      }
      ExpectReplicasIdentical(**l, s2, "resumed");
    }
  }
}

// Loads on every mesh of every sub-world (n <= N ranks, each S dividing n) hold exactly the saved
// masters: a reshard moves bytes, it computes nothing.
TEST_F(HybridTest, ReshardingMovesTheSavedBytesExactly) {
  for (int s : HybridSizes()) {
    Mesh h{.stage = 3, .shards = s};
    auto e = Build(comm_.get(), h);
    ASSERT_TRUE(e.ok()) << e.status();
    Train(**e, rank(), 0, 2, 1);
    const std::string dir = Save(**e, root_ + "/exact" + std::to_string(s));
    const std::vector<float> saved = Masters(**e);
    for (int n = 1; n <= size(); ++n) {
      auto sub = comm_->Split(rank() < n ? 0 : -1, rank());
      ASSERT_TRUE(sub.ok());
      for (int s2 = 1; s2 <= n; ++s2) {
        if (n % s2 != 0 || !*sub) continue;
        Mesh t = h;
        t.shards = s2;
        auto l = Build(sub->get(), t);
        ASSERT_TRUE(l.ok()) << l.status();
        auto r = ckpt::Load(dir, (*l)->state_view());
        ASSERT_TRUE(r.ok()) << r.status();
        ASSERT_TRUE((*l)->Restore(r->counters).ok());
        const std::vector<float> got = Masters(**l);
        EXPECT_EQ(0, std::memcmp(got.data(), saved.data(), saved.size() * 4)) << "(" << size() << "," << s << ") -> (" << n << "," << s2 << ")";
      }
      ASSERT_TRUE(comm_->Barrier().ok());
    }
  }
}

// A chain of meshes, each saving what the previous one loaded and trained: at 4 ranks (4,2) -> (4,4)
// -> (2,1) -> (3,3) (in general (N, smallest divisor > 1) -> (N, N) -> (N/2, 1) -> (N-1, N-1)). Every
// load holds exactly the masters the previous mesh saved.
TEST_F(HybridTest, AChainOfReshardsKeepsEveryByte) {
  if (size() < 2) GTEST_SKIP() << "one rank: no other mesh";
  int first = size();
  for (int s = 2; s <= size(); ++s) {
    if (size() % s == 0) {
      first = s;
      break;
    }
  }
  const std::vector<std::pair<int, int>> chain = {{size(), first}, {size(), size()}, {std::max(1, size() / 2), 1}, {size() - 1, size() - 1}};
  std::vector<float> saved;  // rank 0's view of what the previous link saved
  std::string dir;
  for (size_t k = 0; k < chain.size(); ++k) {
    const auto [n, s] = chain[k];
    auto sub = comm_->Split(rank() < n ? 0 : -1, rank());
    ASSERT_TRUE(sub.ok()) << sub.status();
    std::string next;
    if (*sub) {
      Mesh m{.stage = k % 2 == 0 ? 3 : 2, .shards = s, .dtype = DType::kBF16};
      auto e = Build(sub->get(), m);
      ASSERT_TRUE(e.ok()) << e.status();
      if (k > 0) {
        auto r = ckpt::Load(dir, (*e)->state_view());
        ASSERT_TRUE(r.ok()) << "link " << k << " (" << n << "," << s << "): " << r.status();
        ASSERT_TRUE((*e)->Restore(r->counters).ok());
        const std::vector<float> got = Masters(**e);
        if (rank() == 0) {
          ASSERT_EQ(got.size(), saved.size());
          EXPECT_EQ(0, std::memcmp(got.data(), saved.data(), saved.size() * 4)) << "link " << k << " (" << n << "," << s << ")";
        }
      }
      Train(**e, rank(), static_cast<int>((*e)->steps()), 1, 1);
      ckpt::CheckpointOptions o;
      o.root = root_ + "/chain" + std::to_string(k);
      auto c = ckpt::Checkpointer::Create(sub->get(), &device_, o);
      ASSERT_TRUE(c.ok()) << c.status();
      ASSERT_TRUE((*c)->SaveAsync((*e)->state_view()).ok());
      ASSERT_TRUE((*c)->Wait().ok());
      next = o.root + "/" + ckpt::StepDirName((*e)->steps());
      saved = Masters(**e);
    }
    ASSERT_TRUE(comm_->Barrier().ok());
    dir = next;
    char buf[512] = {};
    std::snprintf(buf, sizeof(buf), "%s", dir.c_str());
    ASSERT_TRUE(comm_->Broadcast(buf, sizeof(buf), DType::kBytes, 0).ok());
    dir = buf;
  }
}

TEST_F(HybridTest, TheMemoryTierRestoresAHybridRun) {
  for (int s : HybridSizes()) {
    Mesh h{.stage = 3, .shards = s, .dtype = DType::kBF16};
    auto e = Build(comm_.get(), h);
    ASSERT_TRUE(e.ok()) << e.status();
    Train(**e, rank(), 0, 2, 1);
    ckpt::CheckpointOptions o;
    o.root = root_ + "/tier_disk" + std::to_string(s);
    o.memory = ckpt::MemoryTierOptions{.dir = testing::TierScratchDir(root_ + "_t" + std::to_string(s)), .ranks_per_node = std::max(1, size() / 2)};
    auto c = ckpt::Checkpointer::Create(comm_.get(), &device_, o);
    ASSERT_TRUE(c.ok()) << c.status();
    ASSERT_TRUE((*c)->SaveToMemory((*e)->state_view()).ok());
    ASSERT_TRUE((*c)->Wait().ok());
    const std::vector<float> saved = Masters(**e);
    // First from every rank's own copy, then with the last rank's copy gone (its peer's replica).
    for (const bool lose : {false, true}) {
      Train(**e, rank(), 2, 1, 1);  // moves on; the resume must go back
      if (std::error_code gone; lose && rank() == size() - 1) {
        EXPECT_GT(fs::remove_all(ckpt::MemoryTier::RankDir(o.root, *o.memory, rank()), gone), 0u) << gone.message();
      }
      ASSERT_TRUE(comm_->Barrier().ok());
      auto r = (*c)->Resume((*e)->state_view());
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->source, lose && rank() == size() - 1 ? "peer" : "memory") << "S=" << s;
      EXPECT_EQ((*e)->steps(), 2);
      const std::vector<float> got = Masters(**e);
      EXPECT_EQ(0, std::memcmp(got.data(), saved.data(), saved.size() * 4)) << "S=" << s << (lose ? " from the peer" : "");
      ExpectReplicasIdentical(**e, s, "restored from the memory tier");
    }
    c->reset();  // the tier's threads are done with its files before any rank removes them
    ASSERT_TRUE(comm_->Barrier().ok());
    if (std::error_code ec; rank() == 0) fs::remove_all(o.memory->dir, ec);
  }
}

// The memory tier of a hybrid run (f32 state; q8 without a master, kept as codes) uses the live
// replicas: each shard's R ranks keep their own copies, no replica is sent (no replica files); a rank
// whose copy is gone is served by the first rank holding its shard whose copy is usable: a whole shard
// group (a node, when S is one) lost; a copy lost and its first replica's corrupt (a byte flipped),
// served by the third replica where there is one, else every rank falls back to disk together.
TEST_F(HybridTest, TheTiersPeerCopiesAreTheLiveReplicas) {
  StatePrecision q8;
  q8.exp_avg = q8.exp_avg_sq = Precision::kQ8;
  q8.master = false;
  for (const StatePrecision& state : {StatePrecision{}, q8})
  for (int s : HybridSizes()) {
    const int replicas = size() / s;
    Mesh h{.stage = 3, .shards = s, .dtype = DType::kBF16, .state = state};
    auto e = Build(comm_.get(), h);
    ASSERT_TRUE(e.ok()) << e.status();
    Train(**e, rank(), 0, 2, 1);
    const std::vector<float> saved = OwnState(**e);
    for (int damage : {0, 1, 2}) {  // none; shard group 0 lost; rank 0's copy lost and rank s's corrupt
      SCOPED_TRACE(Name(h) + " damage " + std::to_string(damage));
      const std::string tag = std::to_string(s) + "_" + std::to_string(damage) + (state.master ? "" : "q8");
      ckpt::CheckpointOptions o;
      o.root = root_ + "/live" + tag;
      o.memory = ckpt::MemoryTierOptions{.dir = testing::TierScratchDir(root_ + "_l" + tag), .ranks_per_node = s};
      auto c = ckpt::Checkpointer::Create(comm_.get(), &device_, o);
      ASSERT_TRUE(c.ok()) << c.status();
      ASSERT_TRUE((*c)->SaveAsync((*e)->state_view()).ok());
      ASSERT_TRUE((*c)->SaveToMemory((*e)->state_view()).ok());
      ASSERT_TRUE((*c)->Wait().ok());
      const std::string mine = ckpt::MemoryTier::RankDir(o.root, *o.memory, rank());
      for (const auto& f : fs::recursive_directory_iterator(mine)) {
        const std::string path = f.path().string();
        EXPECT_FALSE(path.find("/replica-") != std::string::npos && path.find("/step-") != std::string::npos) << "no replica is kept: " << path;
      }
      EXPECT_EQ((*c)->memory_stats()->replica_seconds, 0.0);
      ASSERT_TRUE(comm_->Barrier().ok());  // every rank looked before rank 0 damages the files
      auto own_data = [&](int r) {
        for (const auto& f : fs::directory_iterator(ckpt::MemoryTier::RankDir(o.root, *o.memory, r) + "/own/" + ckpt::StepDirName(2))) {
          if (f.path().extension() == ".data") return f.path();
        }
        return fs::path();
      };
      if (rank() == 0 && damage == 1) {
        for (int r = 0; r < s; ++r) fs::remove_all(ckpt::MemoryTier::RankDir(o.root, *o.memory, r));
      }
      if (rank() == 0 && damage == 2) {
        const fs::path corrupt = own_data(s);
        fs::remove_all(own_data(0).parent_path());
        std::fstream f(corrupt, std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(4096 + 100).put('\x5a');
      }
      ASSERT_TRUE(comm_->Barrier().ok());
      Train(**e, rank(), 2, 1, 1);  // moves on; the resume must go back
      auto r = (*c)->Resume((*e)->state_view());
      ASSERT_TRUE(r.ok()) << r.status();
      std::string want = "memory";
      if (damage == 1 && rank() < s) want = "peer";
      if (damage == 2) want = replicas == 2 ? "disk" : rank() == 0 || rank() == s ? "peer" : "memory";
      EXPECT_EQ(r->source, want) << "rank " << rank();
      EXPECT_EQ((*e)->steps(), 2);
      EXPECT_EQ(OwnState(**e), saved) << "rank " << rank();
      ExpectReplicasIdentical(**e, s, "restored");
      c->reset();
      ASSERT_TRUE(comm_->Barrier().ok());
      if (std::error_code ec; rank() == 0) fs::remove_all(o.memory->dir, ec);
    }
  }
}

}  // namespace
}  // namespace zrt
