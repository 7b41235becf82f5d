// ZeroEngine: orchestrates the components (layouts and buffers per group, GradBucketer,
// ParamGatherer, LossScaler, CPU Adam) for one training step; see engine.h for the API.
//
// Buffers per group (E = bytes per element of the group's dtype, P = padded size, S = P / N):
//   stage | params              | gradients                     | optimizer (fp32)
//   0     | full P*E            | full P*E (all-reduced in place)| master, m, v: P each (layout of 1 rank)
//   1     | full P*E            | full P*E, shard = own block    | master, m, v: S each
//   2     | full P*E            | shard S*E (+ full P*E pooled   | master, m, v: S each
//         |                     |   from GradBuffer to GradsReady)|
//   3     | shard S*E (+ full   | as stage 2                    | master, m, v: S each
//         |   pooled while gathered)|                           |
// Step: flush buckets -> local sum of squares of the grad shards (inf if any element is inf/NaN) ->
// one all-reduce -> skip, or multiplier = clip / (loss_scale * accum) -> Adam over each shard, the
// updated params cast straight into this rank's block of the model params -> stages 1-2 all-gather.
#include "zrt/runtime/engine.h"

#include <cmath>
#include <cstring>
#include <future>
#include <limits>
#include <map>

#include "zrt/runtime/buffer_pool.h"
#include "zrt/runtime/compute.h"
#include "zrt/kernels/cast.h"
#include "zrt/core/logging.h"
#include "zrt/core/thread_pool.h"
#include "zrt/runtime/param_gatherer.h"

