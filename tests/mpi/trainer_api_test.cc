// The trainer-facing API at 1-4 ranks: per-tensor optimizer settings independent of gather groups,
// schedules applied at Step, fp32 gradients, everything the engine needs carried by a checkpoint, and
// tensors reached by name or handle.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <filesystem>
#include <chrono>
#include <fstream>
#include <map>
#include <thread>

#include "tests/mpi/engine_fixture.h"
#include "zrt/checkpoint/checkpointer.h"
#include "zrt/checkpoint/load.h"
#include "zrt/checkpoint/catalog.h"
#include "zrt/checkpoint/interchange/safetensors.h"

namespace zrt {
namespace {

using InitFn = ZeroEngine::InitFn;

float Init(int64_t p, int64_t i) { return 0.4f * std::sin(0.37f * static_cast<float>(i) + 1.3f * static_cast<float>(p)); }
InitFn Inits() {
  return [](int64_t p, int64_t off, int64_t n, float* out) {
    for (int64_t i = 0; i < n; ++i) out[i] = Init(p, off + i);
  };
}
// Elementwise in the parameter's own value, so a tensor's trajectory depends on its settings only.
float Grad(int64_t p, int64_t i, float v) { return v - 0.1f * static_cast<float>((i * 7 + p) % 13) + 0.05f; }

// kModel's tensors with settings unlike their groups: decay off for some tensors of a group, lr
// scaled for others, so every group holds more than one settings class on some rank.
const std::map<std::string, ParamOptions> kSettings = {
    {"embed", {.weight_decay = 0.0}},
    {"w1", {.lr_scale = 0.5, .weight_decay = 0.2}},
    {"b1", {.weight_decay = 0.0}},
    {"tiny", {.lr_scale = 2.0}},
};

class TrainerApiTest : public EngineTest {
 protected:
  Result<std::unique_ptr<ZeroEngine>> MakeWith(const EngineConfig& cfg, DType dtype, bool settings) {
    ASSIGN_OR_RETURN(auto e, ZeroEngine::Create(comm_.get(), &device_, cfg));
    for (const ParamDef& p : kModel) {
      ParamOptions o;
      if (settings && kSettings.count(p.name)) o = kSettings.at(p.name);
      o.group = p.group;
      RETURN_IF_ERROR(e->AddParam(p.name, p.shape, dtype, o).status());
    }
    RETURN_IF_ERROR(e->Finalize(Inits()));
    return e;
  }
  void Steps(ZeroEngine& e, int n) {
    for (int s = 0; s < n; ++s) {
      Backward(e, kModel.size(), Grad);
      auto r = e.Step();
      ASSERT_TRUE(r.ok()) << r.status();
    }
  }
};

TEST_F(TrainerApiTest, PerTensorSettingsEqualWholeEnginesConfiguredThatWay) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (int stage = 0; stage <= 3; ++stage) {
      EngineConfig cfg;
      cfg.stage = stage;
      cfg.alignment = 4;  // tensors meet inside shards: runs of several settings per rank
      cfg.adam.lr = 1e-2;
      cfg.adam.weight_decay = 0.05;
      auto a = MakeWith(cfg, dtype, true);
      ASSERT_TRUE(a.ok()) << a.status();
      Steps(**a, 3);
      const auto got = Params(**a, kModel.size());
      for (size_t p = 0; p < kModel.size(); ++p) {
        // The reference: an engine whose defaults are this tensor's settings.
        EngineConfig rc = cfg;
        if (kSettings.count(kModel[p].name)) {
          const ParamOptions& o = kSettings.at(kModel[p].name);
          rc.adam.lr *= o.lr_scale;
          rc.adam.weight_decay = o.weight_decay.value_or(cfg.adam.weight_decay);
        }
        auto ref = MakeWith(rc, dtype, false);
        ASSERT_TRUE(ref.ok()) << ref.status();
        Steps(**ref, 3);
        const auto want = Params(**ref, kModel.size());
        ASSERT_EQ(got[p].size(), want[p].size());
        for (size_t i = 0; i < got[p].size(); ++i) {
          ASSERT_EQ(got[p][i], want[p][i]) << kModel[p].name << "[" << i << "], stage " << stage << ", " << DTypeName(dtype);
        }
      }
    }
  }
}

