// The synthetic model the checkpoint and recovery benchmarks train under mpirun: `groups` bf16 tensors
// of params / groups elements with Adam at ZeRO stage `stage` (state in memory or on NVMe), a step of
// sparse constant gradients, and the all-rank max/sum of a figure.
#pragma once

#include <mpi.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>

#include "zrt/runtime/engine.h"

namespace zrt::bench {

inline double MaxOverRanks(double v) {
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return v;
}
inline double SumOverRanks(double v) {
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  return v;
}

// `nvme_dir` set: the optimizer state and (stage 3) the parameter shards live in swap files there;
// `state`: its precision.
inline std::unique_ptr<ZeroEngine> MakeEngine(Communicator* comm, Device* dev, int stage, int64_t params, int groups,
                                              const std::string& nvme_dir = "", const StatePrecision& state = {}, int shard_group = 0) {
  EngineConfig cfg;
  cfg.stage = stage;
  cfg.shard_group_size = shard_group;
  cfg.state = state;
  cfg.optimizer_threads = 1;
  if (!nvme_dir.empty()) {
    cfg.offload.optimizer = OffloadTarget::kNvme;
    if (stage == 3) cfg.offload.params = OffloadTarget::kNvme;
    cfg.offload.nvme_dir = nvme_dir;
  }
  auto e = ZeroEngine::Create(comm, dev, cfg).value();
  for (int g = 0; g < groups; ++g) (void)e->AddParam("w" + std::to_string(g), {params / groups}, DType::kBF16, {.group = "l" + std::to_string(g)});
  (void)e->Finalize([](int64_t p, int64_t off, int64_t n, float* out) {
    for (int64_t i = 0; i < n; ++i) out[i] = 0.02f * std::sin(0.001f * static_cast<float>(off + i) + static_cast<float>(p));
  });
  return e;
}

// One step: every 4096th gradient element set (its value varies with the step count), then
// `before_update` (if any: the rest of a backward pass, a checkpointer's Poll), then Step.
inline void Step(ZeroEngine& e, int64_t n_per_group, const std::function<void()>& before_update = {}) {
  for (int g = e.num_groups() - 1; g >= 0; --g) {
    (void)e.Gather(g);
    auto* h = static_cast<uint16_t*>(*e.GradBuffer(g));
    for (int64_t i = 0; i < n_per_group; i += 4096) h[i] = FloatToBf16(1e-3f * static_cast<float>(e.steps() % 7 + 1));
    (void)e.Release(g);
    (void)e.GradsReady(g);
  }
  if (before_update) before_update();
  (void)e.Step();
}

}  // namespace zrt::bench