namespace zrt {

struct ZeroEngine::Group {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> params;
  std::vector<TensorSpec> tensors;
  ShardLayout layout;
  double lr = 0, weight_decay = 0;
  DeviceBuffer full_param, param_shard, full_grad, grad_shard;
  DeviceBuffer master, exp_avg, exp_avg_sq, max_exp_avg_sq;
  // Offloaded optimizer with device memory the host cannot address: host copies of the gradient shard
  // (copied down before the CPU Adam) and of this rank's parameters (copied up after it).
  DeviceBuffer host_grad, host_params;
  bool gathered = false;      // stages 0-2 bookkeeping for Release
  bool grad_live = false;     // full gradient exists (and is zeroed) for this step
  bool grad_reduced = false;  // reduction queued this step
  size_t esize() const { return DTypeSize(dtype); }
};

struct ZeroEngine::Impl {
  Impl(Device* d, int n_threads) : pool(n_threads - 1, "zrt-adam"), threads(n_threads), staging(d, MemCategory::kStaging) {}
  ThreadPool pool;
  int threads;  // optimizer threads, caller included
  // Offload: host memory (state with offload = host; NVMe buffer sets), and for NVMe the I/O engine
  // and the swapper, whose streams are master, exp_avg, exp_avg_sq[, max_exp_avg_sq][, params].
  // Declared before the components whose buffers come from it.
  std::unique_ptr<HostMemory> host;
  std::unique_ptr<BufferPool> host_staging;  // stage-3 parameter shards read from NVMe
  std::unique_ptr<Compute> compute;          // kernels on the device's buffers
  std::unique_ptr<Compute> host_compute;     // CPU kernels on offloaded state
  bool mirror = false;                       // Group::host_grad/host_params in use
  std::unique_ptr<ThreadPool> copier;        // with mirrors: device<->host copies beside the CPU Adam
  BufferPool staging;
  std::unique_ptr<GradBucketer> bucketer;
  std::unique_ptr<ParamGatherer> gatherer;
  CommStats step_gathers;  // stages 1-2 parameter all-gathers after the step
  std::unique_ptr<IoEngine> io;
  std::unique_ptr<StateSwapper> swapper;
  int num_streams = 0, vmax_stream = -1, param_stream = -1;
  SwapStats swap;
  kernels::CpuKernelOptions kernel_options() {
    kernels::CpuKernelOptions ko;
    ko.pool = &pool;
    ko.threads = threads;
    return ko;
  }
};

namespace {

uint64_t Fnv(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

uint64_t SpecHash(const TensorSpec& s, const std::string& group) {
  uint64_t h = 1469598103934665603ull;
  h = Fnv(h, s.name.data(), s.name.size());
  h = Fnv(h, s.shape.data(), s.shape.size() * sizeof(int64_t));
  h = Fnv(h, &s.dtype, sizeof(s.dtype));
  return Fnv(h, group.data(), group.size());
}

}  // namespace

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

ZeroEngine::ZeroEngine(Communicator* comm, Device* device, const EngineConfig& config)
    : comm_(comm), device_(device), config_(config) {}
ZeroEngine::~ZeroEngine() {
  groups_.clear();  // their buffers may come from impl_'s host memory, which goes with impl_
}

Result<std::unique_ptr<ZeroEngine>> ZeroEngine::Create(Communicator* comm, Device* device, const EngineConfig& c) {
  if (comm == nullptr || device == nullptr) return InvalidArgumentError("engine: null communicator or device");
  if (c.stage < 0 || c.stage > 3) return InvalidArgumentError("engine: stage must be 0, 1, 2 or 3, got ", c.stage);
  if (c.alignment < 1) return InvalidArgumentError("engine: alignment must be >= 1 element, got ", c.alignment);
  if (c.grad_accum_steps < 1) return InvalidArgumentError("engine: grad_accum_steps must be >= 1, got ", c.grad_accum_steps);
  if (c.max_grad_norm < 0 || !std::isfinite(c.max_grad_norm)) {
    return InvalidArgumentError("engine: max_grad_norm must be finite and >= 0 (0 = off), got ", c.max_grad_norm);
  }
  if (c.prefetch_depth < 0) return InvalidArgumentError("engine: prefetch_depth must be >= 0");
  if (device->kind() == DeviceKind::kCuda && comm->backend() == "mpi") {
    return InvalidArgumentError("engine: device ", device->name(), " needs a communicator on device memory (NcclCommunicator); ",
                                "the MPI communicator works on host buffers only");
  }
  RETURN_IF_ERROR(kernels::MakeAdamStepScalars(c.adam, 1).status(), "engine");
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
  std::unique_ptr<ZeroEngine> e(new ZeroEngine(comm, device, c));
  ASSIGN_OR_RETURN(e->scaler_, LossScaler::Create(c.loss_scale), "engine");
  const int threads = c.optimizer_threads > 0 ? c.optimizer_threads : ThreadPool::HardwareThreads();
  e->impl_ = std::make_unique<Impl>(device, threads);
  e->impl_->host = HostMemory::Create(oc.host_budget_bytes, "offload.host_budget_bytes");
  e->impl_->host_staging = std::make_unique<BufferPool>(e->impl_->host.get(), MemCategory::kStaging);
  ASSIGN_OR_RETURN(e->impl_->compute, Compute::For(device, e->impl_->kernel_options()), "engine");
  ASSIGN_OR_RETURN(e->impl_->host_compute, Compute::For(e->impl_->host.get(), e->impl_->kernel_options()), "engine");
  e->impl_->mirror = oc.optimizer != OffloadTarget::kNone && !device->host_accessible();
  if (e->impl_->mirror) e->impl_->copier = std::make_unique<ThreadPool>(1, "zrt-copy");
  if (oc.optimizer == OffloadTarget::kNvme) {
    ASSIGN_OR_RETURN(e->impl_->io, IoEngine::Create(oc.io), "engine: offload I/O");
  }
  return e;
}

Status ZeroEngine::AddParam(const std::string& name, const std::vector<int64_t>& shape, DType dtype,
                            const std::string& group) {
  if (finalized_) return FailedPreconditionError("add_param '", name, "': the engine is already finalized");
  TensorSpec spec{name, shape, dtype};
  RETURN_IF_ERROR(Validate(spec), "add_param");
  if (!IsFloating(dtype)) return InvalidArgumentError("add_param '", name, "': dtype must be f32, bf16 or f16");
  if (group.empty()) return InvalidArgumentError("add_param '", name, "': empty group name");
  params_.push_back(std::move(spec));
  param_groups_.push_back(group);
  return Status();
}

Status ZeroEngine::CheckRegistration() {
  // Rank 0's list is the reference: count first, then one hash per parameter.
  int64_t count = static_cast<int64_t>(params_.size());
  int64_t root_count = count;
  RETURN_IF_ERROR(comm_->Broadcast(&root_count, sizeof(root_count), DType::kBytes, 0));
  float mismatch = root_count == count ? 0.0f : 1.0f;
  RETURN_IF_ERROR(comm_->AllReduce(&mismatch, &mismatch, 1, DType::kF32, ReduceOp::kMax));
  if (mismatch != 0) {
    return InvalidArgumentError("finalize: ranks registered different numbers of parameters (rank 0: ", root_count,
                                ", rank ", comm_->rank(), ": ", count, ")");
  }
  std::vector<uint64_t> mine(params_.size()), root(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) mine[i] = root[i] = SpecHash(params_[i], param_groups_[i]);
  RETURN_IF_ERROR(comm_->Broadcast(root.data(), root.size() * sizeof(uint64_t), DType::kBytes, 0));
  size_t first = params_.size();
  for (size_t i = 0; i < params_.size(); ++i) {
    if (mine[i] != root[i]) {
      first = i;
      break;
    }
  }
  float first_f = static_cast<float>(first);  // exact below 2^24 parameters
  RETURN_IF_ERROR(comm_->AllReduce(&first_f, &first_f, 1, DType::kF32, ReduceOp::kMin));
  const auto f = static_cast<size_t>(first_f);
  if (f < params_.size()) {
    return InvalidArgumentError("finalize: parameter #", f, " differs across ranks (rank ", comm_->rank(), " has ",
                                params_[f].ToString(), " in group '", param_groups_[f], "'",
                                mine[f] == root[f] ? ", as rank 0 does" : ", rank 0 has something else", ")");
  }
  return Status();
}

Status ZeroEngine::Finalize(const InitFn& init) {
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
      groups_.back()->lr = config_.adam.lr;
      groups_.back()->weight_decay = config_.adam.weight_decay;
    }
    Group& g = *groups_[static_cast<size_t>(it->second)];
    if (g.dtype != params_[i].dtype) {
      return InvalidArgumentError("finalize: parameter '", params_[i].name, "' is ", DTypeName(params_[i].dtype),
                                  " but group '", g.name, "' is ", DTypeName(g.dtype), " (one dtype per group)");
    }
    g.params.push_back(static_cast<int64_t>(i));
    g.tensors.push_back(params_[i]);
  }
  RETURN_IF_ERROR(Allocate(init));
  finalized_ = true;
  return Status();
}

