// ZeroEngine: ZeRO stages 0-3 over a Communicator and a Device (../shared/DESIGN.md "Data flow").
//
// Use (docs/engine.md has the whole story):
//   engine = ZeroEngine::Create(comm, device, config)
//   w = engine->AddParam("l0.w", {1024, 512}, DType::kBF16, {.group = "l0"})   // same order on every rank
//   b = engine->AddParam("l0.b", {1024}, DType::kBF16, {.group = "l0", .weight_decay = 0})
//   engine->Finalize(init)                   // init fills fp32 values of a tensor range
//   each step, per micro-batch:
//     engine->Gather(g)                      // group g's full parameters (stage 3: all-gathered)
//     engine->Param(w)->as<bf16>() ...       // forward reads tensors by handle
//     engine->Grad(w)->as<bf16>() ...        // backward adds into the gradient (zeroed at first use)
//     engine->Release(g); engine->GradsReady(g)  // queued for bucketed reduce-scatter (async)
//   result = engine->Step()                  // lr from the schedule, clipping, Adam, all-gather
//
// Groups are the unit of gathering and reduction (FSDP's wrapped module): each has one flat buffer
// (its tensors in registration order, ShardLayout-padded) and one dtype. Optimizer settings are per
// tensor (ParamOptions), independent of groups. Stage 0: all-reduce, full optimizer state on every
// rank. Stage 1: full params and grads, optimizer state sharded. Stage 2: gradients sharded too (a
// group's full gradient lives only from its first Grad/GradBuffer to GradsReady). Stage 3: parameters
// sharded too.
//
// Gradient accumulation: SetSync(false) for the first micro-steps (no communication; full gradients
// persist, also at stages 2-3), SetSync(true) before the last; gradients are divided by
// `grad_accum_steps` at the step. With `fp32_grads` a 16-bit model's gradients are f32 from the buffer
// the trainer adds into to the shard Adam reads. The trainer scales its loss by loss_scale() (fp16).
//
// Thread-safety: one thread at a time. Views and pointers from Param/Gather are valid until Release
// (stage 3) or, at stages 0-2, for the engine's life (the values change at Step); from Grad/GradBuffer
// until GradsReady (stages 2-3) or the next Step.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "zrt/core/communicator.h"
#include "zrt/core/device.h"
#include "zrt/core/state_view.h"
#include "zrt/core/tensor_spec.h"
#include "zrt/runtime/engine_config.h"
#include "zrt/runtime/full_state.h"
#include "zrt/runtime/stats.h"

namespace zrt {

class EngineCore;  // engine_core.h

struct StepResult {
  bool skipped = false;     // non-finite gradients on some rank: nothing was updated
  double grad_norm = 0;     // global pre-clip norm of the (unscaled, averaged) gradients
  double loss_scale = 1;    // the scale used for this step's gradients
  double lr = 0;            // this step's scheduled lr (a tensor's is lr * its lr_scale)
  int64_t step = 0;         // optimizer steps taken so far (skipped ones excluded)
  StepTimes times;          // where the wall time since the previous Step went
  double tokens_per_second = 0;  // the job's (metrics.tokens_per_step * world size / times.total)
  double mfu = 0;                // metrics.flops_per_step / (times.total * metrics.peak_flops)
};

// A setting a resume took from the checkpoint in place of the trainer's (ZeroEngine::restored_settings).
struct SettingChange {
  std::string name;        // "lr", "lr_schedule.total_steps", "weight_decay", "tensor 'h.0.w' lr_scale", ...
  std::string trainer;     // the value the trainer had set (config, registration or SetLr/SetLrSchedule)
  std::string checkpoint;  // the value the checkpoint brought, in force after the resume
};

// A registered parameter; index = registration order (InitFn's `param`).
struct ParamHandle {
  int64_t index = -1;
  friend bool operator==(ParamHandle, ParamHandle) = default;
};

// How one tensor is registered. Against torch parameter groups: a torch group's "lr" is
// config.adam.lr * lr_scale and its "weight_decay" is weight_decay, per tensor, with no effect on how
// tensors are gathered or reduced (that is `group`).
struct ParamOptions {
  std::string group = "default";       // gather/reduction unit; tensors of one group share a dtype
  double lr_scale = 1;                 // this tensor's lr = scheduled lr * lr_scale (>= 0)
  std::optional<double> weight_decay;  // unset: config.adam.weight_decay; 0 for biases, norms, embeddings
  // No gradient, no optimizer state, no reduction, not in the norm; its values are saved and loaded
  // with checkpoints (as "master"). A group is frozen or not: frozen tensors go in groups of their
  // own (as FSDP's flat parameters require).
  bool frozen = false;
  // The optimizer state's precision (unset: config.state). Tensors of one group share it: put, say,
  // the embeddings in a group of their own to keep their moments in f32 while the rest is q8.
  std::optional<StatePrecision> state;
  // The data-parallel group the tensor is sharded and reduced over, when it is not the engine's
  // (docs/engine.md "Tensors with their own data-parallel group"): a mixture-of-experts model's
  // experts, each held by the ranks of one expert-data-parallel group (the trainer splits it from the
  // engine's communicator: the ranks at the same place in each expert-parallel group). The tensor
  // exists on those ranks only: ranks of one such group register the same tensors, other ranks other
  // ones (or none). Its gradient is summed over the group and divided by the engine's world size (the
  // gradient of the mean of every rank's loss, as the dense tensors'); the global norm counts it once.
  // Null or the engine's communicator: the engine's. Tensors of one group share it, and a rank has at
  // most one besides the engine's; it must outlive the engine. Stages 0-3, not with hybrid sharding or
  // the quantized collectives; checkpoints refuse such state for now.
  Communicator* data_parallel = nullptr;
};

class ZeroEngine {
 public:
  // comm and device must outlive the engine.
  static Result<std::unique_ptr<ZeroEngine>> Create(Communicator* comm, Device* device, const EngineConfig& config);
  ~ZeroEngine();