TEST_F(TrainerApiTest, TheScheduleIsAppliedAtStepAsSetLrByHandWouldBe) {
  for (int stage : {1, 3}) {
    EngineConfig cfg;
    cfg.stage = stage;
    cfg.adam.lr = 2e-2;
    cfg.lr_schedule = LrSchedule::Cosine(2, 6, 0.1);
    auto a = MakeWith(cfg, DType::kBF16, true);
    EngineConfig manual = cfg;
    manual.lr_schedule = LrSchedule::Constant();
    auto b = MakeWith(manual, DType::kBF16, true);
    ASSERT_TRUE(a.ok() && b.ok());
    for (int t = 0; t < 8; ++t) {  // past total_steps: holds the floor
      const double want = cfg.adam.lr * cfg.lr_schedule.Factor(t);
      EXPECT_DOUBLE_EQ((*a)->lr(), want);
      ASSERT_TRUE((*b)->SetLr(want).ok());
      Backward(**a, kModel.size(), Grad);
      Backward(**b, kModel.size(), Grad);
      auto ra = (*a)->Step();
      auto rb = (*b)->Step();
      ASSERT_TRUE(ra.ok() && rb.ok());
      EXPECT_DOUBLE_EQ(ra->lr, want) << "step " << t;
    }
    EXPECT_EQ(Params(**a, kModel.size()), Params(**b, kModel.size())) << "stage " << stage;
  }
}

TEST_F(TrainerApiTest, ACheckpointCarriesLrScheduleAndPerTensorSettings) {
  const std::string root = ::testing::TempDir() + "/zrt_trainer_api_" + std::to_string(size());
  if (rank() == 0) std::filesystem::remove_all(root);
  MPI_Barrier(MPI_COMM_WORLD);
  EngineConfig cfg;
  cfg.stage = 3;
  cfg.adam.lr = 1e-2;
  cfg.adam.weight_decay = 0.05;
  cfg.lr_schedule = LrSchedule::Linear(1, 20);
  auto a = MakeWith(cfg, DType::kBF16, true);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE((*a)->SetLr(3e-2).ok());  // a trainer's override: saved too
  Steps(**a, 4);
  CpuDevice staging;
  auto ck = ckpt::Checkpointer::Create(comm_.get(), &staging, {.root = root});
  ASSERT_TRUE(ck.ok()) << ck.status();
  ASSERT_TRUE((*ck)->SaveAsync((*a)->state_view(), {{"epoch", 1}}).ok());
  ASSERT_TRUE((*ck)->Wait().ok());
  Steps(**a, 4);

  // A restart whose code registers nothing special: the checkpoint brings back what the run had.
  EngineConfig plain;
  plain.stage = 3;
  auto b = MakeWith(plain, DType::kBF16, false);
  ASSERT_TRUE(b.ok());
  auto r = ckpt::Resume(comm_.get(), {.root = root}, (*b)->state_view());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->loaded.trainer_state["epoch"], 1);
  EXPECT_EQ((*b)->steps(), 4);
  EXPECT_DOUBLE_EQ((*b)->lr(), 3e-2 * LrSchedule::Linear(1, 20).Factor(4));
  // Every setting the checkpoint replaced is reported, with the trainer's value and the checkpoint's.
  std::map<std::string, std::pair<std::string, std::string>> changed;
  for (const SettingChange& c : (*b)->restored_settings()) changed[c.name] = {c.trainer, c.checkpoint};
  using P = std::pair<std::string, std::string>;
  EXPECT_EQ(changed["lr"], P("0.001", "0.03"));
  EXPECT_EQ(changed["lr_schedule.kind"], P("constant", "linear"));
  EXPECT_EQ(changed["lr_schedule.total_steps"], P("0", "20"));
  EXPECT_EQ(changed["weight_decay"], P("0", "0.05"));
  EXPECT_EQ(changed["tensor 'w1' lr_scale"], P("1", "0.5"));
  EXPECT_EQ(changed["tensor 'w1' weight_decay"], P("0", "0.2"));
  EXPECT_EQ(changed["tensor 'tiny' weight_decay"], P("0", "0.05"));
  EXPECT_FALSE(changed.contains("tensor 'embed' weight_decay"));  // 0 in both
  EXPECT_FALSE(changed.contains("lr_schedule.min_lr_ratio"));
  {  // The trainer's settings back in one call: a new lr for the rest of the run.
    auto c = MakeWith(plain, DType::kBF16, false);
    ASSERT_TRUE(c.ok());
    ASSERT_TRUE(ckpt::Resume(comm_.get(), {.root = root}, (*c)->state_view()).ok());
    EXPECT_FALSE((*c)->restored_settings().empty());
    ASSERT_TRUE((*c)->UseTrainerSettings().ok());
    EXPECT_TRUE((*c)->restored_settings().empty());
    EXPECT_DOUBLE_EQ((*c)->lr(), 1e-3);
    Backward(**c, kModel.size(), Grad);
    auto r1 = (*c)->Step();
    ASSERT_TRUE(r1.ok());
    EXPECT_DOUBLE_EQ(r1->lr, 1e-3);
    EXPECT_EQ(r1->step, 5);
  }
  Steps(**b, 4);
  EXPECT_EQ(Params(**b, kModel.size()), Params(**a, kModel.size()));
  EXPECT_DOUBLE_EQ((*b)->lr(), (*a)->lr());
  // Overriding after the resume is the trainer's call.
  ASSERT_TRUE((*b)->SetLrSchedule(LrSchedule::Constant()).ok());
  ASSERT_TRUE((*b)->SetLr(1e-3).ok());
  EXPECT_DOUBLE_EQ((*b)->lr(), 1e-3);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank() == 0) std::filesystem::remove_all(root);
}

