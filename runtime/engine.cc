// EngineCore (ZeroEngine's implementation, engine_core.h): orchestrates the components (layouts and
// buffers per group, GradBucketer, ParamGatherer, LossScaler, OptimizerStore) for one training step; see
// engine.h for the API, engine_settings.cc for the optimizer settings (per-tensor runs, lr, schedule) and their checkpointed state,
// engine_registration.cc for the registration checks and engine_mesh.cc for the mesh.
//
// Buffers per group (E = bytes per element of the group's dtype, P = padded size, S = P / N); the
// optimizer state (fp32 master, m, v: S each; P at stage 0, whose layout has one "rank") is the
// OptimizerStore's, wherever it lives:
//   stage | params                          | gradients
//   0     | full P*E                        | full P*E (all-reduced in place)
//   1     | full P*E                        | full P*E, shard = own block
//   2     | full P*E                        | shard S*E (+ full P*E pooled from GradBuffer to GradsReady)
//   3     | shard S*E (the store's when     | as stage 2
//         |   offloaded) + full P*E pooled  |
//         |   while gathered                |
// Step: flush buckets -> local sum of squares of the grad shards (inf if any element is inf/NaN) ->
// one all-reduce -> skip, or multiplier = clip / (loss_scale * accum) -> store.Update: Adam over each
// shard, the updated params cast straight into this rank's block of the model params -> stages 1-2
// all-gather.
#include "zrt/runtime/engine_core.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <optional>

#include "zrt/core/base.h"
#include "zrt/core/logging.h"
#include "zrt/core/thread_pool.h"
#include "zrt/kernels/adam.h"
#include "zrt/kernels/grad_norm.h"
#include "zrt/kernels/weight_quant.h"
#include "zrt/runtime/engine_internal.h"

namespace zrt {

using internal::CheckRate;

std::string StatePrecisionName(const StatePrecision& p) {
  return "exp_avg=" + std::string(PrecisionName(p.exp_avg)) + " exp_avg_sq=" + std::string(PrecisionName(p.exp_avg_sq)) +
         " master=" + (p.master ? "yes" : "no") + " block=" + std::to_string(p.q8_block);
}

Result<OffloadTarget> ParseOffloadTarget(std::string_view s) {
  if (s == "none") return OffloadTarget::kNone;
  if (s == "host" || s == "cpu") return OffloadTarget::kHost;
  if (s == "nvme") return OffloadTarget::kNvme;
  return InvalidArgumentError("offload target must be none, host or nvme, got '", s, "'");
}

std::string_view OffloadTargetName(OffloadTarget t) {
  switch (t) {
    case OffloadTarget::kNone: return "none";
    case OffloadTarget::kHost: return "host";
    case OffloadTarget::kNvme: return "nvme";
  }
  return "?";
}

EngineCore::EngineCore(Communicator* comm, Device* device, const EngineConfig& config)
    : comm_(comm), device_(device), config_(config), lr_(config.adam.lr), schedule_(config.lr_schedule) {}
EngineCore::~EngineCore() {
  if (impl_) impl_->store.reset();  // its capture thread reads the groups' parameters: it goes first
  groups_.clear();  // their buffers may come from impl_'s host memory, which goes with impl_
}

// Waits for every capture of the state (NVMe state still owed is streamed now); the wait is a
// checkpoint stall.
Status EngineCore::Settle() {
  Status s = impl_->store->Settle();
  impl_->clock.Charge(&StepTimes::checkpoint_stall, impl_->store->TakeCaptureWait());
  return s;
}

// The engine as its views' owner (core/state_view.h): the state is the store's, the counters and what derives from it (Restore) the engine's.
class EngineStateOwner final : public StateOwner {
 public:
  explicit EngineStateOwner(EngineCore* e) : e_(e) {}
  Status Capture(std::shared_ptr<StateSink> sink) override { return e_->impl_->store->Capture(std::move(sink)); }
  Status Settle() override { return e_->Settle(); }
  Status Read(int group, int buffer, int64_t offset, int64_t n, float* out) override { return e_->impl_->store->Read(group, buffer, offset, n, out); }
  Status Write(int group, int buffer, int64_t offset, int64_t n, const float* in) override {
    RETURN_IF_ERROR(e_->Settle());
    return e_->impl_->store->Write(group, buffer, offset, n, in);
  }
  Status WriteStored(int group, int buffer, int64_t offset, int64_t n, const void* values, const float* scales) override {
    RETURN_IF_ERROR(e_->Settle());
    return e_->impl_->store->WriteStored(group, buffer, offset, n, values, scales);
  }
  Result<std::optional<StoredPart>> StoredMemory(int group, int buffer) override {
    RETURN_IF_ERROR(e_->Settle());
    return e_->impl_->store->StoredMemory(group, buffer);
  }
  Status Restore(const StateCounters& saved) override { return e_->Restore(saved); }
  void Stalled(double seconds) override { e_->impl_->clock.Charge(&StepTimes::checkpoint_stall, seconds); }