Status ZeroEngine::Allocate(const InitFn& init) {
  const int n = config_.stage == 0 ? 1 : comm_->size();
  const int rank = config_.stage == 0 ? 0 : comm_->rank();
  const OffloadConfig& oc = config_.offload;
  Device* const state_dev = oc.optimizer == OffloadTarget::kHost ? impl_->host.get() : device_;
  Device* const param_dev = oc.params == OffloadTarget::kHost ? impl_->host.get() : device_;
  const bool nvme = oc.optimizer == OffloadTarget::kNvme;
  GradBucketer::Options bo;
  bo.bucket_bytes = config_.bucket_bytes;
  bo.reduce_dtype = config_.reduce_dtype;
  bo.all_reduce = config_.stage == 0;
  ASSIGN_OR_RETURN(impl_->bucketer, GradBucketer::Create(comm_, device_, impl_->compute.get(), bo), "finalize");
  for (auto& gp : groups_) {
    Group& g = *gp;
    ASSIGN_OR_RETURN(g.layout, ShardLayout::Create(g.tensors, n, config_.alignment), "group '", g.name, "'");
    const auto P = static_cast<size_t>(g.layout.padded_size()), S = static_cast<size_t>(g.layout.shard_size());
    const std::string ctx = "allocating group '" + g.name + "'";
    if (config_.stage <= 2) {
      ASSIGN_OR_RETURN(g.full_param, device_->Allocate(P * g.esize(), MemCategory::kParameters), ctx);
      RETURN_IF_ERROR(device_->Fill(g.full_param.data(), 0, P * g.esize()));
    } else if (oc.params != OffloadTarget::kNvme) {
      ASSIGN_OR_RETURN(g.param_shard, param_dev->Allocate(S * g.esize(), MemCategory::kParameters), ctx);
    }
    if (config_.stage <= 1) {
      ASSIGN_OR_RETURN(g.full_grad, device_->Allocate(P * g.esize(), MemCategory::kGradients), ctx);
    } else {
      ASSIGN_OR_RETURN(g.grad_shard, device_->Allocate(S * g.esize(), MemCategory::kGradients), ctx);
    }
    if (impl_->mirror) {
      ASSIGN_OR_RETURN(g.host_grad, impl_->host->Allocate(S * g.esize(), MemCategory::kGradients), ctx);
      if (oc.params == OffloadTarget::kNone) {
        ASSIGN_OR_RETURN(g.host_params, impl_->host->Allocate(S * g.esize(), MemCategory::kParameters), ctx);
      }
    }
    if (nvme) continue;  // the state lives in swap files, initialised below
    for (DeviceBuffer* b : {&g.master, &g.exp_avg, &g.exp_avg_sq}) {
      ASSIGN_OR_RETURN(*b, state_dev->Allocate(S * 4, MemCategory::kOptimizerState), ctx);
      RETURN_IF_ERROR(state_dev->Fill(b->data(), 0, S * 4));
    }
    if (config_.adam.amsgrad) {
      ASSIGN_OR_RETURN(g.max_exp_avg_sq, state_dev->Allocate(S * 4, MemCategory::kOptimizerState), ctx);
      RETURN_IF_ERROR(state_dev->Fill(g.max_exp_avg_sq.data(), 0, S * 4));
    }
    // Initial values: this rank's pieces only (padding stays zero), through host memory if need be.
    std::vector<float> staged;
    float* master = g.master.as<float>();
    if (!state_dev->host_accessible()) {
      staged.assign(S, 0.0f);
      master = staged.data();
    }
    for (const ShardPiece& p : g.layout.RankPieces(rank)) {
      init(g.params[static_cast<size_t>(p.tensor)], p.tensor_offset, p.count, master + p.shard_offset);
    }
    if (!staged.empty()) RETURN_IF_ERROR(state_dev->Copy(g.master.data(), staged.data(), S * 4), ctx);
    RETURN_IF_ERROR(ParamsFromMaster(g), ctx);
  }
  // A problem on one rank (no space on its disk) must not leave the others waiting in a collective.
  if (nvme) RETURN_IF_ERROR(AgreeOnStatus(comm_, CreateSwapper(&init)), "finalize");
  if (config_.stage == 3) {
    std::vector<ParamGatherer::GroupRef> refs;
    for (size_t gi = 0; gi < groups_.size(); ++gi) {
      Group& g = *groups_[gi];
      refs.push_back({g.param_shard.data(), g.dtype, &g.layout, g.name, {}, 0});
      if (impl_->param_stream >= 0) {
        const int region = static_cast<int>(gi), stream = impl_->param_stream;
        refs.back().load = [sw = impl_->swapper.get(), region, stream](void* dst) { return sw->ReadRegionAsync(region, stream, dst); };
        refs.back().load_bytes = impl_->swapper->RegionBytes(region, stream);
      }
    }
    // Offloaded shards live in host memory: on a device the host cannot address, each goes through a
    // device copy queued before its all-gather.
    Compute* upload = oc.params != OffloadTarget::kNone && !device_->host_accessible() ? impl_->compute.get() : nullptr;
    impl_->gatherer = std::make_unique<ParamGatherer>(comm_, &impl_->staging, impl_->host_staging.get(), upload,
                                                      config_.max_live_gathered_bytes, config_.prefetch_depth);
    impl_->gatherer->SetGroups(std::move(refs));
  }
  return GatherUpdatedParams();
}

