// EngineCore: the ZeRO engine itself (engine.h's ZeroEngine is its public face: every method forwards
// here; zero_engine.cc). Its members, groups and components are engine_internal.h's. Not installed.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "zrt/runtime/engine.h"
#include "zrt/kernels/adam.h"
#include "zrt/runtime/loss_scaler.h"
#include "zrt/runtime/optimizer_store.h"

namespace zrt {

class EngineCore {
 public:
  // comm and device must outlive the engine.
  static Result<std::unique_ptr<EngineCore>> Create(Communicator* comm, Device* device, const EngineConfig& config);
  ~EngineCore();

  // Registers a parameter (before Finalize); the handle names it from then on. Names are unique.
  Result<ParamHandle> AddParam(const std::string& name, const std::vector<int64_t>& shape, DType dtype,
                               const ParamOptions& options = {});

  // Initial values: init(param, offset, count, out) writes fp32 values of elements [offset,
  // offset+count) of parameter `param` (ParamHandle::index). Each rank is asked only for its shard.
  using InitFn = ZeroEngine::InitFn;
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
  void SetSync(bool sync) { sync_ = sync; }

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
  const std::vector<SettingChange>& restored_settings() const { return restored_settings_; }
  Status UseTrainerSettings();
  double lr() const;  // the lr the next step uses (before lr_scale)
  double loss_scale() const { return scaler_.scale(); }
  int64_t steps() const { return steps_; }

  // This rank's optimizer state, for checkpoints (its `restore` is Restore).
  StateView state_view();
  // After restoring master/moments through state_view() buffers: re-derive the model parameters.
  // Collective.
  Status RefreshParamsFromMaster();
  // After a checkpoint load: the step counter, loss scaler, lr, schedule and per-tensor settings
  // (the checkpoint's win; a difference from the registration is logged), then
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

  struct Group;  // internal

 private:
  EngineCore(Communicator* comm, Device* device, const EngineConfig& config);
  Status CheckRegistration();
  Status Allocate(const InitFn& init);
  // This rank's block of the group's model parameters (stage 3: the parameter shard; null when the
  // optimizer store holds it) and of its reduced gradient (stages 0-1: inside the full gradient; 2-3:
  // the gradient shard).
  void* OwnParams(Group& g) const;
  void* GradShard(Group& g) const;
  // Splits each group's shard into runs of tensors with equal optimizer settings.
  void BuildSettingRuns();
  std::string EngineState() const;
  Status ApplyEngineState(const std::string& json);
  Result<TensorView> View(ParamHandle p, bool grad);
  Status GatherUpdatedParams(bool include_frozen);
  Status Settle();  // every capture of the state finished (its wait charged as a checkpoint stall)
  friend class EngineStateOwner;
  Status ReduceGroup(int g);
  Result<StepResult> StepImpl();
  // StepImpl's steps.
  using Scalars = std::vector<std::vector<kernels::AdamStepScalars>>;  // per group, per settings class
  Status ReduceAll();
  Result<float> GlobalSumSquares();
  Result<Scalars> StepScalars(double lr, float grad_multiplier);
  Status AdamWindow(const OptimizerStore::Window& w, const Scalars& scalars, std::vector<kernels::AdamTensorArgs>* args);
  Status Update(const Scalars& scalars);
  Status Report(StepResult& r);
  Result<Group*> Get(int group, const char* what);

  Communicator* comm_;
  Device* device_;
  EngineConfig config_;
  LossScaler scaler_;
  bool finalized_ = false;
  bool sync_ = true;
  int64_t steps_ = 0;
  double lr_ = 0;
  LrSchedule schedule_;
  struct Settings {
    double lr_scale = 1, weight_decay = 0;
    friend bool operator==(const Settings&, const Settings&) = default;
  };
  std::vector<TensorSpec> params_;
  std::vector<Settings> settings_;
  std::unordered_map<std::string, int64_t> param_index_;
  std::vector<std::string> param_groups_;
  std::vector<int> param_group_index_;
  std::vector<int64_t> param_pos_;  // within its group
  std::vector<char> param_frozen_;
  std::vector<std::unique_ptr<Group>> groups_;
  // The trainer's settings a restore replaced, for UseTrainerSettings, and what differed.
  struct TrainerSettings {
    double lr = 0, weight_decay = 0;
    LrSchedule schedule;
    std::vector<Settings> settings;
  };
  std::optional<TrainerSettings> trainer_settings_;
  std::vector<SettingChange> restored_settings_;
  void ReportRestoredSettings(double lr, const LrSchedule& schedule, double wd, const std::vector<Settings>& settings);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zrt