 private:
  EngineCore* e_;
};

Result<std::unique_ptr<EngineCore>> EngineCore::Create(Communicator* comm, Device* device, const EngineConfig& c) {
  if (comm == nullptr || device == nullptr) return InvalidArgumentError("engine: null communicator or device");
  if (c.stage < 0 || c.stage > 3) return InvalidArgumentError("engine: stage must be 0, 1, 2 or 3, got ", c.stage);
  if (c.alignment < 1) return InvalidArgumentError("engine: alignment must be >= 1 element, got ", c.alignment);
  if (c.grad_accum_steps < 1) return InvalidArgumentError("engine: grad_accum_steps must be >= 1, got ", c.grad_accum_steps);
  if (c.max_grad_norm < 0 || !std::isfinite(c.max_grad_norm)) {
    return InvalidArgumentError("engine: max_grad_norm must be finite and >= 0 (0 = off), got ", c.max_grad_norm);
  }
  if (c.prefetch_depth < 0) return InvalidArgumentError("engine: prefetch_depth must be >= 0");
  RETURN_IF_ERROR(internal::CheckQuantizedCollectives(c, *device));
  if (c.shard_group_size < EngineConfig::kShardGroupNode || (c.shard_group_size > 0 && comm->size() % c.shard_group_size != 0)) {
    return InvalidArgumentError("engine: shard_group_size ", c.shard_group_size, " must divide the world size ", comm->size(),
                                " (0: the whole world, -1: a node)");
  }
  if (c.stage == 0 && c.shard_group_size > 0 && c.shard_group_size != comm->size()) {
    return InvalidArgumentError("engine: stage 0 shards nothing (shard_group_size ", c.shard_group_size,
                                "); use stage 1-3 for hybrid sharding");
  }
  if (device->kind() == DeviceKind::kCuda && comm->backend() == "mpi") {
    return InvalidArgumentError("engine: device ", device->name(), " needs a communicator on device memory (NcclCommunicator); ",
                                "the MPI communicator works on host buffers only");
  }
  RETURN_IF_ERROR(kernels::MakeAdamStepScalars(c.adam, 1).status(), "engine");
  RETURN_IF_ERROR(c.lr_schedule.Validate(), "engine");
  const OffloadConfig& oc = c.offload;
  if (oc.params != OffloadTarget::kNone && c.stage != 3) {
    return InvalidArgumentError("engine: offload.params = ", OffloadTargetName(oc.params), " needs stage 3 (stage ", c.stage,
                                " keeps full parameters on every rank)");
  }
  if (oc.params == OffloadTarget::kNvme && oc.optimizer != OffloadTarget::kNvme) {
    return InvalidArgumentError("engine: offload.params = nvme needs offload.optimizer = nvme (the step writes the "
                                "parameter shards sub-group by sub-group)");
  }
  if (oc.optimizer == OffloadTarget::kNvme && oc.nvme_dir.empty()) {
    return InvalidArgumentError("engine: offload.optimizer = nvme needs offload.nvme_dir");
  }
  if (oc.host_budget_bytes < 0) return InvalidArgumentError("engine: offload.host_budget_bytes must be >= 0 (0 = unbounded)");
  if (oc.sub_group_elements < 0) return InvalidArgumentError("engine: offload.sub_group_elements must be >= 0 (0 = derived)");
  const MetricsConfig& mc = c.metrics;
  for (double v : {mc.tokens_per_step, mc.flops_per_step, mc.peak_flops}) {
    if (!(v >= 0) || !std::isfinite(v)) return InvalidArgumentError("engine: metrics figures must be finite and >= 0");
  }
  std::unique_ptr<EngineCore> e(new EngineCore(comm, device, c));
  RETURN_IF_ERROR(e->SplitMesh(), "engine");
  ASSIGN_OR_RETURN(e->scaler_, LossScaler::Create(c.loss_scale), "engine");
  const int threads = c.optimizer_threads > 0 ? c.optimizer_threads : ThreadPool::CoresPerRank();
  e->impl_ = std::make_unique<Impl>(device, threads);
  e->impl_->owner = std::make_unique<EngineStateOwner>(e.get());
  if (!mc.jsonl_path.empty()) {
    ASSIGN_OR_RETURN(e->impl_->sink, internal::JsonlSink::Open(mc.jsonl_path, comm->rank()), "engine");
  }
  e->impl_->host = HostMemory::Create(oc.host_budget_bytes, "offload.host_budget_bytes");
  e->impl_->host_staging = std::make_unique<BufferPool>(e->impl_->host.get(), MemCategory::kStaging);
  ASSIGN_OR_RETURN(e->impl_->compute, Compute::For(device, e->impl_->kernel_options()), "engine");
  ASSIGN_OR_RETURN(e->impl_->host_compute, Compute::For(e->impl_->host.get(), e->impl_->kernel_options()), "engine");
  OptimizerStore::Options so;
  so.offload = oc;
  so.amsgrad = c.adam.amsgrad;
  so.rank = comm->rank();
  so.world_size = comm->size();
  ASSIGN_OR_RETURN(e->impl_->store, OptimizerStore::Create(comm, device, e->impl_->compute.get(), e->impl_->host.get(),
                                                          e->impl_->host_compute.get(), so), "engine");
  return e;
}

Result<ParamHandle> EngineCore::AddParam(const std::string& name, const std::vector<int64_t>& shape, DType dtype,
                                         const ParamOptions& o) {
  if (finalized_) return FailedPreconditionError("add_param '", name, "': the engine is already finalized");
  TensorSpec spec{name, shape, dtype};
  RETURN_IF_ERROR(Validate(spec), "add_param");
  if (!IsFloating(dtype)) return InvalidArgumentError("add_param '", name, "': dtype must be f32, bf16 or f16");
  if (o.group.empty()) return InvalidArgumentError("add_param '", name, "': empty group name");
  const Settings st{o.lr_scale, o.weight_decay.value_or(config_.adam.weight_decay)};
  RETURN_IF_ERROR(CheckRate("add_param: lr_scale", name, st.lr_scale));
  RETURN_IF_ERROR(CheckRate("add_param: weight_decay", name, st.weight_decay));
  Communicator* dp = o.data_parallel == comm_ ? nullptr : o.data_parallel;
  if (dp != nullptr) {
    if (own_dp_ != nullptr && dp != own_dp_) {
      return InvalidArgumentError("add_param '", name, "': a second data-parallel group besides the engine's (one per rank: the ",
                                  "expert-data-parallel group; earlier tensors have another)");
    }
    if (dp->size() < 1 || dp->size() > comm_->size() || comm_->size() % dp->size() != 0 || dp->rank() < 0 || dp->rank() >= dp->size()) {
      return InvalidArgumentError("add_param '", name, "': its data-parallel group of ", dp->size(), " ranks must divide the engine's ",
                                  comm_->size(), " (a group split from the engine's communicator)");
    }
  }
  // Checkpoints match tensors by name: a repeated one would save and verify but never load.
  const auto index = static_cast<int64_t>(params_.size());
  if (!param_index_.emplace(name, index).second) {
    return InvalidArgumentError("add_param '", name, "': a parameter of that name is already registered");
  }
  params_.push_back(std::move(spec));
  settings_.push_back(st);
  param_frozen_.push_back(o.frozen ? 1 : 0);
  param_groups_.push_back(o.group);
  param_state_.push_back(o.state.value_or(config_.state));
  param_dp_.push_back(dp);
  if (dp != nullptr) own_dp_ = dp;
  return ParamHandle{index};
}

Status EngineCore::Finalize(const InitFn& init) {
  if (finalized_) return FailedPreconditionError("finalize: already finalized");
  if (!init) return InvalidArgumentError("finalize: no init function");
  RETURN_IF_ERROR(CheckRegistration());
  std::map<std::string, int> index;
  for (size_t i = 0; i < params_.size(); ++i) {
    auto [it, fresh] = index.try_emplace(param_groups_[i], static_cast<int>(groups_.size()));
    if (fresh) {
      groups_.push_back(std::make_unique<Group>());
      groups_.back()->name = param_groups_[i];
      groups_.back()->dtype = params_[i].dtype;
      groups_.back()->grad_dtype = config_.fp32_grads ? DType::kF32 : params_[i].dtype;
      groups_.back()->frozen = param_frozen_[i] != 0;
      groups_.back()->state = param_state_[i];
      groups_.back()->dp = param_dp_[i];
    }
    Group& g = *groups_[static_cast<size_t>(it->second)];
    if (g.dtype != params_[i].dtype) {
      return InvalidArgumentError("finalize: parameter '", params_[i].name, "' is ", DTypeName(params_[i].dtype),
                                  " but group '", g.name, "' is ", DTypeName(g.dtype), " (one dtype per group)");
    }
    if (g.frozen != (param_frozen_[i] != 0)) {
      return InvalidArgumentError("finalize: group '", g.name, "' mixes frozen and trainable tensors ('", params_[i].name, "' is ",
                                  g.frozen ? "trainable" : "frozen", ", '", g.tensors[0].name, "' is not): frozen tensors go in groups of their own");
    }
    if (!g.frozen && g.state != param_state_[i]) {
      return InvalidArgumentError("finalize: parameter '", params_[i].name, "' has state ", StatePrecisionName(param_state_[i]), " but group '",
                                  g.name, "' has ", StatePrecisionName(g.state), " (one state precision per group: give it a group of its own)");
    }
    if (g.dp != param_dp_[i]) {
      return InvalidArgumentError("finalize: parameter '", params_[i].name, "' and '", g.tensors[0].name, "' of group '", g.name,
                                  "' have different data-parallel groups (one per group: give it a group of its own)");
    }
    param_group_index_.push_back(it->second);
    param_pos_.push_back(static_cast<int64_t>(g.params.size()));
    g.params.push_back(static_cast<int64_t>(i));
    g.tensors.push_back(params_[i]);
  }
  for (const auto& g : groups_) RETURN_IF_ERROR(CheckGroupState(*g));
  RETURN_IF_ERROR(CheckOwnGroups());
  RETURN_IF_ERROR(Allocate(init));
  BuildSettingRuns();
  impl_->clock.Begin();
  finalized_ = true;
  return Status();
}

// A group's state precision against its dtype and the engine's settings.
Status EngineCore::CheckGroupState(const Group& g) const {
  const StatePrecision& st = g.state;
  if (g.frozen || !st.compact()) return Status();
  const std::string what = "finalize: group '" + g.name + "' (state " + StatePrecisionName(st) + ")";
  RETURN_IF_ERROR(kernels::CheckCompactFormat({st.exp_avg, st.exp_avg_sq, st.master, st.q8_block, 0}), what);
  if (!st.master && g.dtype != DType::kBF16) {
    return InvalidArgumentError(what, ": no master needs bf16 parameters (", DTypeName(g.dtype), " has ",
                                g.dtype == DType::kF32 ? "its parameters as its master" : "too few exponent bits for stochastic rounding", ")");
  }
  if (config_.adam.amsgrad) return InvalidArgumentError(what, ": amsgrad needs f32 moments and a master");
  return Status();
}

namespace {
// The layout's alignment: q8 and q4 blocks start at a multiple of the block in the group's flat buffer.
int64_t GroupAlignment(int64_t alignment, const StatePrecision& st) {
  return IsBlockwise(st.exp_avg) || IsBlockwise(st.exp_avg_sq) ? std::lcm(alignment, st.q8_block) : alignment;
}
}  // namespace

Status EngineCore::Allocate(const InitFn& init) {
  OptimizerStore& store = *impl_->store;
  std::vector<OptimizerStore::Group> store_groups;
  int64_t reduced = 0, own_reduced = 0;  // per rank, everything a step reduces: the trained groups' shards (over the engine's group, over the own)
  for (auto& gp : groups_) {
    Group& g = *gp;
    const int n = LayoutSize(g), rank = LayoutRank(g);
    ASSIGN_OR_RETURN(g.layout, ShardLayout::Create(g.tensors, n, g.frozen ? config_.alignment : GroupAlignment(config_.alignment, g.state)),
                     "group '", g.name, "'");
    const auto P = static_cast<size_t>(g.layout.padded_size()), S = static_cast<size_t>(g.layout.shard_size());
    const std::string ctx = "allocating group '" + g.name + "'";
    if (config_.stage <= 2) {
      ASSIGN_OR_RETURN(g.full_param, device_->Allocate(P * g.esize(), MemCategory::kParameters), ctx);
      RETURN_IF_ERROR(device_->Fill(g.full_param.data(), 0, P * g.esize()));
    } else if (!store.holds_params()) {  // else the store's (a frozen group's in host memory, uploaded the same way)
      ASSIGN_OR_RETURN(g.param_shard, device_->Allocate(S * g.esize(), MemCategory::kParameters), ctx);
    }
    if (!g.frozen && config_.stage <= 1) {
      ASSIGN_OR_RETURN(g.full_grad, device_->Allocate(P * g.gsize(), MemCategory::kGradients), ctx);
    } else if (!g.frozen) {
      ASSIGN_OR_RETURN(g.grad_shard, device_->Allocate(S * g.gsize(), MemCategory::kGradients), ctx);
    }
    OptimizerStore::Group sg;
    sg.name = g.name;
    sg.dtype = g.dtype;
    sg.grad_dtype = g.grad_dtype;
    sg.elements = g.layout.shard_size();
    sg.frozen = g.frozen;
    if (!g.frozen) sg.format = {g.state.exp_avg, g.state.exp_avg_sq, g.state.master, g.state.q8_block, 0};
    sg.index = static_cast<int64_t>(rank) * g.layout.shard_size();
    sg.grads = g.frozen ? nullptr : GradShard(g);
    sg.params = OwnParams(g);
    // Initial values of shard elements [lo, lo + count): this rank's pieces only (padding stays zero).
    sg.init = [&g, &init, rank](int64_t lo, int64_t count, float* out) {
      for (const ShardPiece& p : g.layout.RankPieces(rank)) {
        const int64_t a = std::max(lo, p.shard_offset), b = std::min(lo + count, p.shard_offset + p.count);
        if (a < b) init(g.params[static_cast<size_t>(p.tensor)], p.tensor_offset + (a - p.shard_offset), b - a, out + (a - lo));
      }
    };
    store_groups.push_back(std::move(sg));
    if (!g.frozen) (g.dp != nullptr ? own_reduced : reduced) += g.layout.shard_size();
  }
  GradBucketer::Options bo;
  bo.bucket_bytes = config_.bucket_bytes;
  bo.reduce_dtype = config_.reduce_dtype;
  bo.all_reduce = config_.stage == 0;
  bo.total = reduced;  // buckets no larger than the model needs (none on one rank)
  bo.replicas = replicas_.get();
  bo.quantized_block = config_.quantized_gradients ? kernels::QuantBlockFor(config_.quantization_block, config_.quantized_gradient_bits) : 0;
  bo.quantized_bits = config_.quantized_gradient_bits;
  bo.node = node_.get(), bo.across = across_.get();  // qgZ's two levels, where the shard group spans nodes
  ASSIGN_OR_RETURN(impl_->bucketer, GradBucketer::Create(shards_, device_, impl_->compute.get(), bo), "finalize");
  if (own_dp_ != nullptr) {
    GradBucketer::Options own;
    own.bucket_bytes = config_.bucket_bytes;
    own.reduce_dtype = config_.reduce_dtype;
    own.all_reduce = config_.stage == 0;
    own.total = own_reduced;
    ASSIGN_OR_RETURN(impl_->own_bucketer, GradBucketer::Create(own_dp_, device_, impl_->compute.get(), own), "finalize (the own data-parallel group)");
  }
  RETURN_IF_ERROR(store.Init(std::move(store_groups)), "finalize");
  if (config_.stage == 3) {
    std::vector<ParamGatherer::GroupRef> refs;
    for (size_t gi = 0; gi < groups_.size(); ++gi) {
      Group& g = *groups_[gi];
      OptimizerStore::ParamSource src = store.Params(static_cast<int>(gi));
      refs.push_back({src.shard, g.dtype, &g.layout, g.name, std::move(src.load), src.load_bytes, g.dp});
    }
    Compute* upload = store.params_need_upload() ? impl_->compute.get() : nullptr;
    impl_->gatherer = std::make_unique<ParamGatherer>(shards_, &impl_->staging, impl_->host_staging.get(), upload,
                                                      config_.max_live_gathered_bytes, config_.prefetch_depth);
    impl_->gatherer->SetGroups(std::move(refs));
    if (config_.quantized_weights) impl_->gatherer->QuantizeGathers(kernels::QuantBlockFor(config_.quantization_block, 8));
    if (secondary_) impl_->gatherer->SecondaryShards(secondary_.get(), device_);
  }
  return GatherUpdatedParams(true);
}

void* EngineCore::OwnParams(Group& g) const {
  if (config_.stage == 3) return g.param_shard.data();
  return g.full_param.as<char>() + static_cast<size_t>(g.layout.shard_begin(LayoutRank(g))) * g.esize();
}

void* EngineCore::GradShard(Group& g) const {
  if (config_.stage >= 2) return g.grad_shard.data();
  return g.full_grad.as<char>() + static_cast<size_t>(g.layout.shard_begin(LayoutRank(g))) * g.gsize();
}

Status EngineCore::GatherUpdatedParams(bool include_frozen) {
  if (config_.stage != 1 && config_.stage != 2) return Status();
  std::vector<CommHandle> handles;
  for (auto& gp : groups_) {
    Group& g = *gp;
    if (g.frozen && !include_frozen) continue;  // unchanged since they were gathered
    const size_t S = static_cast<size_t>(g.layout.shard_size());
    Communicator* dp = Dp(g);
    ASSIGN_OR_RETURN(CommHandle h, dp->AllGatherAsync(OwnParams(g), g.full_param.data(), S, g.dtype), "gathering group '",
                     g.name, "'");
    handles.push_back(std::move(h));
    impl_->step_gathers.gather_bytes += static_cast<int64_t>(S * g.esize()) * (dp->size() - 1);
    ++impl_->step_gathers.collectives;
  }
  for (CommHandle& h : handles) RETURN_IF_ERROR(h.Wait(), "gathering updated parameters");
  return Status();
}

Result<EngineCore::Group*> EngineCore::Get(int group, const char* what) {
  if (!finalized_) return FailedPreconditionError(what, ": the engine is not finalized");
  if (group < 0 || group >= num_groups()) return NotFoundError(what, ": no group with index ", group, " (", num_groups(), " groups)");
  return groups_[static_cast<size_t>(group)].get();
}

int EngineCore::num_groups() const { return static_cast<int>(groups_.size()); }

Result<int> EngineCore::GroupIndex(const std::string& name) const {
  for (size_t i = 0; i < groups_.size(); ++i) {
    if (groups_[i]->name == name) return static_cast<int>(i);
  }
  return NotFoundError("no group named '", name, "'");
}

Result<ParamHandle> EngineCore::Find(std::string_view name) const {
  auto it = param_index_.find(std::string(name));
  if (it == param_index_.end()) return NotFoundError("no parameter named '", name, "'");
  return ParamHandle{it->second};
}

const TensorSpec& EngineCore::spec(ParamHandle p) const { return params_.at(static_cast<size_t>(p.index)); }
int EngineCore::group(ParamHandle p) const { return param_group_index_.at(static_cast<size_t>(p.index)); }

Result<TensorView> EngineCore::View(ParamHandle p, bool grad) {
  const char* what = grad ? "grad" : "param";
  if (!finalized_) return FailedPreconditionError(what, ": the engine is not finalized");
  if (p.index < 0 || p.index >= static_cast<int64_t>(params_.size())) return NotFoundError(what, ": no parameter #", p.index);
  const auto i = static_cast<size_t>(p.index);
  const int gi = param_group_index_[i];
  Group& g = *groups_[static_cast<size_t>(gi)];
  const auto offset = static_cast<size_t>(g.layout.tensor_offset(param_pos_[i]));
  if (grad) {
    if (g.frozen) return FailedPreconditionError("grad: tensor '", params_[i].name, "' is frozen (no gradient)");
    ASSIGN_OR_RETURN(void* base, GradBuffer(gi), "grad of '", params_[i].name, "'");
    return TensorView{static_cast<char*>(base) + offset * g.gsize(), &params_[i], g.grad_dtype};
  }
  void* base = config_.stage == 3 ? impl_->gatherer->gathered_data(gi) : g.full_param.data();
  if (base == nullptr) {
    return FailedPreconditionError("param '", params_[i].name, "': its group '", g.name, "' is not gathered (Gather(", gi, ") first)");
  }
  return TensorView{static_cast<char*>(base) + offset * g.esize(), &params_[i], g.dtype};
}

Result<TensorView> EngineCore::Param(ParamHandle p) { return View(p, false); }
Result<TensorView> EngineCore::Grad(ParamHandle p) { return View(p, true); }
Result<TensorView> EngineCore::Param(std::string_view name) {
  ASSIGN_OR_RETURN(ParamHandle p, Find(name), "param");
  return View(p, false);
}
Result<TensorView> EngineCore::Grad(std::string_view name) {
  ASSIGN_OR_RETURN(ParamHandle p, Find(name), "grad");
  return View(p, true);
}

Result<void*> EngineCore::Gather(int group) {
  ASSIGN_OR_RETURN(Group * g, Get(group, "gather"));
  if (config_.stage == 3) {
    internal::StepClock::Scope t(&impl_->clock, &StepTimes::comm_wait);
    return impl_->gatherer->Gather(group);
  }
  g->gathered = true;
  return g->full_param.data();
}

Status EngineCore::Release(int group) {
  ASSIGN_OR_RETURN(Group * g, Get(group, "release"));
  if (config_.stage == 3) return impl_->gatherer->Release(group);
  if (!g->gathered) return FailedPreconditionError("release: group '", g->name, "' is not gathered");
  g->gathered = false;
  return Status();
}

Result<void*> EngineCore::GradBuffer(int group) {
  ASSIGN_OR_RETURN(Group * g, Get(group, "grad_buffer"));
  if (g->frozen) return FailedPreconditionError("grad_buffer: group '", g->name, "' is frozen (no gradients)");
  if (g->grad_reduced && config_.stage >= 2) {
    return FailedPreconditionError("grad_buffer: gradients of group '", g->name, "' were already reduced this step");
  }
  if (!g->grad_live) {
    const size_t bytes = static_cast<size_t>(g->layout.padded_size()) * g->gsize();
    if (config_.stage >= 2) {
      ASSIGN_OR_RETURN(g->full_grad, impl_->staging.Acquire(bytes), "gradient buffer of '", g->name, "'");
    }
    RETURN_IF_ERROR(impl_->compute->Fill(g->full_grad.data(), 0, bytes));
    g->grad_live = true;
  }
  return g->full_grad.data();
}

Status EngineCore::GradsReady(int group) {
  ASSIGN_OR_RETURN(Group * g, Get(group, "grads_ready"));
  if (g->frozen) return Status();  // nothing to reduce: a loop over every group may call it
  if (!g->grad_live) return FailedPreconditionError("grads_ready: group '", g->name, "' has no gradient buffer this step");
  if (g->grad_reduced) return FailedPreconditionError("grads_ready: group '", g->name, "' was already reduced this step");
  if (!sync_) return Status();  // accumulation micro-step: keep the full gradient, no communication
  internal::StepClock::Scope t(&impl_->clock, &StepTimes::comm_wait);
  return ReduceGroup(group);
}

Status EngineCore::ReduceGroup(int gi) {
  Group& g = *groups_[static_cast<size_t>(gi)];
  GradBucketer& bucketer = g.dp != nullptr ? *impl_->own_bucketer : *impl_->bucketer;
  RETURN_IF_ERROR(bucketer.Add(g.full_grad.data(), g.grad_dtype, g.layout, GradShard(g), g.grad_dtype), "reducing group '", g.name, "'");
  g.grad_reduced = true;
  if (config_.stage >= 2) {  // the bucket holds a copy: the full gradient can go
    impl_->staging.Release(std::move(g.full_grad));
    g.grad_live = false;
  }
  return Status();
}

void EngineCore::Mark(Phase phase) { impl_->clock.Mark(phase); }
void EngineCore::Record(const std::string& key, double value) { impl_->recorded[key] = value; }

Result<StepResult> EngineCore::Step() {
  if (!finalized_) return FailedPreconditionError("step: the engine is not finalized");
  if (!sync_) return FailedPreconditionError("step: called in a no-sync micro-step (call SetSync(true) before the last)");
  impl_->clock.Mark(std::nullopt);
  ASSIGN_OR_RETURN(StepResult r, StepImpl());
  RETURN_IF_ERROR(Report(r), "step");
  return r;
}

Status EngineCore::Report(StepResult& r) {
  r.times = impl_->clock.Finish();
  const MetricsConfig& mc = config_.metrics;
  if (r.times.total > 0) {
    r.tokens_per_second = mc.tokens_per_step * comm_->size() / r.times.total;
    if (mc.peak_flops > 0) r.mfu = mc.flops_per_step / (r.times.total * mc.peak_flops);
  }
  nlohmann::json extra = std::move(impl_->recorded);
  impl_->recorded = nlohmann::json::object();
  if (!impl_->sink) return Status();
  const StepTimes& t = r.times;
  nlohmann::json j = {{"step", r.step}, {"skipped", r.skipped}, {"lr", r.lr}, {"loss_scale", r.loss_scale},
                      {"grad_norm", std::isfinite(r.grad_norm) ? nlohmann::json(r.grad_norm) : nlohmann::json(nullptr)},
                      {"time", {{"total", t.total}, {"forward", t.forward}, {"backward", t.backward}, {"comm_wait", t.comm_wait},
                                {"optimizer", t.optimizer}, {"offload_io", t.offload_io}, {"checkpoint_stall", t.checkpoint_stall},
                                {"other", t.other}}}};
  if (mc.tokens_per_step > 0) j["tokens_per_second"] = r.tokens_per_second;
  if (mc.peak_flops > 0 && mc.flops_per_step > 0) j["mfu"] = r.mfu;
  for (auto it = extra.begin(); it != extra.end(); ++it) j[it.key()] = it.value();
  return impl_->sink->Write(j);
}

// Gathered parameters dropped (they are about to change), every group's gradients reduced (each
// group takes part, in index order, even without a gradient), and the next step set to start from
// zero gradients whatever happens after (stage 0/1 buffers persist and are zeroed at the next
// GradBuffer; stage 2/3 ones already went back to the pool).
Status EngineCore::ReduceAll() {
  for (int gi = 0; gi < num_groups(); ++gi) {
    Group& g = *groups_[static_cast<size_t>(gi)];
    if (config_.stage == 3 && impl_->gatherer->gathered(gi)) RETURN_IF_ERROR(impl_->gatherer->Release(gi));
    g.gathered = false;
  }
  if (config_.stage == 3) RETURN_IF_ERROR(impl_->gatherer->EndStep(), "step");
  for (int gi = 0; gi < num_groups(); ++gi) {
    Group& g = *groups_[static_cast<size_t>(gi)];
    if (g.grad_reduced || g.frozen) continue;
    if (!g.grad_live) RETURN_IF_ERROR(GradBuffer(gi).status());
    RETURN_IF_ERROR(ReduceGroup(gi));
  }
  RETURN_IF_ERROR(impl_->bucketer->Flush(), "step");
  if (impl_->own_bucketer) RETURN_IF_ERROR(impl_->own_bucketer->Flush(), "step (the own data-parallel group)");
  for (auto& gp : groups_) {
    gp->grad_reduced = false;
    gp->grad_live = false;
  }
  return Status();
}

// Global sum of squares of the gradients; any inf/NaN on any rank makes it inf (one all-reduce). One
// multi-tensor pass per gradient dtype (on a GPU: one kernel and one host read each).
Result<float> EngineCore::GlobalSumSquares() {
  auto local_of = [&](bool own) -> Result<double> {
    double local = 0;
    for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
      std::vector<kernels::GradRef> refs;
      for (auto& gp : groups_) {
        if (gp->grad_dtype == t && !gp->frozen && (gp->dp != nullptr) == own) refs.push_back({GradShard(*gp), gp->layout.shard_size()});
      }
      if (refs.empty()) continue;
      ASSIGN_OR_RETURN(kernels::GradStats st, impl_->compute->SumSquares(refs, t), "step");
      local += st.nonfinite ? std::numeric_limits<double>::infinity() : st.sum_squares;
    }
    return local;
  };
  ASSIGN_OR_RETURN(const double dense, local_of(false));
  if (own_dp_ == nullptr) {
    // Over every rank, not only the shard group, so that clipping and skips agree everywhere: each
    // shard is counted once per replica.
    float global = static_cast<float>(dense);
    if (config_.stage != 0) RETURN_IF_ERROR(comm_->AllReduce(&global, &global, 1, DType::kF32, ReduceOp::kSum), "step: norm");
    return Replicas() > 1 ? global / static_cast<float>(Replicas()) : global;
  }
  // With tensors over their own groups each element counts once: the dense ones' shards are on every
  // rank at stage 0 (else once), the own groups' on each of their group's ranks at stage 0; and those
  // hold the average over their group, grad_scale times the gradient.
  ASSIGN_OR_RETURN(const double own, local_of(true));
  const double n = comm_->size(), e = own_dp_->size(), scale = e / n;
  const double local = dense / (config_.stage == 0 ? n : 1) + own * scale * scale / (config_.stage == 0 ? e : 1);
  float global = static_cast<float>(local);
  RETURN_IF_ERROR(comm_->AllReduce(&global, &global, 1, DType::kF32, ReduceOp::kSum), "step: norm");
  return global;
}