TEST_F(TrainerApiTest, Fp32GradsAccumulate32Bf16MicroStepsWhere16BitsLoseThem) {
  // Micro-step 0 adds 1, the 31 others 2^-9 each: below half a bf16 ulp of 1 (2^-8), so 16-bit
  // accumulation rounds every one of them away; f32 keeps them exactly.
  constexpr int kMicro = 32;
  constexpr int64_t kN = 1001;
  for (int stage = 0; stage <= 3; ++stage) {
    for (bool fp32 : {false, true}) {
      EngineConfig cfg;
      cfg.stage = stage;
      cfg.grad_accum_steps = kMicro;
      cfg.fp32_grads = fp32;
      auto e = ZeroEngine::Create(comm_.get(), &device_, cfg);
      ASSERT_TRUE(e.ok());
      auto h = (*e)->AddParam("w", {kN}, DType::kBF16);
      ASSERT_TRUE(h.ok());
      ASSERT_TRUE((*e)->Finalize(Inits()).ok());
      for (int m = 0; m < kMicro; ++m) {
        (*e)->SetSync(m == kMicro - 1);
        ASSERT_TRUE((*e)->Gather(0).ok());
        auto g = (*e)->Grad(*h);
        ASSERT_TRUE(g.ok()) << g.status();
        EXPECT_EQ(g->dtype, fp32 ? DType::kF32 : DType::kBF16);
        const float add = m == 0 ? 1.0f : 0x1p-9f;
        if (fp32) {
          for (float& x : g->as<float>()) x += add;
        } else {
          for (bf16& x : g->as<bf16>()) x = x + add;
        }
        ASSERT_TRUE((*e)->Release(0).ok());
        ASSERT_TRUE((*e)->GradsReady(0).ok());
      }
      auto r = (*e)->Step();
      ASSERT_TRUE(r.ok()) << r.status();
      const double exact = std::sqrt(static_cast<double>(kN)) * (1.0 + 31.0 / 512.0) / kMicro;
      const double lost = std::sqrt(static_cast<double>(kN)) * 1.0 / kMicro;
      if (fp32) {
        EXPECT_NEAR(r->grad_norm, exact, 1e-6 * exact) << "stage " << stage;
      } else {
        EXPECT_NEAR(r->grad_norm, lost, 1e-6 * lost) << "stage " << stage << ": 16-bit accumulation kept what it cannot";
      }
      // The memory report: gradients at 4 bytes per element (stages 0-1 full, 2-3 the shard).
      const int64_t per = fp32 ? 4 : 2;
      const auto m = (*e)->memory();
      const int64_t shard = (kN + 63) / 64 * 64;  // alignment 64, world of `size()` ranks
      (void)shard;
      const int64_t grads = m.current_of(MemCategory::kGradients);
      if (stage <= 1) {
        EXPECT_GE(grads, kN * per) << "stage " << stage;
        EXPECT_LT(grads, (kN + 64 * size()) * per) << "stage " << stage;
      } else {
        EXPECT_GE(grads * size(), kN * per) << "stage " << stage;
        EXPECT_LT(grads * size(), (kN + 64 * size()) * per) << "stage " << stage;
      }
    }
  }
}

