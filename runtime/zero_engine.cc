// ZeroEngine, the public face of the engine (engine.h): every call goes to EngineCore (engine_core.h),
// so the installed header shows what a trainer calls and nothing of how.
#include "zrt/runtime/engine.h"

#include "zrt/runtime/engine_core.h"

namespace zrt {

ZeroEngine::ZeroEngine(std::unique_ptr<EngineCore> core) : core_(std::move(core)) {}
ZeroEngine::~ZeroEngine() = default;

Result<std::unique_ptr<ZeroEngine>> ZeroEngine::Create(Communicator* comm, Device* device, const EngineConfig& config) {
  ASSIGN_OR_RETURN(std::unique_ptr<EngineCore> core, EngineCore::Create(comm, device, config));
  return std::unique_ptr<ZeroEngine>(new ZeroEngine(std::move(core)));
}

Result<ParamHandle> ZeroEngine::AddParam(const std::string& name, const std::vector<int64_t>& shape, DType dtype, const ParamOptions& options) { return core_->AddParam(name, shape, dtype, options); }
Status ZeroEngine::Finalize(const InitFn& init) { return core_->Finalize(init); }
Result<ParamHandle> ZeroEngine::Find(std::string_view name) const { return core_->Find(name); }
const TensorSpec& ZeroEngine::spec(ParamHandle p) const { return core_->spec(p); }
int ZeroEngine::group(ParamHandle p) const { return core_->group(p); }
Result<TensorView> ZeroEngine::Param(ParamHandle p) { return core_->Param(p); }
Result<TensorView> ZeroEngine::Param(std::string_view name) { return core_->Param(name); }
Result<TensorView> ZeroEngine::Grad(ParamHandle p) { return core_->Grad(p); }
Result<TensorView> ZeroEngine::Grad(std::string_view name) { return core_->Grad(name); }
int ZeroEngine::num_groups() const { return core_->num_groups(); }
Result<int> ZeroEngine::GroupIndex(const std::string& name) const { return core_->GroupIndex(name); }
Result<void*> ZeroEngine::Gather(int group) { return core_->Gather(group); }
Status ZeroEngine::Release(int group) { return core_->Release(group); }
Result<void*> ZeroEngine::GradBuffer(int group) { return core_->GradBuffer(group); }
Status ZeroEngine::GradsReady(int group) { return core_->GradsReady(group); }
void ZeroEngine::SetSync(bool sync) { core_->SetSync(sync); }
void ZeroEngine::Mark(Phase phase) { core_->Mark(phase); }
void ZeroEngine::Record(const std::string& key, double value) { core_->Record(key, value); }
Result<StepResult> ZeroEngine::Step() { return core_->Step(); }
Status ZeroEngine::SetLr(double lr) { return core_->SetLr(lr); }
Status ZeroEngine::SetLrSchedule(const LrSchedule& schedule) { return core_->SetLrSchedule(schedule); }
const std::vector<SettingChange>& ZeroEngine::restored_settings() const { return core_->restored_settings(); }
Status ZeroEngine::UseTrainerSettings() { return core_->UseTrainerSettings(); }
double ZeroEngine::lr() const { return core_->lr(); }
double ZeroEngine::loss_scale() const { return core_->loss_scale(); }
int64_t ZeroEngine::steps() const { return core_->steps(); }
StateView ZeroEngine::state_view() { return core_->state_view(); }
Status ZeroEngine::RefreshParamsFromMaster() { return core_->RefreshParamsFromMaster(); }
Status ZeroEngine::Restore(const StateCounters& saved) { return core_->Restore(saved); }
Status ZeroEngine::ForEachFullTensor(const FullStateOptions& options, const FullStateFn& fn) { return core_->ForEachFullTensor(options, fn); }
Result<std::vector<float>> ZeroEngine::FullMaster(ParamHandle p, int root) { return core_->FullMaster(p, root); }
MemoryTracker::Snapshot ZeroEngine::memory() const { return core_->memory(); }
MemoryTracker::Snapshot ZeroEngine::host_memory() const { return core_->host_memory(); }
SwapStats ZeroEngine::swap_stats() const { return core_->swap_stats(); }
CommStats ZeroEngine::comm_stats() const { return core_->comm_stats(); }

}  // namespace zrt
