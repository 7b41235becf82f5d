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
  // ZeroEngine's functions, one for one: their contracts are written in engine.h.
  static Result<std::unique_ptr<EngineCore>> Create(Communicator* comm, Device* device, const EngineConfig& config);
  ~EngineCore();

  Result<ParamHandle> AddParam(const std::string& name, const std::vector<int64_t>& shape, DType dtype,
                               const ParamOptions& options = {});

  using InitFn = ZeroEngine::InitFn;
  Status Finalize(const InitFn& init);

  // ---- tensors by name or handle ----
  Result<ParamHandle> Find(std::string_view name) const;
  const TensorSpec& spec(ParamHandle p) const;
  int group(ParamHandle p) const;
  Result<TensorView> Param(ParamHandle p);
  Result<TensorView> Param(std::string_view name);
  Result<TensorView> Grad(ParamHandle p);
  Result<TensorView> Grad(std::string_view name);

  // ---- groups: the gather/reduce unit ----
  int num_groups() const;
  Result<int> GroupIndex(const std::string& name) const;
  Result<void*> Gather(int group);
  Status Release(int group);
  Result<void*> GradBuffer(int group);
  Status GradsReady(int group);
  void SetSync(bool sync) { sync_ = sync; }

  void Mark(Phase phase);
  void Record(const std::string& key, double value);

  Result<StepResult> Step();

  Status SetLr(double lr);
  Status SetLrSchedule(const LrSchedule& schedule);
  const std::vector<SettingChange>& restored_settings() const { return restored_settings_; }
  Status UseTrainerSettings();
  double lr() const;
  double loss_scale() const { return scaler_.scale(); }
  int64_t steps() const { return steps_; }

  StateView state_view();
  Status RefreshParamsFromMaster();
  Status Restore(const StateCounters& saved);

  Status ForEachFullTensor(const FullStateOptions& options, const FullStateFn& fn);
  Result<std::vector<float>> FullMaster(ParamHandle p, int root = -1);

  MemoryTracker::Snapshot memory() const;
  MemoryTracker::Snapshot host_memory() const;
  SwapStats swap_stats() const;
  CommStats comm_stats() const;

  struct Group;  // internal

 private:
  EngineCore(Communicator* comm, Device* device, const EngineConfig& config);
  Status CheckRegistration();
  Status Allocate(const InitFn& init);
  Status CheckGroupState(const Group& g) const;
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
  Status AdamCompactWindow(const OptimizerStore::Window& w, const std::vector<kernels::AdamStepScalars>& scalars);
  Status Update(const Scalars& scalars);
  Status Report(StepResult& r);
  Result<Group*> Get(int group, const char* what);

  // Hybrid sharding (EngineConfig::shard_group_size): the shard group this rank's layouts are over
  // (comm_ itself unless hybrid) and the replica group of the ranks that hold the same shards (null
  // unless hybrid). Agreement, the norm and the registration check stay on comm_, the whole world.
  Status SplitMesh();
  Status SplitSecondary();
  Status SplitNodes();
  Result<int> NodeRanks(const char* setting);
  Status OnOneHost(Communicator* group, const char* setting);
  // A group's ranks: its own data-parallel group (ParamOptions::data_parallel), or the shard group.
  Communicator* Dp(const Group& g) const;
  int LayoutRank(const Group& g) const { return config_.stage == 0 ? 0 : Dp(g)->rank(); }  // stage 0's layout has one "rank"
  int LayoutSize(const Group& g) const { return config_.stage == 0 ? 1 : Dp(g)->size(); }
  Status CheckOwnGroups();  // the tensors with a data-parallel group of their own, against the engine's settings
  int Replicas() const { return replicas_ ? replicas_->size() : 1; }

  Communicator* comm_;
  Communicator* shards_ = nullptr;
  std::unique_ptr<Communicator> own_shards_, replicas_;
  std::unique_ptr<Communicator> secondary_;  // hpZ's group (EngineConfig::secondary_shard_group), or null
  // Two-level qgZ: the shard group's ranks on this node, and those at the same place on every node.
  std::unique_ptr<Communicator> node_, across_;
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
  std::vector<StatePrecision> param_state_;
  std::vector<Communicator*> param_dp_;  // ParamOptions::data_parallel (null: the engine's)
  Communicator* own_dp_ = nullptr;       // the one data-parallel group of this rank's tensors besides the engine's, or null
  std::vector<int> own_ranks_;           // own_dp_'s members' ranks in comm_, in own_dp_'s order (finalize)
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