Status ZeroEngine::CreateSwapper(const InitFn* init) {
  const OffloadConfig& oc = config_.offload;
  std::vector<SwapStream> streams = {{"master", 4}, {"exp_avg", 4}, {"exp_avg_sq", 4}};
  if (config_.adam.amsgrad) {
    impl_->vmax_stream = static_cast<int>(streams.size());
    streams.push_back({"max_exp_avg_sq", 4});
  }
  if (oc.params == OffloadTarget::kNvme) {
    impl_->param_stream = static_cast<int>(streams.size());
    streams.push_back({"params", 4});
  }
  std::vector<SwapRegion> regions;
  for (auto& gp : groups_) {
    SwapRegion r{"group '" + gp->name + "'", gp->layout.shard_size(), {}};
    if (impl_->param_stream >= 0) {
      r.element_bytes.assign(streams.size(), 4);
      r.element_bytes[static_cast<size_t>(impl_->param_stream)] = gp->esize();
    }
    regions.push_back(std::move(r));
  }
  SwapperOptions so;
  so.dir = oc.nvme_dir;
  so.rank = comm_->rank();
  so.sub_group_elements = oc.sub_group_elements;
  impl_->num_streams = static_cast<int>(streams.size());
  ASSIGN_OR_RETURN(impl_->swapper, StateSwapper::Create(so, std::move(regions), std::move(streams), impl_->io.get(), impl_->host.get()));
  // Initial state, streamed: master from `init`, zero moments, and the parameters cast from master.
  const int rank = config_.stage == 0 ? 0 : comm_->rank();
  std::vector<SwapAccess> access(static_cast<size_t>(impl_->num_streams), SwapAccess::kWrite);
  RETURN_IF_ERROR(impl_->swapper->Stream(access, [&](const StateSwapper::Window& w) -> Status {
    Group& g = *groups_[static_cast<size_t>(w.region)];
    auto* master = static_cast<float*>(w.data[0]);
    const auto bytes = static_cast<size_t>(w.count) * 4;
    for (size_t k = 0; k < w.data.size(); ++k) {
      if (static_cast<int>(k) != impl_->param_stream) std::memset(w.data[k], 0, bytes);
    }
    const int64_t lo = w.offset, hi = w.offset + w.count;
    for (const ShardPiece& p : g.layout.RankPieces(rank)) {
      const int64_t a = std::max(lo, p.shard_offset), b = std::min(hi, p.shard_offset + p.count);
      if (a < b) (*init)(g.params[static_cast<size_t>(p.tensor)], p.tensor_offset + (a - p.shard_offset), b - a, master + (a - lo));
    }
    return kernels::CastCpu(master, DType::kF32, ParamsAt(g, w), g.dtype, w.count, impl_->kernel_options());
  }, &impl_->swap));
  return PushParams();
}

void* ZeroEngine::ParamsAt(Group& g, const StateSwapper::Window& w) {
  if (impl_->param_stream >= 0) return w.data[static_cast<size_t>(impl_->param_stream)];
  return static_cast<char*>(HostParams(g)) + static_cast<size_t>(w.offset) * g.esize();
}

Status ZeroEngine::PushParams() {
  for (auto& gp : groups_) RETURN_IF_ERROR(ParamsUp(*gp));
  return Status();
}

Status ZeroEngine::ParamsUp(Group& g) {
  if (g.host_params.empty()) return Status();
  return device_->Copy(OwnParams(g), g.host_params.data(), g.host_params.size())
      .WithContext("copying the parameters of group '" + g.name + "' to " + device_->name());
}

Status ZeroEngine::GradsDown(Group& g) {
  if (g.host_grad.empty()) return Status();
  return device_->Copy(g.host_grad.data(), GradShard(g), g.host_grad.size())
      .WithContext("copying the gradients of group '" + g.name + "' from " + device_->name());
}