  // Registers a parameter (before Finalize); the handle names it from then on. Names are unique.
  Result<ParamHandle> AddParam(const std::string& name, const std::vector<int64_t>& shape, DType dtype,
                               const ParamOptions& options = {});

  // Initial values: init(param, offset, count, out) writes fp32 values of elements [offset,
  // offset+count) of parameter `param` (ParamHandle::index). Each rank is asked only for its shard.
  using InitFn = std::function<void(int64_t param, int64_t offset, int64_t count, float* out)>;
  // Checks that every rank registered the same parameters (the error names the first that differs),
  // builds the layouts and allocates the buffers.
  Status Finalize(const InitFn& init);

  // ---- tensors by name or handle ----
  Result<ParamHandle> Find(std::string_view name) const;
  const TensorSpec& spec(ParamHandle p) const;  // precondition: p came from AddParam
  int group(ParamHandle p) const;               // its group's index (after Finalize)
  // The tensor's full parameters: at stage 3 its group must be gathered (an error names both).
  Result<TensorView> Param(ParamHandle p);
  Result<TensorView> Param(std::string_view name);
  // The tensor's full gradient buffer (the trainer adds into it; zeroed at the group's first use each
  // step; f32 elements with fp32_grads). Stages 2-3: not after its group's GradsReady.
  Result<TensorView> Grad(ParamHandle p);
  Result<TensorView> Grad(std::string_view name);

  // ---- groups: the gather/reduce unit ----
  int num_groups() const;
  Result<int> GroupIndex(const std::string& name) const;
  // The group's whole flat buffers (tensors at their layout offsets): for trainers that work on a
  // group at once. Param/Grad are the same memory.
  Result<void*> Gather(int group);
  Status Release(int group);
  Result<void*> GradBuffer(int group);
  Status GradsReady(int group);
  void SetSync(bool sync);

  // Step metrics: the trainer marks where its forward and backward begin (the time up to the next
  // mark or Step, less the engine's, is that phase's), and may record values (the loss) for the
  // step's JSON line.
  void Mark(Phase phase);
  void Record(const std::string& key, double value);

  Result<StepResult> Step();

  // The peak lr the schedule multiplies (config.adam.lr until set), and the schedule. Both are saved
  // with checkpoints and come back with Restore; set them after a resume to override the saved ones.
  Status SetLr(double lr);
  Status SetLrSchedule(const LrSchedule& schedule);
  // What the last Restore (a resume) took from the checkpoint in place of the trainer's settings: the
  // peak lr, the schedule's fields, the default weight decay and each tensor's lr_scale and
  // weight_decay that differ, with both values (rank 0 also logs them once, at warning level). The
  // checkpoint's win by default, as torch's load_state_dict; UseTrainerSettings() puts the trainer's
  // back in one call (a new lr or schedule for the rest of the run). Empty when nothing differed.
  const std::vector<SettingChange>& restored_settings() const;
  Status UseTrainerSettings();
  double lr() const;  // the lr the next step uses (before lr_scale)
  double loss_scale() const;
  int64_t steps() const;

  // This rank's optimizer state, for checkpoints (its `restore` is Restore).
  StateView state_view();
  // After restoring master/moments through state_view() buffers: re-derive the model parameters.
  // Collective.
  Status RefreshParamsFromMaster();
  // After a checkpoint load: the step counter, loss scaler, lr, schedule and per-tensor settings
  // (the checkpoint's win; every difference is kept in restored_settings() and logged), then
  // RefreshParamsFromMaster. Collective. ckpt::Resume calls it through the state view.
  Status Restore(const StateCounters& saved);

  // The full (unsharded) fp32 state in process, tensor by tensor (runtime/full_state.h). Collective.
  Status ForEachFullTensor(const FullStateOptions& options, const FullStateFn& fn);
  // One tensor's full master weights (a frozen tensor's values) on every rank (root = -1) or on
  // `root` (an empty vector elsewhere). Collective.
  Result<std::vector<float>> FullMaster(ParamHandle p, int root = -1);

  MemoryTracker::Snapshot memory() const;
  // Host memory taken by offload (state with offload = host; NVMe buffer sets), by category.
  MemoryTracker::Snapshot host_memory() const;
  // NVMe offload: the last Step's (or initialisation's) streaming figures; zeros otherwise.
  SwapStats swap_stats() const;
  // Communication bytes this rank moved so far (reductions and parameter gathers).
  CommStats comm_stats() const;

 private:
  explicit ZeroEngine(std::unique_ptr<EngineCore> core);
  std::unique_ptr<EngineCore> core_;
};

}  // namespace zrt
