// OptimizerStore on in-process ranks: every placement (device memory, host memory, host memory behind
// mirrors of "device" memory the host may not address, NVMe streamed in small sub-groups, stage-3
// parameter shards held in host memory or on NVMe) visits every element once per Update, brings the
// updated parameters to the engine's buffers, shows a checkpoint the same state, refreshes the
// parameters from a rewritten master, and agrees on a failure that happens on one rank only.
#include "zrt/runtime/optimizer_store.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <vector>

#include "zrt/core/communicator.h"

namespace zrt {
namespace {

namespace fs = std::filesystem;

struct Placement {
  const char* name;
  OffloadTarget optimizer, params;
  bool device_host_accessible;
};

const Placement kPlacements[] = {
    {"device", OffloadTarget::kNone, OffloadTarget::kNone, true},
    {"host", OffloadTarget::kHost, OffloadTarget::kNone, true},
    {"host_mirrored", OffloadTarget::kHost, OffloadTarget::kNone, false},
    {"host_params_host", OffloadTarget::kHost, OffloadTarget::kHost, false},
    {"nvme", OffloadTarget::kNvme, OffloadTarget::kNone, true},
    {"nvme_mirrored", OffloadTarget::kNvme, OffloadTarget::kNone, false},
    {"nvme_params_nvme", OffloadTarget::kNvme, OffloadTarget::kNvme, true},
};
const std::vector<int64_t> kShards = {5000, 1, 9000};  // elements per group (sub-groups of 4096 when streamed)

float Grad(size_t g, int64_t i, int step) { return static_cast<float>((static_cast<int64_t>(g) * 7 + i * 3 + step) % 11) - 5.0f; }

// What one rank's store ends with after `steps` updates: parameters (bf16 bits) and every state kind.
struct Outcome {
  std::vector<std::vector<uint16_t>> params;
  std::vector<std::vector<std::vector<float>>> state;  // [group][kind]
};

Result<Outcome> RunStore(Communicator& comm, const Placement& p, const fs::path& dir, int steps) {
  CpuDevice device(p.device_host_accessible);
  auto host = HostMemory::Create(0, "offload.host_budget_bytes");
  ASSIGN_OR_RETURN(auto compute, Compute::For(&device, {}));
  ASSIGN_OR_RETURN(auto host_compute, Compute::For(host.get(), {}));
  OptimizerStore::Options o;
  o.offload.optimizer = p.optimizer;
  o.offload.params = p.params;
  o.offload.nvme_dir = dir.string();
  o.offload.sub_group_elements = 4096;
  o.amsgrad = true;
  o.rank = comm.rank();
  ASSIGN_OR_RETURN(auto store, OptimizerStore::Create(&comm, &device, compute.get(), host.get(), host_compute.get(), o));
  std::vector<DeviceBuffer> grads, params;
  std::vector<OptimizerStore::Group> groups;
  for (size_t g = 0; g < kShards.size(); ++g) {
    const auto n = static_cast<size_t>(kShards[g]);
    ASSIGN_OR_RETURN(DeviceBuffer gb, device.Allocate(n * 2, MemCategory::kGradients));  // bf16, as the group
    grads.push_back(std::move(gb));
    OptimizerStore::Group sg{"g" + std::to_string(g), DType::kBF16, DType::kBF16, kShards[g], false, grads.back().data(), nullptr, {}};
    if (!store->holds_params()) {
      ASSIGN_OR_RETURN(DeviceBuffer pb, device.Allocate(n * 2, MemCategory::kParameters));
      params.push_back(std::move(pb));
      sg.params = params.back().data();
    }
    sg.init = [g, r = comm.rank()](int64_t off, int64_t count, float* out) {
      for (int64_t i = 0; i < count; ++i) out[i] = static_cast<float>(r) + 0.25f * static_cast<float>(g) + 1e-3f * static_cast<float>(off + i);
    };
    groups.push_back(std::move(sg));
  }
  RETURN_IF_ERROR(store->Init(std::move(groups)));
  for (int step = 0; step < steps; ++step) {
    for (size_t g = 0; g < kShards.size(); ++g) {  // the engine's gradients, written on the "device"
      std::vector<uint16_t> v(static_cast<size_t>(kShards[g]));
      for (size_t i = 0; i < v.size(); ++i) v[i] = FloatToBf16(Grad(g, static_cast<int64_t>(i), step));
      RETURN_IF_ERROR(device.Copy(grads[g].data(), v.data(), v.size() * 2));
    }
    std::vector<int64_t> seen(kShards.size(), 0);
    RETURN_IF_ERROR(store->Update([&](const OptimizerStore::Window& w) -> Status {
      EXPECT_EQ(w.offset, seen[static_cast<size_t>(w.group)]) << "windows in order, each element once";
      seen[static_cast<size_t>(w.group)] += w.count;
      const auto* gr = static_cast<const uint16_t*>(w.grads);
      for (int64_t i = 0; i < w.count; ++i) {
        const float gi = Bf16ToFloat(gr[i]);
        w.master[i] = 0.5f * w.master[i] + gi;
        w.exp_avg[i] += gi;
        w.exp_avg_sq[i] = w.master[i] * w.master[i];
        w.max_exp_avg_sq[i] = std::max(w.max_exp_avg_sq[i], w.exp_avg_sq[i]);
      }
      return w.compute->Cast(w.master, DType::kF32, w.params, DType::kBF16, w.count);
    }));
    for (size_t g = 0; g < kShards.size(); ++g) EXPECT_EQ(seen[g], kShards[g]);
  }
  Outcome out;
  for (size_t g = 0; g < kShards.size(); ++g) {
    auto& pv = out.params.emplace_back(static_cast<size_t>(kShards[g]));
    const OptimizerStore::ParamSource src = store->Params(static_cast<int>(g));
    if (src.load) {
      DeviceBuffer dst;
      ASSIGN_OR_RETURN(dst, host->Allocate(src.load_bytes, MemCategory::kStaging, 4096));
      ASSIGN_OR_RETURN(IoHandle h, src.load(dst.data()));
      RETURN_IF_ERROR(h.Wait());
      std::memcpy(pv.data(), dst.data(), pv.size() * 2);
    } else if (store->holds_params()) {
      std::memcpy(pv.data(), src.shard, pv.size() * 2);  // held in host memory
    } else {
      RETURN_IF_ERROR(device.Copy(pv.data(), params[g].data(), pv.size() * 2));
    }
    auto& sv = out.state.emplace_back();
    const std::vector<StateBuffer> buffers = store->StateBuffers(static_cast<int>(g));
    for (size_t k = 0; k < buffers.size(); ++k) {
      auto& v = sv.emplace_back(static_cast<size_t>(buffers[k].count));
      if (buffers[k].resident()) {
        std::memcpy(v.data(), buffers[k].data, v.size() * 4);
      } else {
        RETURN_IF_ERROR(store->Read(static_cast<int>(g), static_cast<int>(k), 0, buffers[k].count, v.data()));
      }
    }
    EXPECT_EQ(sv.size(), 4u);
  }
  // A load rewrites master through the state view; RefreshParams brings the parameters along.
  for (size_t g = 0; g < kShards.size(); ++g) {
    StateBuffer master = store->StateBuffers(static_cast<int>(g))[0];
    EXPECT_EQ(master.kind, "master");
    std::vector<float> v(static_cast<size_t>(master.count), 2.5f);
    if (master.resident()) {
      std::memcpy(master.data, v.data(), v.size() * 4);
    } else {
      RETURN_IF_ERROR(store->Write(static_cast<int>(g), 0, 0, master.count, v.data()));
    }
  }
  RETURN_IF_ERROR(store->RefreshParams());
  if (!store->holds_params()) {
    std::vector<uint16_t> pv(static_cast<size_t>(kShards[0]));
    RETURN_IF_ERROR(device.Copy(pv.data(), params[0].data(), pv.size() * 2));
    for (uint16_t x : pv) EXPECT_EQ(x, FloatToBf16(2.5f));
  }
  return out;
}

class OptimizerStoreTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("zrt_store_" + std::to_string(::getpid()) + "_" + std::to_string(GetParam()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_P(OptimizerStoreTest, EveryPlacementGivesTheSameParametersAndState) {
  const int ranks = GetParam();
  std::vector<std::vector<Outcome>> outcomes(std::size(kPlacements), std::vector<Outcome>(static_cast<size_t>(ranks)));
  for (size_t k = 0; k < std::size(kPlacements); ++k) {
    SCOPED_TRACE(kPlacements[k].name);
    Status s = RunLoopbackRanks(ranks, [&](Communicator& comm) -> Status {
      ASSIGN_OR_RETURN(outcomes[k][static_cast<size_t>(comm.rank())], RunStore(comm, kPlacements[k], dir_, 3));
      return Status();
    });
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_TRUE(fs::is_empty(dir_)) << "swap files outlived the store";
  }
  for (size_t k = 1; k < std::size(kPlacements); ++k) {
    for (int r = 0; r < ranks; ++r) {
      EXPECT_EQ(outcomes[k][static_cast<size_t>(r)].params, outcomes[0][static_cast<size_t>(r)].params) << kPlacements[k].name;
      EXPECT_EQ(outcomes[k][static_cast<size_t>(r)].state, outcomes[0][static_cast<size_t>(r)].state) << kPlacements[k].name;
    }
  }
}

TEST_P(OptimizerStoreTest, AFailureOnOneRankIsEveryRanksError) {
  const int ranks = GetParam();
  if (ranks == 1) GTEST_SKIP() << "needs a second rank";
  std::vector<Status> got(static_cast<size_t>(ranks));
  (void)RunLoopbackRanks(ranks, [&](Communicator& comm) -> Status {
    // The last rank's NVMe directory does not exist.
    const fs::path dir = comm.rank() == ranks - 1 ? dir_ / "missing" : dir_;
    got[static_cast<size_t>(comm.rank())] = RunStore(comm, kPlacements[4], dir, 1).status();
    return Status();
  });
  for (int r = 0; r < ranks; ++r) {
    const Status& s = got[static_cast<size_t>(r)];
    EXPECT_FALSE(s.ok()) << "rank " << r;
    if (r != ranks - 1) {
      EXPECT_NE(s.message().find("failed on rank " + std::to_string(ranks - 1)), std::string_view::npos) << s;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, OptimizerStoreTest, ::testing::Values(1, 2, 3));

}  // namespace
}  // namespace zrt