const void* ZeroEngine::HostGrads(Group& g) const { return g.host_grad.empty() ? GradShard(g) : g.host_grad.data(); }
void* ZeroEngine::HostParams(Group& g) const { return g.host_params.empty() ? OwnParams(g) : g.host_params.data(); }

Status ZeroEngine::StreamParamsFromMaster() {
  std::vector<SwapAccess> access(static_cast<size_t>(impl_->num_streams), SwapAccess::kNone);
  access[0] = SwapAccess::kRead;
  if (impl_->param_stream >= 0) access[static_cast<size_t>(impl_->param_stream)] = SwapAccess::kWrite;
  RETURN_IF_ERROR(impl_->swapper->Stream(access, [&](const StateSwapper::Window& w) {
    Group& g = *groups_[static_cast<size_t>(w.region)];
    return kernels::CastCpu(w.data[0], DType::kF32, ParamsAt(g, w), g.dtype, w.count, impl_->kernel_options());
  }, &impl_->swap));
  return PushParams();
}

Status ZeroEngine::UpdateRange(Group& g, Compute& c, const void* grads, const kernels::AdamStepScalars& s, int64_t offset,
                               int64_t count, float* master, float* m, float* v, float* vmax, void* params) {
  const void* grad = static_cast<const char*>(grads) + static_cast<size_t>(offset) * g.esize();
  const bool f32 = g.dtype == DType::kF32;
  kernels::AdamTensorArgs t{master, grad, m, v, vmax, f32 ? nullptr : params, count};
  RETURN_IF_ERROR(c.Adam(s, std::span(&t, 1), g.dtype, f32 ? DType::kBF16 : g.dtype), "step, group '", g.name, "'");
  if (f32) RETURN_IF_ERROR(c.Move(params, master, static_cast<size_t>(count) * 4));  // fp32 models: the params are the master
  return Status();
}

void* ZeroEngine::OwnParams(Group& g) const {
  if (config_.stage == 3) return g.param_shard.data();
  const int rank = config_.stage == 0 ? 0 : comm_->rank();  // stage 0's layout has one "rank"
  return g.full_param.as<char>() + static_cast<size_t>(g.layout.shard_begin(rank)) * g.esize();
}

void* ZeroEngine::GradShard(Group& g) const {
  if (config_.stage >= 2) return g.grad_shard.data();
  const int rank = config_.stage == 0 ? 0 : comm_->rank();
  return g.full_grad.as<char>() + static_cast<size_t>(g.layout.shard_begin(rank)) * g.esize();
}

Status ZeroEngine::ParamsFromMaster(Group& g) {
  const int64_t S = g.layout.shard_size();
  if (config_.offload.optimizer == OffloadTarget::kNone) {  // master and params both in device memory
    return impl_->compute->Cast(g.master.data(), DType::kF32, OwnParams(g), g.dtype, S);
  }
  RETURN_IF_ERROR(impl_->host_compute->Cast(g.master.data(), DType::kF32, HostParams(g), g.dtype, S));
  return ParamsUp(g);
}

Status ZeroEngine::GatherUpdatedParams() {
  if (config_.stage != 1 && config_.stage != 2) return Status();
  std::vector<CommHandle> handles;
  for (auto& gp : groups_) {
    Group& g = *gp;
    const size_t S = static_cast<size_t>(g.layout.shard_size());
    ASSIGN_OR_RETURN(CommHandle h, comm_->AllGatherAsync(OwnParams(g), g.full_param.data(), S, g.dtype), "gathering group '",
                     g.name, "'");
    handles.push_back(std::move(h));
    impl_->step_gathers.gather_bytes += static_cast<int64_t>(S * g.esize()) * (comm_->size() - 1);
    ++impl_->step_gathers.collectives;
  }
  for (CommHandle& h : handles) RETURN_IF_ERROR(h.Wait(), "gathering updated parameters");
  return Status();
}

Result<ZeroEngine::Group*> ZeroEngine::Get(int group, const char* what) {
  if (!finalized_) return FailedPreconditionError(what, ": the engine is not finalized");
  if (group < 0 || group >= num_groups()) return NotFoundError(what, ": no group with index ", group, " (", num_groups(), " groups)");
  return groups_[static_cast<size_t>(group)].get();
}

int ZeroEngine::num_groups() const { return static_cast<int>(groups_.size()); }

Result<int> ZeroEngine::GroupIndex(const std::string& name) const {
  for (size_t i = 0; i < groups_.size(); ++i) {
    if (groups_[i]->name == name) return static_cast<int>(i);
  }
  return NotFoundError("no group named '", name, "'");
}

Result<ZeroEngine::ParamLocation> ZeroEngine::Locate(int64_t param) const {
  if (!finalized_) return FailedPreconditionError("locate: the engine is not finalized");
  if (param < 0 || param >= static_cast<int64_t>(params_.size())) return NotFoundError("locate: no parameter #", param);
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const Group& g = *groups_[gi];
    for (size_t k = 0; k < g.params.size(); ++k) {
      if (g.params[k] == param) {
        return ParamLocation{static_cast<int>(gi), g.layout.tensor_offset(static_cast<int64_t>(k)), params_[static_cast<size_t>(param)].numel(), g.dtype};
      }
    }
  }
  return InternalError("locate: parameter #", param, " is in no group");
}