// Scalars per group and settings class: lr = peak * schedule * lr_scale, the tensor's weight decay.
Result<EngineCore::Scalars> EngineCore::StepScalars(double lr, float grad_multiplier) {
  Scalars scalars(groups_.size());
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    for (const Settings& st : groups_[gi]->classes) {
      kernels::AdamConfig c = config_.adam;
      c.lr = lr * st.lr_scale;
      c.weight_decay = st.weight_decay;
      ASSIGN_OR_RETURN(kernels::AdamStepScalars sc, kernels::MakeAdamStepScalars(c, steps_ + 1, grad_multiplier * groups_[gi]->grad_scale), "step, group '",
                       groups_[gi]->name, "'");
      scalars[gi].push_back(sc);
    }
  }
  return scalars;
}

// Adam over one window of a shard, one multi-tensor call per settings class; fp32 models' parameters
// are the master weights, 16-bit ones get the rounded copy in the same pass.
Status EngineCore::AdamWindow(const OptimizerStore::Window& w, const Scalars& scalars, std::vector<kernels::AdamTensorArgs>* args) {
  const auto gi = static_cast<size_t>(w.group);
  const Group& g = *groups_[gi];
  if (w.compact != nullptr) return AdamCompactWindow(w, scalars[gi]);
  const bool f32 = g.dtype == DType::kF32;
  const int64_t w0 = w.offset, w1 = w.offset + w.count;
  for (size_t c = 0; c < g.classes.size(); ++c) {
    args->clear();
    for (const Group::Run& run : g.runs) {
      const int64_t a = std::max(run.begin, w0), b = std::min(run.end, w1);
      if (run.cls != static_cast<int>(c) || a >= b) continue;
      const auto d = static_cast<size_t>(a - w0);
      args->push_back({w.master + d, static_cast<const char*>(w.grads) + d * g.gsize(), w.exp_avg + d, w.exp_avg_sq + d,
                       w.max_exp_avg_sq != nullptr ? w.max_exp_avg_sq + d : nullptr,
                       f32 ? nullptr : static_cast<char*>(w.params) + d * g.esize(), b - a});
    }
    if (args->empty()) continue;
    RETURN_IF_ERROR(w.compute->Adam(scalars[gi][c], *args, g.grad_dtype, f32 ? DType::kBF16 : g.dtype), "step, group '", g.name, "'");
  }
  if (f32 && w.params != w.master) RETURN_IF_ERROR(w.compute->Move(w.params, w.master, static_cast<size_t>(w.count) * 4));
  return Status();
}