TEST_F(TrainerApiTest, FrozenTensorsTakeNoGradientNoStateAndComeBackFromACheckpoint) {
  const std::string root = ::testing::TempDir() + "/zrt_trainer_frozen_" + std::to_string(size());
  // Every stage; then the offloaded stage 3 (parameter shards in host memory, or everything on NVMe:
  // the save is handed over by the next steps, the store numbering its groups without the frozen
  // one) and device memory the host cannot address (CpuDevice(false): the frozen shard is cast
  // through device staging).
  struct Case {
    int stage;
    OffloadTarget offload;
    bool host_accessible;
  };
  for (const Case c : {Case{0, OffloadTarget::kNone, true}, Case{1, OffloadTarget::kNone, true}, Case{2, OffloadTarget::kNone, true},
                       Case{3, OffloadTarget::kNone, true}, Case{3, OffloadTarget::kHost, false}, Case{2, OffloadTarget::kNone, false},
                       Case{3, OffloadTarget::kNvme, true}}) {
    const int stage = c.stage;
    if (rank() == 0) std::filesystem::remove_all(root);
    MPI_Barrier(MPI_COMM_WORLD);
    EngineConfig cfg;
    cfg.stage = stage;
    cfg.adam.lr = 1e-2;
    cfg.adam.weight_decay = 0.1;
    cfg.offload.optimizer = c.offload;
    if (stage == 3) cfg.offload.params = c.offload;
    // "embed" (group g0) frozen; the reference trains it with lr 0 and no decay, which leaves it as it
    // was, so every other tensor must follow the same trajectory bit for bit (no clipping).
    CpuDevice dev_a(c.host_accessible), dev_ref(c.host_accessible), dev_b(c.host_accessible);  // accounting per engine
    auto make = [&](bool frozen, const InitFn& init, Device* dev) -> Result<std::unique_ptr<ZeroEngine>> {
      EngineConfig ec = cfg;
      if (c.offload == OffloadTarget::kNvme) {  // a directory per live engine
        ec.offload.nvme_dir = root + "-swap/" + std::to_string(reinterpret_cast<uintptr_t>(dev));
        std::filesystem::create_directories(ec.offload.nvme_dir);
        ec.offload.sub_group_elements = 512;
      }
      ASSIGN_OR_RETURN(auto e, ZeroEngine::Create(comm_.get(), dev, ec));
      for (const ParamDef& p : kModel) {
        ParamOptions o{.group = p.group};
        if (p.name == "embed") {
          o.frozen = frozen;
          o.lr_scale = 0;
          o.weight_decay = 0;
        }
        RETURN_IF_ERROR(e->AddParam(p.name, p.shape, DType::kBF16, o).status());
      }
      RETURN_IF_ERROR(e->Finalize(init));
      return e;
    };
    auto a = make(true, Inits(), &dev_a);
    auto ref = make(false, Inits(), &dev_ref);
    ASSERT_TRUE(a.ok() && ref.ok()) << a.status() << ref.status();
    const auto initial = Params(**a, kModel.size());
    auto train = [&](ZeroEngine& e, bool frozen, int steps) {
      for (int s = 0; s < steps; ++s) {
        for (int g = e.num_groups() - 1; g >= 0; --g) {
          ASSERT_TRUE(e.Gather(g).ok());
          for (size_t p = 0; p < kModel.size(); ++p) {
            const ParamHandle h{static_cast<int64_t>(p)};
            if (e.group(h) != g) continue;
            if (frozen && kModel[p].name == "embed") {
              EXPECT_EQ(e.Grad(h).status().code(), StatusCode::kFailedPrecondition);
              continue;
            }
            std::span<const bf16> w = e.Param(h).value().as<bf16>();
            std::span<bf16> gr = e.Grad(h).value().as<bf16>();
            for (size_t i = 0; i < w.size(); ++i) gr[i] = Grad(h.index, static_cast<int64_t>(i), w[i]);
          }
          ASSERT_TRUE(e.Release(g).ok());
          ASSERT_TRUE(e.GradsReady(g).ok());  // a no-op for the frozen group
        }
        auto r = e.Step();
        ASSERT_TRUE(r.ok()) << r.status();
      }
    };
    train(**a, true, 3);
    train(**ref, false, 3);
    const auto got = Params(**a, kModel.size());
    EXPECT_EQ(got, Params(**ref, kModel.size())) << "stage " << stage;
    EXPECT_EQ(got[0], initial[0]) << "stage " << stage << ": the frozen tensor changed";
    // The saving: no gradient and no optimizer state for the frozen group.
    const auto ma = c.offload == OffloadTarget::kNone ? (*a)->memory() : (*a)->host_memory();
    const auto mr = c.offload == OffloadTarget::kNone ? (*ref)->memory() : (*ref)->host_memory();
    const int64_t embed = 37 * 29, n = stage == 0 ? 1 : size();
    if (c.offload != OffloadTarget::kNvme) {  // (on NVMe the state is in files)
      EXPECT_GE(mr.current_of(MemCategory::kOptimizerState) - ma.current_of(MemCategory::kOptimizerState), 12 * (embed / n))
          << "stage " << stage << "\n" << ma.ToString() << mr.ToString();
    }
    if (stage <= 1 && c.offload == OffloadTarget::kNone) {
      EXPECT_GE(mr.current_of(MemCategory::kGradients) - ma.current_of(MemCategory::kGradients), 2 * embed);
    }
    // Saved (its values, as master, and nothing else) and loaded into an engine that initialised it
    // otherwise.
    // The memory tier takes a snapshot of the same step beside it (on NVMe both wait for the next step).
    CpuDevice staging;
    const ckpt::MemoryTierOptions tier{.dir = root + "-shm"};
    auto ck = ckpt::Checkpointer::Create(comm_.get(), &staging, {.root = root, .memory = tier});
    ASSERT_TRUE(ck.ok());
    ASSERT_TRUE((*ck)->SaveAsync((*a)->state_view()).ok());
    ASSERT_TRUE((*ck)->SaveToMemory((*a)->state_view()).ok());
    train(**a, true, 2);  // the saves are of the state before these steps
    ASSERT_TRUE((*ck)->Wait().ok());
    auto b = make(true, [](int64_t, int64_t, int64_t count, float* out) { std::fill(out, out + count, 0.25f); }, &dev_b);
    ASSERT_TRUE(b.ok());
    auto r = ckpt::Resume(comm_.get(), {.root = root}, (*b)->state_view());
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(Params(**b, kModel.size()), got) << "stage " << stage;
    train(**b, true, 2);
    EXPECT_EQ(Params(**b, kModel.size()), Params(**a, kModel.size())) << "stage " << stage;
    {  // and from the tier's snapshot
      CpuDevice dev_c(c.host_accessible);
      auto e = make(true, [](int64_t, int64_t, int64_t count, float* out) { std::fill(out, out + count, -0.5f); }, &dev_c);
      ASSERT_TRUE(e.ok());
      auto rt = (*ck)->Resume((*e)->state_view());
      ASSERT_TRUE(rt.ok()) << rt.status();
      EXPECT_EQ(rt->source, "memory") << "stage " << stage;
      EXPECT_EQ(Params(**e, kModel.size()), got) << "stage " << stage;
    }
    ck->reset();
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank() == 0) std::filesystem::remove_all(root + "-shm");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank() == 0) std::filesystem::remove_all(root + "-swap");
  if (rank() == 0) std::filesystem::remove_all(root);
  // A group is frozen or not.
  auto m = ZeroEngine::Create(comm_.get(), &device_, EngineConfig{});
  ASSERT_TRUE(m.ok());
  ASSERT_TRUE((*m)->AddParam("a", {4}, DType::kF32, {.group = "g"}).ok());
  ASSERT_TRUE((*m)->AddParam("b", {4}, DType::kF32, {.group = "g", .frozen = true}).ok());
  Status mixed = (*m)->Finalize(Inits());
  EXPECT_EQ(mixed.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(mixed.message().find("mixes frozen and trainable"), std::string_view::npos) << mixed;
}