Result<void*> ZeroEngine::Gather(int group) {
  ASSIGN_OR_RETURN(Group * g, Get(group, "gather"));
  if (config_.stage == 3) return impl_->gatherer->Gather(group);
  g->gathered = true;
  return g->full_param.data();
}

Status ZeroEngine::Release(int group) {
  ASSIGN_OR_RETURN(Group * g, Get(group, "release"));
  if (config_.stage == 3) return impl_->gatherer->Release(group);
  if (!g->gathered) return FailedPreconditionError("release: group '", g->name, "' is not gathered");
  g->gathered = false;
  return Status();
}

Result<void*> ZeroEngine::GradBuffer(int group) {
  ASSIGN_OR_RETURN(Group * g, Get(group, "grad_buffer"));
  if (g->grad_reduced && config_.stage >= 2) {
    return FailedPreconditionError("grad_buffer: gradients of group '", g->name, "' were already reduced this step");
  }
  if (!g->grad_live) {
    const size_t bytes = static_cast<size_t>(g->layout.padded_size()) * g->esize();
    if (config_.stage >= 2) {
      ASSIGN_OR_RETURN(g->full_grad, impl_->staging.Acquire(bytes), "gradient buffer of '", g->name, "'");
    }
    RETURN_IF_ERROR(impl_->compute->Fill(g->full_grad.data(), 0, bytes));
    g->grad_live = true;
  }
  return g->full_grad.data();
}

Status ZeroEngine::GradsReady(int group) {
  ASSIGN_OR_RETURN(Group * g, Get(group, "grads_ready"));
  if (!g->grad_live) return FailedPreconditionError("grads_ready: group '", g->name, "' has no gradient buffer this step");
  if (g->grad_reduced) return FailedPreconditionError("grads_ready: group '", g->name, "' was already reduced this step");
  if (!sync_) return Status();  // accumulation micro-step: keep the full gradient, no communication
  return ReduceGroup(group);
}

Status ZeroEngine::ReduceGroup(int gi) {
  Group& g = *groups_[static_cast<size_t>(gi)];
  RETURN_IF_ERROR(impl_->bucketer->Add(g.full_grad.data(), g.dtype, g.layout, GradShard(g), g.dtype), "reducing group '", g.name, "'");
  g.grad_reduced = true;
  if (config_.stage >= 2) {  // the bucket holds a copy: the full gradient can go
    impl_->staging.Release(std::move(g.full_grad));
    g.grad_live = false;
  }
  return Status();
}