// The same over compact state (StatePrecision): one call per settings class, each run its own tensor
// argument with its global index (stochastic rounding, q8 blocks).
Status EngineCore::AdamCompactWindow(const OptimizerStore::Window& w, const std::vector<kernels::AdamStepScalars>& scalars) {
  const Group& g = *groups_[static_cast<size_t>(w.group)];
  const OptimizerStore::CompactWindow& c = *w.compact;
  const bool f32 = g.dtype == DType::kF32;
  const int64_t w0 = w.offset, w1 = w.offset + w.count, block = c.format.block;
  std::vector<kernels::AdamCompactArgs> args;
  for (size_t k = 0; k < g.classes.size(); ++k) {
    args.clear();
    for (const Group::Run& run : g.runs) {
      const int64_t a = std::max(run.begin, w0), b = std::min(run.end, w1);
      if (run.cls != static_cast<int>(k) || a >= b) continue;
      const auto d = static_cast<size_t>(a - w0);
      kernels::AdamCompactArgs t;
      t.param = c.format.master ? static_cast<void*>(w.master + d) : static_cast<char*>(w.params) + d * g.esize();
      t.grad = static_cast<const char*>(w.grads) + d * g.gsize();
      t.exp_avg = static_cast<char*>(c.exp_avg) + c.format.exp_avg_format().ValuesBytes(a - w0);  // runs start at whole blocks
      t.exp_avg_sq = static_cast<char*>(c.exp_avg_sq) + c.format.exp_avg_sq_format().ValuesBytes(a - w0);
      t.exp_avg_scale = c.exp_avg_scale != nullptr ? c.exp_avg_scale + d / static_cast<size_t>(block) : nullptr;
      t.exp_avg_sq_scale = c.exp_avg_sq_scale != nullptr ? c.exp_avg_sq_scale + d / static_cast<size_t>(block) : nullptr;
      t.param_copy = c.format.master && !f32 ? static_cast<char*>(w.params) + d * g.esize() : nullptr;
      t.numel = b - a;
      t.index = c.index + static_cast<int64_t>(d);
      t.format = c.format;
      args.push_back(t);
    }
    if (args.empty()) continue;
    RETURN_IF_ERROR(w.compute->AdamCompact(scalars[k], steps_ + 1, args, g.grad_dtype, f32 ? DType::kBF16 : g.dtype), "step, group '",
                    g.name, "'");
  }
  if (f32 && w.params != w.master) RETURN_IF_ERROR(w.compute->Move(w.params, w.master, static_cast<size_t>(w.count) * 4));
  return Status();
}