TEST_F(TrainerApiTest, FullStateInProcessOnOneRankOrEveryRank) {
  // The full master of a tensor is its parameters' fp32 values: an fp32 model's parameters are the
  // master bit for bit, so the gathered parameters are the reference, at every stage and placement.
  for (OffloadTarget off : {OffloadTarget::kNone, OffloadTarget::kHost, OffloadTarget::kNvme}) {
    for (int stage = 0; stage <= 3; ++stage) {
      const std::string swap = ::testing::TempDir() + "/zrt_full_state_swap";
      if (rank() == 0) std::filesystem::create_directories(swap);
      MPI_Barrier(MPI_COMM_WORLD);
      EngineConfig cfg;
      cfg.stage = stage;
      cfg.adam.amsgrad = true;
      cfg.offload.optimizer = off;
      cfg.offload.nvme_dir = swap;
      cfg.offload.sub_group_elements = 1024;
      auto e = MakeWith(cfg, DType::kF32, true);
      ASSERT_TRUE(e.ok()) << e.status();
      Steps(**e, 2);
      const auto params = Params(**e, kModel.size());
      for (int root : {-1, 0, size() - 1}) {
        std::map<std::string, std::map<std::string, std::vector<float>>> got;
        FullStateOptions o;
        o.root = root;
        o.kinds = {"master", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
        Status s = (*e)->ForEachFullTensor(o, [&](const TensorSpec& t, std::string_view kind, std::span<const float> v) {
          EXPECT_EQ(static_cast<int64_t>(v.size()), t.numel());
          got[t.name][std::string(kind)].assign(v.begin(), v.end());
          return Status();
        });
        ASSERT_TRUE(s.ok()) << s;
        auto one = (*e)->FullMaster({4}, root);  // w2; collective
        ASSERT_TRUE(one.ok()) << one.status();
        if (root != -1 && root != rank()) {
          EXPECT_TRUE(got.empty());
          EXPECT_TRUE(one->empty());
          continue;
        }
        EXPECT_EQ(*one, params[4]);
        ASSERT_EQ(got.size(), kModel.size());
        for (size_t p = 0; p < kModel.size(); ++p) {
          const auto& kinds = got[kModel[p].name];
          EXPECT_EQ(kinds.size(), 4u);
          EXPECT_EQ(kinds.at("master"), params[p]) << kModel[p].name << " stage " << stage << " offload " << OffloadTargetName(off);
          // After two steps of nonzero gradients the second moment is positive where the tensor is.
          for (float v : kinds.at("exp_avg_sq")) ASSERT_GT(v, 0.0f) << kModel[p].name;
        }
      }
      EXPECT_EQ((*e)->FullMaster({99}).status().code(), StatusCode::kNotFound);
      FullStateOptions bad;
      bad.tensors = {"nope"};
      EXPECT_EQ((*e)->ForEachFullTensor(bad, [](const TensorSpec&, std::string_view, std::span<const float>) { return Status(); }).code(),
                StatusCode::kNotFound);
      // A callback's failure on one rank stops every rank.
      FullStateOptions all;
      all.root = -1;
      int calls = 0;
      Status stop = (*e)->ForEachFullTensor(all, [&](const TensorSpec&, std::string_view, std::span<const float>) {
        ++calls;
        return rank() == size() - 1 ? IoError("disk full") : Status();
      });
      EXPECT_EQ(stop.code(), StatusCode::kIo) << stop;
      EXPECT_EQ(calls, 1);
    }
  }
}

// Pretrained weights in safetensors initialise an engine at any world size, stage and placement:
// a full-state export restores the run exactly (its next steps are bit for bit the original's), a
// parameters-only load takes the weights with fresh optimizer state, and a name that does not match
// fails on every rank.
TEST_F(TrainerApiTest, SafetensorsInitialiseAnEngineOrRestoreItsWholeState) {
  const std::string dir = ::testing::TempDir() + "/zrt_safetensors_" + std::to_string(size());
  if (rank() == 0) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir + "/swap");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  for (int stage : {0, 2, 3}) {
    EngineConfig cfg;
    cfg.stage = stage;
    int engines = 0;
    auto make = [&] {  // each engine its own swap directory
      if (stage == 3) {  // the state on NVMe: loaded through its write callbacks
        cfg.offload.optimizer = OffloadTarget::kNvme;
        cfg.offload.nvme_dir = dir + "/swap/" + std::to_string(engines++);
        cfg.offload.sub_group_elements = 1024;
        std::filesystem::create_directories(cfg.offload.nvme_dir);
      }
      return MakeWith(cfg, DType::kBF16, true);
    };
    auto a = make();
    ASSERT_TRUE(a.ok()) << a.status();
    Steps(**a, 2);
    CpuDevice staging;
    const std::string root = dir + "/ckpt" + std::to_string(stage), file = dir + "/m" + std::to_string(stage) + ".safetensors";
    {
      auto ck = ckpt::Checkpointer::Create(comm_.get(), &staging, {.root = root});
      ASSERT_TRUE(ck.ok()) << ck.status();
      ASSERT_TRUE((*ck)->SaveAsync((*a)->state_view()).ok());
      ASSERT_TRUE((*ck)->Wait().ok());
    }
    if (rank() == 0) {
      auto latest = ckpt::FindLatestComplete(root);
      ASSERT_TRUE(latest.ok()) << latest.status();
      ASSERT_TRUE(ckpt::ExportSafetensors(*latest, file, {.all_states = true, .max_shard_bytes = 8192}).ok());
    }
    MPI_Barrier(MPI_COMM_WORLD);
    // The whole state: the same run from here on.
    auto b = make();
    ASSERT_TRUE(b.ok()) << b.status();
    auto loaded = ckpt::LoadSafetensors(comm_.get(), file, (*b)->state_view(), {.params_only = false});
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_EQ((*b)->steps(), 2);
    Steps(**a, 2);
    Steps(**b, 2);
    EXPECT_EQ(Params(**a, kModel.size()), Params(**b, kModel.size())) << "stage " << stage;
    // Parameters only: the weights, step 0, zero moments.
    auto c = make();
    ASSERT_TRUE(c.ok()) << c.status();
    ASSERT_TRUE(ckpt::LoadSafetensors(comm_.get(), file, (*c)->state_view()).ok());
    EXPECT_EQ((*c)->steps(), 0);
    auto exp_avg = (*c)->ForEachFullTensor({.kinds = {"exp_avg"}}, [](const TensorSpec& t, std::string_view, std::span<const float> v) {
      for (float x : v) EXPECT_EQ(x, 0.0f) << t.name;
      return Status();
    });
    EXPECT_TRUE(exp_avg.ok()) << exp_avg;
    // A tensor the file does not have (renamed away): the same error on every rank, naming it.
    auto d = make();
    ASSERT_TRUE(d.ok()) << d.status();
    ckpt::SafetensorsLoadOptions renamed;
    renamed.names.exact["w1"] = "w1_renamed";
    auto bad = ckpt::LoadSafetensors(comm_.get(), file, (*d)->state_view(), renamed);
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.status().message().find("'w1"), std::string_view::npos) << bad.status();
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank() == 0) std::filesystem::remove_all(dir);
}