Result<StepResult> ZeroEngine::Step() {
  if (!finalized_) return FailedPreconditionError("step: the engine is not finalized");
  if (!sync_) return FailedPreconditionError("step: called in a no-sync micro-step (call SetSync(true) before the last)");
  // Gathered parameters are about to change: drop them (stage 3 buffers go back to the pool).
  for (int gi = 0; gi < num_groups(); ++gi) {
    Group& g = *groups_[static_cast<size_t>(gi)];
    if (config_.stage == 3 && impl_->gatherer->gathered(gi)) RETURN_IF_ERROR(impl_->gatherer->Release(gi));
    g.gathered = false;
  }
  if (config_.stage == 3) RETURN_IF_ERROR(impl_->gatherer->EndStep(), "step");
  // Every group takes part in the reductions, in index order, even if it got no gradient.
  for (int gi = 0; gi < num_groups(); ++gi) {
    Group& g = *groups_[static_cast<size_t>(gi)];
    if (g.grad_reduced) continue;
    if (!g.grad_live) RETURN_IF_ERROR(GradBuffer(gi).status());
    RETURN_IF_ERROR(ReduceGroup(gi));
  }
  RETURN_IF_ERROR(impl_->bucketer->Flush(), "step");
  // Whatever happens below, the next step starts from zero gradients (stage 0/1 buffers persist and
  // are zeroed at the next GradBuffer; stage 2/3 ones already went back to the pool).
  for (auto& gp : groups_) {
    gp->grad_reduced = false;
    gp->grad_live = false;
  }

  // Global sum of squares; any inf/NaN on any rank makes it inf (one all-reduce).
  // One multi-tensor pass per gradient dtype (on a GPU: one kernel and one host read each).
  double local = 0;
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    std::vector<kernels::GradRef> refs;
    for (auto& gp : groups_) {
      if (gp->dtype == t) refs.push_back({GradShard(*gp), gp->layout.shard_size()});
    }
    if (refs.empty()) continue;
    ASSIGN_OR_RETURN(kernels::GradStats st, impl_->compute->SumSquares(refs, t), "step");
    local += st.nonfinite ? std::numeric_limits<double>::infinity() : st.sum_squares;
  }
  float global = static_cast<float>(local);
  if (config_.stage != 0) RETURN_IF_ERROR(comm_->AllReduce(&global, &global, 1, DType::kF32, ReduceOp::kSum), "step: norm");

  StepResult r;
  r.loss_scale = scaler_.scale();
  r.lr = groups_.empty() ? config_.adam.lr : groups_[0]->lr;
  if (!std::isfinite(global)) {
    scaler_.Update(true);
    r.skipped = true;
    r.grad_norm = std::numeric_limits<double>::infinity();
    r.step = steps_;
    ZRT_LOG(kInfo) << "step skipped: non-finite gradients (loss scale " << r.loss_scale << " -> " << scaler_.scale() << ")";
    return r;
  }
  const double denom = scaler_.scale() * config_.grad_accum_steps;
  float norm = 0;
  const float mult = kernels::GradMultiplier(global, static_cast<float>(denom), static_cast<float>(config_.max_grad_norm), &norm);
  r.grad_norm = norm;

  std::vector<kernels::AdamStepScalars> scalars;
  for (auto& gp : groups_) {
    kernels::AdamConfig c = config_.adam;
    c.lr = gp->lr;
    c.weight_decay = gp->weight_decay;
    ASSIGN_OR_RETURN(kernels::AdamStepScalars sc, kernels::MakeAdamStepScalars(c, steps_ + 1, mult), "step, group '", gp->name, "'");
    scalars.push_back(sc);
  }
  // Offloaded optimizer on device memory: every group's gradient shard comes down (queued first on the
  // copy thread), and each group's updated parameters go up as soon as the CPU moves on to the next.
  const size_t ng = groups_.size();
  const bool offloaded = config_.offload.optimizer != OffloadTarget::kNone;
  std::vector<std::future<Status>> down(ng), up(ng);
  size_t next_up = 0;
  if (impl_->copier) {
    for (size_t gi = 0; gi < ng; ++gi) down[gi] = impl_->copier->Submit([this, gi] { return GradsDown(*groups_[gi]); });
  }
  auto begin_group = [&](size_t gi) -> Status {  // before updating group gi: groups before it are done
    for (; impl_->copier && next_up < gi; ++next_up) {
      up[next_up] = impl_->copier->Submit([this, k = next_up] { return ParamsUp(*groups_[k]); });
    }
    return gi < ng && down[gi].valid() ? down[gi].get() : Status();
  };
  auto finish = [&](Status st) {  // the last parameters go up; every copy is waited for, even after an error
    if (st.ok()) st = begin_group(ng);
    for (auto* fs : {&down, &up}) {
      for (auto& f : *fs) {
        if (!f.valid()) continue;
        Status c = f.get();
        if (st.ok()) st = std::move(c);
      }
    }
    return st;
  };
  if (impl_->swapper) {
    // NVMe: every sub-group of every group streams through read i+1 | update i | write i-1.
    std::vector<SwapAccess> access(static_cast<size_t>(impl_->num_streams), SwapAccess::kReadWrite);
    if (impl_->param_stream >= 0) access[static_cast<size_t>(impl_->param_stream)] = SwapAccess::kWrite;
    const int vs = impl_->vmax_stream;
    // Every rank learns of a problem on any rank: first before anything changes, then after streaming.
    RETURN_IF_ERROR(AgreeOnStatus(comm_, impl_->swapper->CheckFiles()), "step (nothing was updated)");
    Status st = impl_->swapper->Stream(access, [&](const StateSwapper::Window& w) {
      const auto gi = static_cast<size_t>(w.region);
      Group& g = *groups_[gi];
      if (w.offset == 0) RETURN_IF_ERROR(begin_group(gi));
      auto f = [&](int k) { return k < 0 ? nullptr : static_cast<float*>(w.data[static_cast<size_t>(k)]); };
      return UpdateRange(g, *impl_->host_compute, HostGrads(g), scalars[gi], w.offset, w.count, f(0), f(1), f(2), f(vs),
                         ParamsAt(g, w));
    }, &impl_->swap);
    st = finish(std::move(st));
    RETURN_IF_ERROR(AgreeOnStatus(comm_, st), "step: the offloaded optimizer state may be partly updated; restore from a checkpoint");
  } else {
    Status st;
    for (size_t gi = 0; gi < ng && st.ok(); ++gi) {
      Group& g = *groups_[gi];
      st = begin_group(gi);
      if (st.ok()) {
        st = UpdateRange(g, offloaded ? *impl_->host_compute : *impl_->compute, offloaded ? HostGrads(g) : GradShard(g),
                         scalars[gi], 0, g.layout.shard_size(), g.master.as<float>(), g.exp_avg.as<float>(),
                         g.exp_avg_sq.as<float>(), g.max_exp_avg_sq.as<float>(), HostParams(g));
      }
    }
    RETURN_IF_ERROR(finish(std::move(st)), "step");
  }
  RETURN_IF_ERROR(impl_->compute->MarkUpdated(), "step");  // what a checkpoint snapshot waits for
  RETURN_IF_ERROR(GatherUpdatedParams(), "step");
  scaler_.Update(false);
  r.step = ++steps_;
  return r;
}