// Adam over every part of every shard, wherever the store keeps it; the time charged to the step's
// phases (a capture's wait, NVMe waits, the optimizer itself).
Status EngineCore::Update(const Scalars& scalars) {
  std::vector<kernels::AdamTensorArgs> args;
  const double t0 = SteadySeconds();
  RETURN_IF_ERROR(impl_->store->Update([&](const OptimizerStore::Window& w) { return AdamWindow(w, scalars, &args); }), "step");
  RETURN_IF_ERROR(impl_->compute->MarkUpdated(), "step");  // what a capture of device memory waits for
  const double spent = SteadySeconds() - t0;
  const double captured = std::min(spent, impl_->store->TakeCaptureWait());
  const double io = std::min(spent - captured, impl_->store->swap_stats().wait_seconds);
  impl_->clock.Charge(&StepTimes::checkpoint_stall, captured);
  impl_->clock.Charge(&StepTimes::offload_io, io);
  impl_->clock.Charge(&StepTimes::optimizer, spent - captured - io);
  return Status();
}

Result<StepResult> EngineCore::StepImpl() {
  std::optional<internal::StepClock::Scope> comm_time(std::in_place, &impl_->clock, &StepTimes::comm_wait);
  RETURN_IF_ERROR(ReduceAll());
  ASSIGN_OR_RETURN(const float global, GlobalSumSquares());
  StepResult r;
  r.loss_scale = scaler_.scale();
  r.lr = lr();
  if (!std::isfinite(global)) {
    scaler_.Update(true);
    r.skipped = true;
    r.grad_norm = std::numeric_limits<double>::infinity();
    r.step = steps_;
    ZRT_LOG(kInfo) << "step skipped: non-finite gradients (loss scale " << r.loss_scale << " -> " << scaler_.scale() << ")";
    return r;
  }
  comm_time.reset();
  float norm = 0;
  const float mult = kernels::GradMultiplier(global, static_cast<float>(scaler_.scale() * config_.grad_accum_steps),
                                             static_cast<float>(config_.max_grad_norm), &norm);
  r.grad_norm = norm;
  ASSIGN_OR_RETURN(const Scalars scalars, StepScalars(r.lr, mult));
  RETURN_IF_ERROR(Update(scalars));
  {
    internal::StepClock::Scope t(&impl_->clock, &StepTimes::comm_wait);
    RETURN_IF_ERROR(GatherUpdatedParams(false), "step");
  }
  scaler_.Update(false);
  r.step = ++steps_;
  return r;
}

