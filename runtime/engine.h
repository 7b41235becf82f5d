// ZeroEngine: ZeRO stages 0-3 over a Communicator and a Device (../shared/DESIGN.md "Data flow").
//
// Use:
//   engine = ZeroEngine::Create(comm, device, config)
//   engine->AddParam("w1", {1024, 512}, DType::kBF16, "layer0") ... (same order on every rank)
//   engine->Finalize(init)                   // init fills fp32 values of a tensor range
//   each step, per micro-batch:
//     p = engine->Gather(g)                  // full parameters of group g (stage 3: all-gathered)
//     ... forward ... engine->Release(g)
//     gbuf = engine->GradBuffer(g)           // full gradient of group g, zeroed at first use; +=
//     ... backward ... engine->GradsReady(g) // queued for bucketed reduce-scatter (async)
//   result = engine->Step()
//
// Groups are the unit of gathering and reduction: each has one flat buffer (its tensors in
// registration order, ShardLayout-padded) and one dtype. Stage 0: all-reduce, full optimizer state on
// every rank. Stage 1: full params and grads, optimizer state sharded. Stage 2: gradients sharded too
// (a group's full gradient lives only from GradBuffer to GradsReady). Stage 3: parameters sharded too.
//
// Gradient accumulation: SetSync(false) for the first micro-steps (no communication; full gradients
// persist, also at stages 2-3), SetSync(true) before the last; gradients are divided by
// `grad_accum_steps` at the step. The trainer scales its loss by loss_scale() (fp16).
//
// Thread-safety: one thread at a time. Pointers returned by Gather/GradBuffer are valid until
// Release/GradsReady (stages 2-3) or the next Step.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "zrt/core/communicator.h"
#include "zrt/core/device.h"
#include "zrt/core/state_view.h"
#include "zrt/runtime/engine_config.h"
#include "zrt/runtime/loss_scaler.h"
#include "zrt/runtime/stats.h"

namespace zrt {

struct StepResult {
  bool skipped = false;     // non-finite gradients on some rank: nothing was updated
  double grad_norm = 0;     // global pre-clip norm of the (unscaled, averaged) gradients
  double loss_scale = 1;    // the scale used for this step's gradients
  double lr = 0;            // of the first group
  int64_t step = 0;         // optimizer steps taken so far (skipped ones excluded)
};

class ZeroEngine {
 public:
  // comm and device must outlive the engine.
  static Result<std::unique_ptr<ZeroEngine>> Create(Communicator* comm, Device* device, const EngineConfig& config);
  ~ZeroEngine();

  // Registers a parameter (before Finalize). All parameters of a group share one dtype.
  Status AddParam(const std::string& name, const std::vector<int64_t>& shape, DType dtype,
                  const std::string& group = "default");

  // Initial values: init(param, offset, count, out) writes fp32 values of elements [offset,
  // offset+count) of parameter `param` (registration index). Each rank is asked only for its shard.
  using InitFn = std::function<void(int64_t param, int64_t offset, int64_t count, float* out)>;
  // Checks that every rank registered the same parameters (the error names the first that differs),
  // builds the layouts and allocates the buffers.
  Status Finalize(const InitFn& init);

  int num_groups() const;
  Result<int> GroupIndex(const std::string& name) const;
  // Where parameter `param` lives: its group and element offset in the group's full buffers.
  struct ParamLocation {
    int group;
    int64_t offset;
    int64_t numel;
    DType dtype;
  };
  Result<ParamLocation> Locate(int64_t param) const;

  Result<void*> Gather(int group);
  Status Release(int group);
  Result<void*> GradBuffer(int group);
  Status GradsReady(int group);
  void SetSync(bool sync) { sync_ = sync; }

  Result<StepResult> Step();

  Status SetLr(int group, double lr);
  Status SetWeightDecay(int group, double weight_decay);
  double loss_scale() const { return scaler_.scale(); }
  int64_t steps() const { return steps_; }

  // This rank's optimizer state, for checkpoints (its `restore` is Restore).
  StateView state_view();
  // After restoring master/moments through state_view() buffers: re-derive the model parameters.
  // Collective.
  Status RefreshParamsFromMaster();
  // After a checkpoint load: the step counter and loss scaler state, then RefreshParamsFromMaster.
  // Collective. ckpt::Resume calls it through the state view.
  Status Restore(const StateCounters& saved);

  MemoryTracker::Snapshot memory() const;
  // Host memory taken by offload (state with offload = host; NVMe buffer sets), by category.
  MemoryTracker::Snapshot host_memory() const;
  // NVMe offload: the last Step's (or initialisation's) streaming figures; zeros otherwise.
  SwapStats swap_stats() const;
  // Communication bytes this rank moved so far (reductions and parameter gathers).
  CommStats comm_stats() const;

  struct Group;  // internal

 private:
  ZeroEngine(Communicator* comm, Device* device, const EngineConfig& config);
  Status CheckRegistration();
  Status Allocate(const InitFn& init);
  // This rank's block of the group's model parameters (stage 3: the parameter shard; null when the
  // optimizer store holds it) and of its reduced gradient (stages 0-1: inside the full gradient; 2-3:
  // the gradient shard).
  void* OwnParams(Group& g) const;
  void* GradShard(Group& g) const;
  Status GatherUpdatedParams();
  Status ReduceGroup(int g);
  Result<Group*> Get(int group, const char* what);

  Communicator* comm_;
  Device* device_;
  EngineConfig config_;
  LossScaler scaler_;
  bool finalized_ = false;
  bool sync_ = true;
  int64_t steps_ = 0;
  std::vector<TensorSpec> params_;
  std::unordered_set<std::string> param_names_;
  std::vector<std::string> param_groups_;
  std::vector<std::unique_ptr<Group>> groups_;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zrt