TEST_F(TrainerApiTest, StepTimesAddUpAndTheJsonLinesLogHasOneObjectPerStep) {
  const std::string dir = ::testing::TempDir() + "/zrt_metrics_" + std::to_string(size());
  if (rank() == 0) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  EngineConfig cfg;
  cfg.stage = 3;
  cfg.metrics = {.tokens_per_step = 512, .flops_per_step = 3e9, .peak_flops = 1e12, .jsonl_path = dir + "/steps-{rank}.jsonl"};
  auto e = MakeWith(cfg, DType::kBF16, true);
  ASSERT_TRUE(e.ok()) << e.status();
  CpuDevice staging;
  auto ck = ckpt::Checkpointer::Create(comm_.get(), &staging, {.root = dir + "/ckpt"});
  ASSERT_TRUE(ck.ok());
  auto sleep = [](int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); };
  for (int s = 0; s < 3; ++s) {
    (*e)->Mark(Phase::kForward);
    sleep(20);
    (*e)->Mark(Phase::kBackward);
    Backward(**e, kModel.size(), Grad);  // engine time inside the phase goes to comm_wait, not backward
    sleep(30);
    (*e)->Record("loss", 1.5 - s);
    auto r = (*e)->Step();
    ASSERT_TRUE(r.ok()) << r.status();
    const StepTimes& t = r->times;
    EXPECT_GE(t.forward, 0.02);
    EXPECT_GE(t.backward, 0.03);
    EXPECT_GT(t.comm_wait, 0.0);
    EXPECT_GT(t.optimizer, 0.0);
    EXPECT_EQ(t.offload_io, 0.0);
    EXPECT_NEAR(t.forward + t.backward + t.comm_wait + t.optimizer + t.offload_io + t.checkpoint_stall + t.other, t.total, 1e-9);
    if (s == 2) {
      EXPECT_GT(t.checkpoint_stall, 0.0);  // the save after step 2 falls in step 3's interval
    } else {
      EXPECT_EQ(t.checkpoint_stall, 0.0);
    }
    EXPECT_DOUBLE_EQ(r->tokens_per_second, 512.0 * size() / t.total);
    EXPECT_DOUBLE_EQ(r->mfu, 3e9 / (t.total * 1e12));
    if (s == 1) {
      ASSERT_TRUE((*ck)->SaveAsync((*e)->state_view()).ok());
    }
  }
  ASSERT_TRUE((*ck)->Wait().ok());
  std::ifstream in(dir + "/steps-" + std::to_string(rank()) + ".jsonl");
  std::vector<nlohmann::json> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(nlohmann::json::parse(l));
  ASSERT_EQ(lines.size(), 3u);
  for (int s = 0; s < 3; ++s) {
    const nlohmann::json& j = lines[static_cast<size_t>(s)];
    EXPECT_EQ(j["step"], s + 1);
    EXPECT_EQ(j["loss"], 1.5 - s);
    EXPECT_GT(j["time"]["total"].get<double>(), 0.05);
    EXPECT_TRUE(j.contains("tokens_per_second") && j.contains("mfu") && j["time"].contains("checkpoint_stall")) << j.dump();
  }
  // A log that cannot be opened fails the engine's creation, naming the path.
  EngineConfig bad = cfg;
  bad.metrics.jsonl_path = dir + "/no/such/dir/{rank}.jsonl";
  auto f = ZeroEngine::Create(comm_.get(), &device_, bad);
  EXPECT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("no/such/dir"), std::string_view::npos) << f.status();
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank() == 0) std::filesystem::remove_all(dir);
}