StateView EngineCore::state_view() {
  StateView v;
  v.rank = config_.stage == 0 ? comm_->rank() : shards_->rank();
  v.world_size = comm_->size();
  v.stage = config_.stage;
  v.counters = {steps_, scaler_.scale(), scaler_.state().good_steps, scaler_.state().hysteresis_left, EngineState()};
  v.owner = impl_->owner.get();
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const Group& g = *groups_[gi];
    v.groups.push_back({g.name, g.tensors, g.layout, impl_->store->StateBuffers(static_cast<int>(gi)), lr(), config_.adam.weight_decay,
                        g.dp != nullptr ? own_ranks_ : std::vector<int>()});
  }
  return v;
}

Status EngineCore::Restore(const StateCounters& saved) {
  RETURN_IF_ERROR(Settle(), "restore");
  if (saved.step < 0) return InvalidArgumentError("restore: negative step ", saved.step);
  if (!(saved.loss_scale > 0) || !std::isfinite(saved.loss_scale)) {
    return InvalidArgumentError("restore: loss scale must be finite and > 0, got ", saved.loss_scale);
  }
  RETURN_IF_ERROR(ApplyEngineState(saved.engine_state), "restore");
  steps_ = saved.step;
  scaler_.set_state({saved.loss_scale, saved.scaler_good_steps, saved.scaler_hysteresis_left});
  RETURN_IF_ERROR(RefreshParamsFromMaster());
  impl_->clock.Begin();  // the first step after a resume does not count the load
  return Status();
}