Status ZeroEngine::SetLr(int group, double lr) {
  ASSIGN_OR_RETURN(Group * g, Get(group, "set_lr"));
  if (!(lr >= 0) || !std::isfinite(lr)) return InvalidArgumentError("set_lr: lr must be finite and >= 0, got ", lr);
  g->lr = lr;
  return Status();
}

Status ZeroEngine::SetWeightDecay(int group, double wd) {
  ASSIGN_OR_RETURN(Group * g, Get(group, "set_weight_decay"));
  if (!(wd >= 0) || !std::isfinite(wd)) return InvalidArgumentError("set_weight_decay: must be finite and >= 0, got ", wd);
  g->weight_decay = wd;
  return Status();
}

StateView ZeroEngine::state_view() {
  StateView v;
  v.rank = comm_->rank();
  v.world_size = comm_->size();
  v.stage = config_.stage;
  v.step = steps_;
  v.loss_scale = scaler_.scale();
  v.scaler_good_steps = scaler_.state().good_steps;
  v.scaler_hysteresis_left = scaler_.state().hysteresis_left;
  for (auto& gp : groups_) {
    Group& g = *gp;
    StateGroup sg;
    sg.name = g.name;
    sg.tensors = g.tensors;
    sg.layout = g.layout;
    sg.lr = g.lr;
    sg.weight_decay = g.weight_decay;
    const int64_t S = g.layout.shard_size();
    if (impl_->swapper) {  // not resident: reached through the swap files
      const int region = static_cast<int>(v.groups.size());
      for (int k = 0; k < impl_->num_streams; ++k) {
        if (k == impl_->param_stream) continue;
        StateBuffer b{k == 0 ? "master" : k == 1 ? "exp_avg" : k == 2 ? "exp_avg_sq" : "max_exp_avg_sq", DType::kF32, nullptr, S, {}, {}};
        StateSwapper* sw = impl_->swapper.get();
        b.read = [sw, region, k](int64_t off, int64_t cnt, void* out) { return sw->Read(region, k, off, cnt, out); };
        b.write = [sw, region, k](int64_t off, int64_t cnt, const void* in) { return sw->Write(region, k, off, cnt, in); };
        sg.buffers.push_back(std::move(b));
      }
    } else {
      std::vector<std::pair<const char*, DeviceBuffer*>> bufs = {
          {"master", &g.master}, {"exp_avg", &g.exp_avg}, {"exp_avg_sq", &g.exp_avg_sq}};
      if (!g.max_exp_avg_sq.empty()) bufs.emplace_back("max_exp_avg_sq", &g.max_exp_avg_sq);
      for (auto [kind, buf] : bufs) {
        Device* d = buf->device();
        if (d == nullptr || d->host_accessible()) {
          sg.buffers.push_back({kind, DType::kF32, buf->data(), S, {}, {}});
          continue;
        }
        // Device memory: copied to the host on the snapshot stream (a checkpoint) and back (a load).
        auto* base = buf->as<float>();
        StateBuffer sb{kind, DType::kF32, nullptr, S, {}, {}};
        sb.read = [c = impl_->compute.get(), base](int64_t off, int64_t cnt, void* out) {
          return c->CopyToHost(out, base + off, static_cast<size_t>(cnt) * 4);
        };
        sb.write = [d, base](int64_t off, int64_t cnt, const void* in) { return d->Copy(base + off, in, static_cast<size_t>(cnt) * 4); };
        sb.snapshot = true;
        sg.buffers.push_back(std::move(sb));
      }
    }
    v.groups.push_back(std::move(sg));
  }
  return v;
}

Status ZeroEngine::Restore(int64_t step, const LossScaler::State& scaler) {
  if (step < 0) return InvalidArgumentError("restore: negative step ", step);
  steps_ = step;
  scaler_.set_state(scaler);
  return RefreshParamsFromMaster();
}

Status ZeroEngine::RefreshParamsFromMaster() {
  if (!finalized_) return FailedPreconditionError("refresh: the engine is not finalized");
  if (impl_->swapper) {
    RETURN_IF_ERROR(AgreeOnStatus(comm_, StreamParamsFromMaster()), "refresh");
  } else {
    for (auto& gp : groups_) RETURN_IF_ERROR(ParamsFromMaster(*gp));
  }
  return GatherUpdatedParams();
}

MemoryTracker::Snapshot ZeroEngine::memory() const { return device_->memory().Read(); }
MemoryTracker::Snapshot ZeroEngine::host_memory() const { return impl_->host->memory().Read(); }
SwapStats ZeroEngine::swap_stats() const { return impl_->swap; }

CommStats ZeroEngine::comm_stats() const {
  CommStats s = impl_->step_gathers;
  if (impl_->bucketer) {
    s.reduce_bytes += impl_->bucketer->stats().reduce_bytes;
    s.collectives += impl_->bucketer->stats().collectives;
  }
  if (impl_->gatherer) {
    s.gather_bytes += impl_->gatherer->stats().gather_bytes;
    s.collectives += impl_->gatherer->stats().collectives;
  }
  return s;
}

}  // namespace zrt