// Reduction timings: every collective's time in flight and the caller's time in it. With one bucket
// launched at Step nothing overlaps it: all of it is waited for. (How much small buckets launched
// during backward hide depends on the ranks' timing: bench/gpt_step measures it.)
TEST_F(TrainerApiTest, ReductionTimesSayHowMuchWasWaitedFor) {
  for (int64_t bucket : {int64_t{32} << 20, int64_t{512} * size()}) {
    EngineConfig cfg;
    cfg.stage = 2;
    cfg.bucket_bytes = bucket;
    auto e = MakeWith(cfg, DType::kF32, false);
    ASSERT_TRUE(e.ok()) << e.status();
    const CommStats before = (*e)->comm_stats();
    for (int g = (*e)->num_groups() - 1; g >= 0; --g) {
      ASSERT_TRUE((*e)->GradBuffer(g).ok());
      ASSERT_TRUE((*e)->GradsReady(g).ok());
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // the next group's backward
    }
    ASSERT_TRUE((*e)->Step().ok());
    const CommStats after = (*e)->comm_stats();
    if (size() == 1) {  // nothing is reduced on one rank: nothing is sent or waited for
      EXPECT_EQ(after.reduce_seconds, before.reduce_seconds);
      EXPECT_EQ(after.reduce_wait_seconds, before.reduce_wait_seconds);
      continue;
    }
    const double in_flight = after.reduce_seconds - before.reduce_seconds;
    const double waited = after.reduce_wait_seconds - before.reduce_wait_seconds;
    EXPECT_GT(in_flight, 0.0);
    EXPECT_GE(waited, 0.0);
    EXPECT_LE(waited, in_flight);
    if (bucket == int64_t{32} << 20) {
      EXPECT_GT(waited, 0.9 * in_flight) << "one bucket, launched at Step: nothing hides it";
    } else {
      EXPECT_GT(after.collectives - before.collectives, 2) << "small buckets: several go out during backward";
    }
  }
}