Status EngineCore::RefreshParamsFromMaster() {
  if (!finalized_) return FailedPreconditionError("refresh: the engine is not finalized");
  RETURN_IF_ERROR(Settle(), "refresh");  // the gather rewrites frozen groups' parameters, which a capture may be reading
  RETURN_IF_ERROR(impl_->store->RefreshParams(), "refresh");
  if (impl_->gatherer) impl_->gatherer->DropSecondary();  // hpZ's copies are of the parameters before
  return GatherUpdatedParams(true);
}

Status EngineCore::ForEachFullTensor(const FullStateOptions& options, const FullStateFn& fn) {
  if (!finalized_) return FailedPreconditionError("full state: the engine is not finalized");
  return zrt::ForEachFullTensor(comm_, state_view(), options, fn);
}

Result<std::vector<float>> EngineCore::FullMaster(ParamHandle p, int root) {
  if (p.index < 0 || p.index >= static_cast<int64_t>(params_.size())) return NotFoundError("full master: no parameter #", p.index);
  FullStateOptions o;
  o.root = root;
  o.tensors = {params_[static_cast<size_t>(p.index)].name};
  std::vector<float> out;
  RETURN_IF_ERROR(ForEachFullTensor(o, [&](const TensorSpec&, std::string_view, std::span<const float> v) {
    out.assign(v.begin(), v.end());
    return Status();
  }));
  return out;
}

MemoryTracker::Snapshot EngineCore::memory() const { return device_->memory().Read(); }
MemoryTracker::Snapshot EngineCore::host_memory() const { return impl_->host->memory().Read(); }
SwapStats EngineCore::swap_stats() const { return impl_->store->swap_stats(); }

CommStats EngineCore::comm_stats() const {
  CommStats s = impl_->step_gathers;
  if (impl_->bucketer) {
    s.reduce_bytes += impl_->bucketer->stats().reduce_bytes;
    s.replica_bytes += impl_->bucketer->stats().replica_bytes;
    s.across_nodes_bytes += impl_->bucketer->stats().across_nodes_bytes;
    s.collectives += impl_->bucketer->stats().collectives;
    s.reduce_seconds += impl_->bucketer->stats().reduce_seconds;
    s.reduce_wait_seconds += impl_->bucketer->stats().reduce_wait_seconds;
  }
  if (impl_->gatherer) {
    s.gather_bytes += impl_->gatherer->stats().gather_bytes;
    s.secondary_gather_bytes += impl_->gatherer->stats().secondary_gather_bytes;
    s.collectives += impl_->gatherer->stats().collectives;
  }
  return s;
}

}  // namespace zrt
