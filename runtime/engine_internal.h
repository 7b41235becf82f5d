// Internal to the engine (engine.cc, engine_settings.cc, engine_registration.cc, engine_mesh.cc): its per-group state and the components it
// owns. Not installed.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "zrt/core/thread_pool.h"
#include "zrt/kernels/cpu.h"
#include "zrt/offload/host_memory.h"
#include "zrt/runtime/buffer_pool.h"
#include "zrt/runtime/compute.h"
#include "zrt/runtime/engine_core.h"
#include "zrt/runtime/grad_bucketer.h"
#include "zrt/runtime/optimizer_store.h"
#include "zrt/runtime/param_gatherer.h"
#include "zrt/runtime/step_metrics.h"

namespace zrt {

struct EngineCore::Group {
  std::string name;
  DType dtype = DType::kF32;       // of the parameters
  DType grad_dtype = DType::kF32;  // of the gradients: dtype, or f32 with fp32_grads
  std::vector<int64_t> params;
  std::vector<TensorSpec> tensors;
  ShardLayout layout;
  // This rank's shard as runs [begin, end) of tensors whose optimizer settings are classes[cls]
  // (padding goes with the run before it); one Adam call per class per window.
  struct Run {
    int64_t begin, end;
    int cls;
  };
  std::vector<Run> runs;
  std::vector<Settings> classes;
  bool frozen = false;  // no gradients, no optimizer state (a store slot holding master only: its parameters)
  StatePrecision state;  // of its optimizer state (trainable groups)
  // Its own data-parallel group (ParamOptions::data_parallel), or null: the engine's shard group. The
  // reduction averages over it; grad_scale (its size / the world's) makes that the average over the
  // world, applied with the step's multiplier.
  Communicator* dp = nullptr;
  float grad_scale = 1;
  DeviceBuffer full_param, param_shard, full_grad, grad_shard;
  bool gathered = false;      // stages 0-2 bookkeeping for Release
  bool grad_live = false;     // full gradient exists (and is zeroed) for this step
  bool grad_reduced = false;  // reduction queued this step
  size_t esize() const { return DTypeSize(dtype); }
  size_t gsize() const { return DTypeSize(grad_dtype); }
};

struct EngineCore::Impl {
  Impl(Device* d, int n_threads) : pool(n_threads - 1, "zrt-adam"), threads(n_threads), staging(d, MemCategory::kStaging) {}
  ThreadPool pool;
  int threads;  // optimizer threads, caller included
  // Host memory offload takes (state with offload = host; NVMe buffer sets; held parameter shards).
  // Declared before the components whose buffers come from it.
  std::unique_ptr<HostMemory> host;
  std::unique_ptr<BufferPool> host_staging;  // stage-3 parameter shards read from NVMe
  std::unique_ptr<Compute> compute;          // kernels on the device's buffers
  std::unique_ptr<Compute> host_compute;     // CPU kernels on offloaded state
  BufferPool staging;
  std::unique_ptr<GradBucketer> bucketer;
  std::unique_ptr<GradBucketer> own_bucketer;  // the groups over their own data-parallel group (EngineCore::own_dp_)
  std::unique_ptr<ParamGatherer> gatherer;
  std::unique_ptr<OptimizerStore> store;
  CommStats step_gathers;  // stages 1-2 parameter all-gathers after the step
  internal::StepClock clock;
  std::unique_ptr<internal::JsonlSink> sink;
  nlohmann::json recorded = nlohmann::json::object();
  std::unique_ptr<StateOwner> owner;  // the views' (engine.cc EngineStateOwner)
  kernels::CpuKernelOptions kernel_options() {
    kernels::CpuKernelOptions ko;
    ko.pool = &pool;
    ko.threads = threads;
    return ko;
  }
};

namespace internal {
// Learning rates, scales and decays: finite and >= 0; the error names what and whose.
inline Status CheckRate(const char* what, const std::string& name, double v) {
  if (!(v >= 0) || !std::isfinite(v)) return InvalidArgumentError(what, " of '", name, "' must be finite and >= 0, got ", v);
  return Status();
}
// qwZ and qgZ (EngineConfig::quantized_weights, quantized_gradients): where each can work (engine_mesh.cc).
Status CheckQuantizedCollectives(const EngineConfig& c, const Device& device);
}  // namespace internal

}  // namespace zrt