TEST_F(TrainerApiTest, TensorsByNameAndHandleWithClearMisuseErrors) {
  EngineConfig cfg;
  cfg.stage = 3;
  auto e = MakeWith(cfg, DType::kBF16, true);
  ASSERT_TRUE(e.ok());
  auto h = (*e)->Find("w2");
  ASSERT_TRUE(h.ok());
  EXPECT_EQ((*e)->spec(*h).name, "w2");
  EXPECT_EQ((*e)->Find("w3").status().code(), StatusCode::kNotFound);
  EXPECT_EQ((*e)->Param("w3").status().code(), StatusCode::kNotFound);
  // Stage 3: a tensor's parameters exist only while its group is gathered.
  Status not_gathered = (*e)->Param(*h).status();
  EXPECT_EQ(not_gathered.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(not_gathered.message().find("'w2'"), std::string_view::npos) << not_gathered;
  EXPECT_NE(not_gathered.message().find("'g2'"), std::string_view::npos) << not_gathered;
  const int g = (*e)->group(*h);
  auto base = (*e)->Gather(g);
  ASSERT_TRUE(base.ok());
  auto v = (*e)->Param("w2");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->data, base.value());  // first tensor of its group
  EXPECT_EQ(v->numel(), 4099);
  EXPECT_EQ(static_cast<float>(v->as<bf16>()[5]), static_cast<float>(bf16(Init(h->index, 5))));
  auto tiny = (*e)->Param("tiny");
  ASSERT_TRUE(tiny.ok());
  EXPECT_EQ(static_cast<float>(tiny->as<bf16>()[0]), static_cast<float>(bf16(Init(5, 0))));
  // Stages 2-3: no gradient after the group's reduction was queued.
  ASSERT_TRUE((*e)->Grad(*h).ok());
  ASSERT_TRUE((*e)->Release(g).ok());
  ASSERT_TRUE((*e)->GradsReady(g).ok());
  EXPECT_EQ((*e)->Grad("w2").status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE((*e)->Step().ok());
  // Settings must be finite and non-negative, and agree across ranks.
  auto f = ZeroEngine::Create(comm_.get(), &device_, cfg);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ((*f)->AddParam("x", {3}, DType::kF32, {.lr_scale = -1}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*f)->AddParam("y", {3}, DType::kF32, {.weight_decay = NAN}).status().code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE((*f)->AddParam("z", {3}, DType::kF32, {.weight_decay = rank() == size() - 1 && size() > 1 ? 0.5 : 0.0}).ok());
  Status mixed = (*f)->Finalize(Inits());
  if (size() > 1) {
    EXPECT_EQ(mixed.code(), StatusCode::kInvalidArgument) << mixed;
    EXPECT_NE(mixed.message().find("weight_decay"), std::string_view::npos) << mixed;
  } else {
    EXPECT_TRUE(mixed.ok()) << mixed;
  }
}

}  // namespace
}  // namespace zrt
