// OptimizerStore: the resident store (device or host memory) and the swapped store (NVMe), see
// optimizer_store.h.
//
// Buffers per group (S = shard elements, E = bytes per element of the group's dtype):
//   resident: master, exp_avg, exp_avg_sq[, max_exp_avg_sq]: S x 4 each, in device memory (offload
//             none) or host memory (offload host)
//   swapped:  the same as streams of preallocated swap files (offload/swapper.h), plus the parameter
//             shard as a stream (offload.params = nvme); 3 host buffer sets of one sub-group
//   mirrors:  host_grad S x E and host_params S x E in host memory, when the optimizer is offloaded and
//             the device's memory is not host memory (a GPU); params held in host memory are their own
//             mirror
#include "zrt/runtime/optimizer_store.h"

#include <cstring>
#include <future>
#include <utility>

#include "zrt/core/thread_pool.h"
#include "zrt/offload/swapper.h"

namespace zrt {

// ---- common --------------------------------------------------------------------------------------
OptimizerStore::OptimizerStore(Communicator* comm, Device* device, Compute* compute, HostMemory* host,
                               Compute* host_compute, const Options& o)
    : comm_(comm), device_(device), compute_(compute), host_(host), host_compute_(host_compute), o_(o) {
  mirror_ = o.offload.optimizer != OffloadTarget::kNone && !device->host_accessible();
  if (mirror_) copier_ = std::make_unique<ThreadPool>(1, "zrt-copy");
}

OptimizerStore::~OptimizerStore() = default;

Status OptimizerStore::Defer(std::shared_ptr<StateSink>) {
  return FailedPreconditionError("optimizer store: its state is resident; nothing to defer");
}

const void* OptimizerStore::HostGrads(const Slot& s) const { return s.host_grad.empty() ? s.in.grads : s.host_grad.data(); }

void* OptimizerStore::HostParams(Slot& s) {
  if (!s.host_params.empty()) return s.host_params.data();
  if (!s.param_shard.empty()) return s.param_shard.data();
  return s.in.params;
}

Status OptimizerStore::GradsDown(Slot& s) {
  if (s.host_grad.empty()) return Status();
  return device_->Copy(s.host_grad.data(), s.in.grads, s.host_grad.size())
      .WithContext("copying the gradients of group '" + s.in.name + "' from " + device_->name());
}

Status OptimizerStore::ParamsUp(Slot& s) {
  if (s.host_params.empty()) return Status();
  return device_->Copy(s.in.params, s.host_params.data(), s.host_params.size())
      .WithContext("copying the parameters of group '" + s.in.name + "' to " + device_->name());
}

class OptimizerStore::Copies {
 public:
  explicit Copies(OptimizerStore& s) : s_(s), down_(s.slots_.size()), up_(s.slots_.size()) {
    if (!s_.copier_) return;
    for (size_t g = 0; g < down_.size(); ++g) down_[g] = s_.copier_->Submit([this, g] { return s_.GradsDown(s_.slots_[g]); });
  }
  ~Copies() { (void)Finish(Status()); }
  // Before group g's work: the groups before it are done (their parameters go up); g's gradients are here.
  Status Begin(size_t g) {
    for (; s_.copier_ && next_up_ < g; ++next_up_) {
      up_[next_up_] = s_.copier_->Submit([this, k = next_up_] { return s_.ParamsUp(s_.slots_[k]); });
    }
    return g < down_.size() && down_[g].valid() ? down_[g].get() : Status();
  }
  // The last parameters go up; every copy is waited for, even after an error (the first error wins).
  Status Finish(Status st) {
    if (st.ok()) st = Begin(down_.size());
    for (auto* fs : {&down_, &up_}) {
      for (auto& f : *fs) {
        if (!f.valid()) continue;
        Status c = f.get();
        if (st.ok()) st = std::move(c);
      }
    }
    return st;
  }

 private:
  OptimizerStore& s_;
  std::vector<std::future<Status>> down_, up_;
  size_t next_up_ = 0;
};

Status OptimizerStore::Init(std::vector<Group> groups) {
  auto local = [&]() -> Status {
    for (Group& g : groups) {
      Slot& s = slots_.emplace_back();
      s.in = std::move(g);
      const auto bytes = static_cast<size_t>(s.in.elements) * esize(s);
      const std::string ctx = "allocating the optimizer state of group '" + s.in.name + "'";
      if (holds_params() && o_.offload.params == OffloadTarget::kHost) {
        ASSIGN_OR_RETURN(s.param_shard, host_->Allocate(bytes, MemCategory::kParameters), ctx);
      }
      if (mirror_) {
        ASSIGN_OR_RETURN(s.host_grad, host_->Allocate(static_cast<size_t>(s.in.elements) * DTypeSize(s.in.grad_dtype), MemCategory::kGradients), ctx);
        if (!holds_params()) {
          ASSIGN_OR_RETURN(s.host_params, host_->Allocate(bytes, MemCategory::kParameters), ctx);
        }
      }
    }
    return Allocate();
  };
  // A problem on one rank (no space on its disk, a budget too small) must not leave the others waiting
  // in the engine's next collective.
  return AgreeOnStatus(comm_, local());
}

// ---- resident: device or host memory ---------------------------------------------------------------
namespace {

class ResidentStore final : public OptimizerStore {
 public:
  ResidentStore(Communicator* comm, Device* device, Compute* compute, HostMemory* host, Compute* host_compute,
                const Options& o)
      : OptimizerStore(comm, device, compute, host, host_compute, o) {
    offloaded_ = o.offload.optimizer == OffloadTarget::kHost;
    state_dev_ = offloaded_ ? static_cast<Device*>(host) : device;
    state_compute_ = offloaded_ ? host_compute : compute;
  }

  Status Update(const UpdateFn& fn) override {
    Copies copies(*this);
    Status st;
    for (size_t g = 0; g < slots_.size() && st.ok(); ++g) {
      st = copies.Begin(g);
      if (st.ok()) st = fn(WholeWindow(static_cast<int>(g)));
    }
    return copies.Finish(std::move(st));
  }

  Status RefreshParams() override {
    Status st;
    for (size_t g = 0; g < slots_.size() && st.ok(); ++g) st = RefreshParams(slots_[g]);
    return AgreeOnStatus(comm_, st).WithContext("refreshing the parameters from the master weights");
  }

  std::vector<StateBuffer> StateBuffers(int group) override {
    Slot& s = slots_[static_cast<size_t>(group)];
    std::vector<StateBuffer> out;
    std::vector<std::pair<const char*, DeviceBuffer*>> bufs = {
        {"master", &s.master}, {"exp_avg", &s.exp_avg}, {"exp_avg_sq", &s.exp_avg_sq}};
    if (o_.amsgrad) bufs.emplace_back("max_exp_avg_sq", &s.max_exp_avg_sq);
    for (auto [kind, buf] : bufs) {
      if (state_dev_->host_accessible()) {
        out.push_back({kind, DType::kF32, buf->data(), s.in.elements, {}, {}});
        continue;
      }
      // Device memory: copied to the host on the snapshot stream (a checkpoint) and back (a load).
      // That stream waits only for the last step's update, and the engine's next update waits for
      // the view's holds: any thread may read until then.
      auto* base = buf->as<float>();
      StateBuffer sb{kind, DType::kF32, nullptr, s.in.elements, {}, {}};
      sb.read = [c = compute_, base](int64_t off, int64_t cnt, void* dst) {
        return c->CopyToHost(dst, base + off, static_cast<size_t>(cnt) * 4);
      };
      sb.write = [d = state_dev_, base](int64_t off, int64_t cnt, const void* src) {
        return d->Copy(base + off, src, static_cast<size_t>(cnt) * 4);
      };
      sb.snapshot = true;
      sb.concurrent_read = true;
      out.push_back(std::move(sb));
    }
    return out;
  }

  ParamSource Params(int group) const override {
    const Slot& s = slots_[static_cast<size_t>(group)];
    return {s.param_shard.empty() ? s.in.params : s.param_shard.data(), {}, 0};
  }

 private:
  Status Allocate() override {
    for (Slot& s : slots_) {
      const auto S = static_cast<size_t>(s.in.elements);
      const std::string ctx = "allocating the optimizer state of group '" + s.in.name + "'";
      std::vector<DeviceBuffer*> state = {&s.master, &s.exp_avg, &s.exp_avg_sq};
      if (o_.amsgrad) state.push_back(&s.max_exp_avg_sq);
      for (DeviceBuffer* b : state) {
        ASSIGN_OR_RETURN(*b, state_dev_->Allocate(S * 4, MemCategory::kOptimizerState), ctx);
        RETURN_IF_ERROR(state_dev_->Fill(b->data(), 0, S * 4), ctx);
      }
      // Initial values, through host memory if need be (padding stays zero).
      std::vector<float> staged;
      float* master = s.master.as<float>();
      if (!state_dev_->host_accessible()) {
        staged.assign(S, 0.0f);
        master = staged.data();
      }
      s.in.init(0, s.in.elements, master);
      if (!staged.empty()) RETURN_IF_ERROR(state_dev_->Copy(s.master.data(), staged.data(), S * 4), ctx);
      RETURN_IF_ERROR(RefreshParams(s), ctx);
    }
    return Status();
  }

  Window WholeWindow(int g) {
    Slot& s = slots_[static_cast<size_t>(g)];
    return Window{g, 0, s.in.elements, s.master.as<float>(), s.exp_avg.as<float>(), s.exp_avg_sq.as<float>(),
                  s.max_exp_avg_sq.as<float>(), HostGrads(s), HostParams(s), state_compute_};
  }

  Status RefreshParams(Slot& s) {
    RETURN_IF_ERROR(state_compute_->Cast(s.master.data(), DType::kF32, HostParams(s), s.in.dtype, s.in.elements));
    return ParamsUp(s);
  }

  bool offloaded_ = false;
  Device* state_dev_ = nullptr;
  Compute* state_compute_ = nullptr;
};

// ---- swapped: NVMe -------------------------------------------------------------------------------
class SwappedStore final : public OptimizerStore {
 public:
  SwappedStore(Communicator* comm, Device* device, Compute* compute, HostMemory* host, Compute* host_compute,
               const Options& o, std::unique_ptr<IoEngine> io)
      : OptimizerStore(comm, device, compute, host, host_compute, o), io_(std::move(io)) {}
  ~SwappedStore() override {
    for (const auto& sink : TakeSinks()) sink->Close(FailedPreconditionError("the offloaded optimizer state was destroyed before a save received it"));
  }

  Status Update(const UpdateFn& fn) override {
    std::vector<SwapAccess> access(streams_.size(), SwapAccess::kReadWrite);
    if (params_ >= 0) access[static_cast<size_t>(params_)] = SwapAccess::kWrite;
    // Every rank learns of a problem on any rank: first before anything changes, then after streaming.
    RETURN_IF_ERROR(AgreeOnStatus(comm_, swapper_->CheckFiles()), "step (nothing was updated)");
    Delivery delivery(TakeSinks(), kinds_);
    Copies copies(*this);
    Status st = swapper_->Stream(access, [&](const StateSwapper::Window& w) -> Status {
      if (w.offset == 0) RETURN_IF_ERROR(copies.Begin(static_cast<size_t>(w.region)));
      (void)delivery.Put(w);  // the state as it was, before Adam changes it (a failed save: the step goes on)
      Slot& s = slots_[static_cast<size_t>(w.region)];
      const void* grads = static_cast<const char*>(HostGrads(s)) + static_cast<size_t>(w.offset) * DTypeSize(s.in.grad_dtype);
      return fn(Window{w.region, w.offset, w.count, Data(w, master_), Data(w, exp_avg_), Data(w, exp_avg_sq_),
                       Data(w, max_exp_avg_sq_), grads, ParamsAt(w), host_compute_});
    }, &stats_);
    st = copies.Finish(std::move(st));
    delivery.Close(st);
    return AgreeOnStatus(comm_, st).WithContext("step: the offloaded optimizer state may be partly updated; restore from a checkpoint");
  }

  bool can_defer() const override { return true; }
  Status Defer(std::shared_ptr<StateSink> sink) override {
    if (sink == nullptr) return InvalidArgumentError("optimizer store: null sink");
    std::erase_if(sinks_, [](const std::shared_ptr<StateSink>& s) { return !s->wanted(); });
    sinks_.push_back(std::move(sink));
    return Status();
  }
  // A read-only stream of the state kinds into the registered sinks.
  Status Deliver() override {
    Delivery delivery(TakeSinks(), kinds_);
    if (!delivery.active()) return Status();
    std::vector<SwapAccess> access(streams_.size(), SwapAccess::kNone);
    for (const auto& [kind, k] : kinds_) access[static_cast<size_t>(k)] = SwapAccess::kRead;
    Status st = swapper_->Stream(access, [&](const StateSwapper::Window& w) { return delivery.Put(w); }, &stats_);
    delivery.Close(st);
    return st.WithContext("handing the offloaded optimizer state to a save");
  }

  Status RefreshParams() override {
    std::vector<SwapAccess> access(streams_.size(), SwapAccess::kNone);
    access[static_cast<size_t>(master_)] = SwapAccess::kRead;
    if (params_ >= 0) access[static_cast<size_t>(params_)] = SwapAccess::kWrite;
    Status st = swapper_->Stream(access, [&](const StateSwapper::Window& w) {
      return host_compute_->Cast(Data(w, master_), DType::kF32, ParamsAt(w), slots_[static_cast<size_t>(w.region)].in.dtype, w.count);
    }, &stats_);
    if (st.ok()) st = PushParams();
    return AgreeOnStatus(comm_, st).WithContext("refreshing the parameters from the offloaded master weights");
  }

  std::vector<StateBuffer> StateBuffers(int group) override {
    std::vector<StateBuffer> out;
    for (const auto& [kind, stream] : kinds_) {  // not resident: reached through the swap files
      StateBuffer b{kind, DType::kF32, nullptr, slots_[static_cast<size_t>(group)].in.elements, {}, {}};
      StateSwapper* sw = swapper_.get();
      b.read = [sw, group, k = stream](int64_t off, int64_t cnt, void* dst) { return sw->Read(group, k, off, cnt, dst); };
      b.write = [this, sw, group, k = stream](int64_t off, int64_t cnt, const void* src) {
        (void)Deliver();  // a save waiting for the state gets it as it was (its errors close the save's sink)
        return sw->Write(group, k, off, cnt, src);
      };
      out.push_back(std::move(b));
    }
    return out;
  }

  ParamSource Params(int group) const override {
    const Slot& s = slots_[static_cast<size_t>(group)];
    if (params_ < 0) return {s.param_shard.empty() ? s.in.params : s.param_shard.data(), {}, 0};
    ParamSource p;
    p.load = [sw = swapper_.get(), group, k = params_](void* dst) { return sw->ReadRegionAsync(group, k, dst); };
    p.load_bytes = swapper_->RegionBytes(group, params_);
    return p;
  }

  SwapStats swap_stats() const override { return stats_; }

 private:
  // The streams, each named where it is pushed (the state kinds a checkpoint sees, in order).
  int AddStream(std::vector<SwapStream>& streams, const char* name, bool state) {
    const int k = static_cast<int>(streams.size());
    streams.push_back({name, 4});
    if (state) kinds_.emplace_back(name, k);
    return k;
  }

  Status Allocate() override {
    std::vector<SwapStream> streams;
    master_ = AddStream(streams, "master", true);
    exp_avg_ = AddStream(streams, "exp_avg", true);
    exp_avg_sq_ = AddStream(streams, "exp_avg_sq", true);
    if (o_.amsgrad) max_exp_avg_sq_ = AddStream(streams, "max_exp_avg_sq", true);
    if (o_.offload.params == OffloadTarget::kNvme) params_ = AddStream(streams, "params", false);
    streams_ = streams;
    std::vector<SwapRegion> regions;
    for (const Slot& s : slots_) {
      SwapRegion r{"group '" + s.in.name + "'", s.in.elements, {}};
      if (params_ >= 0) {
        r.element_bytes.assign(streams.size(), 4);
        r.element_bytes[static_cast<size_t>(params_)] = esize(s);
      }
      regions.push_back(std::move(r));
    }
    SwapperOptions so;
    so.dir = o_.offload.nvme_dir;
    so.rank = o_.rank;
    so.world_size = o_.world_size;
    so.sub_group_elements = o_.offload.sub_group_elements;
    ASSIGN_OR_RETURN(swapper_, StateSwapper::Create(so, std::move(regions), std::move(streams), io_.get(), host_));
    // Initial state, streamed: master from init, zero moments, and the parameters cast from master.
    std::vector<SwapAccess> access(streams_.size(), SwapAccess::kWrite);
    RETURN_IF_ERROR(swapper_->Stream(access, [&](const StateSwapper::Window& w) -> Status {
      const Slot& s = slots_[static_cast<size_t>(w.region)];
      for (const auto& [kind, k] : kinds_) std::memset(w.data[static_cast<size_t>(k)], 0, static_cast<size_t>(w.count) * 4);
      float* master = Data(w, master_);
      s.in.init(w.offset, w.count, master);
      return host_compute_->Cast(master, DType::kF32, ParamsAt(w), s.in.dtype, w.count);
    }, &stats_));
    return PushParams();
  }

  static float* Data(const StateSwapper::Window& w, int stream) {
    return stream < 0 ? nullptr : static_cast<float*>(w.data[static_cast<size_t>(stream)]);
  }

  // Where a window's updated parameters go: the params stream, or the host-side parameters.
  void* ParamsAt(const StateSwapper::Window& w) {
    if (params_ >= 0) return w.data[static_cast<size_t>(params_)];
    Slot& s = slots_[static_cast<size_t>(w.region)];
    return static_cast<char*>(HostParams(s)) + static_cast<size_t>(w.offset) * esize(s);
  }

  Status PushParams() {
    for (Slot& s : slots_) RETURN_IF_ERROR(ParamsUp(s));
    return Status();
  }

  // One delivery of the state kinds to the sinks, window by window; a sink's first failed Put ends
  // its delivery (the others go on). Put fails once every sink failed.
  class Delivery {
   public:
    Delivery(std::vector<std::shared_ptr<StateSink>> sinks, const std::vector<std::pair<std::string, int>>& kinds) : kinds_(kinds) {
      for (auto& s : sinks) sinks_.push_back({std::move(s), Status()});
    }
    ~Delivery() { Close(InternalError("optimizer store: the delivery to a save ended early")); }
    bool active() const { return !sinks_.empty(); }
    Status Put(const StateSwapper::Window& w) {
      bool any = false;
      for (auto& [sink, status] : sinks_) {
        for (size_t b = 0; b < kinds_.size() && status.ok(); ++b) {
          status = sink->Put(w.region, static_cast<int>(b), w.offset, w.count, Data(w, kinds_[b].second));
        }
        any = any || status.ok();
      }
      return any || sinks_.empty() ? Status() : sinks_.front().second;
    }
    void Close(const Status& st) {
      for (auto& [sink, status] : sinks_) sink->Close(status.ok() ? st : status);
      sinks_.clear();
    }

   private:
    std::vector<std::pair<std::shared_ptr<StateSink>, Status>> sinks_;
    const std::vector<std::pair<std::string, int>>& kinds_;
  };
  std::vector<std::shared_ptr<StateSink>> TakeSinks() {
    std::vector<std::shared_ptr<StateSink>> out;
    for (auto& s : sinks_) {
      if (s->wanted()) out.push_back(std::move(s));
    }
    sinks_.clear();
    return out;
  }

  std::unique_ptr<IoEngine> io_;
  std::unique_ptr<StateSwapper> swapper_;  // after io_: destroyed before the engine it uses
  std::vector<std::shared_ptr<StateSink>> sinks_;  // saves' (disk, memory tier), waiting for the next Update
  std::vector<SwapStream> streams_;
  std::vector<std::pair<std::string, int>> kinds_;  // state kind -> stream
  int master_ = -1, exp_avg_ = -1, exp_avg_sq_ = -1, max_exp_avg_sq_ = -1, params_ = -1;
  SwapStats stats_;
};

}  // namespace

Result<std::unique_ptr<OptimizerStore>> OptimizerStore::Create(Communicator* comm, Device* device, Compute* compute,
                                                               HostMemory* host, Compute* host_compute, const Options& o) {
  if (comm == nullptr || device == nullptr || compute == nullptr || host == nullptr || host_compute == nullptr) {
    return InvalidArgumentError("optimizer store: null argument");
  }
  if (o.offload.optimizer != OffloadTarget::kNvme) {
    return std::unique_ptr<OptimizerStore>(new ResidentStore(comm, device, compute, host, host_compute, o));
  }
  ASSIGN_OR_RETURN(auto io, IoEngine::Create(o.offload.io), "offload I/O");
  return std::unique_ptr<OptimizerStore>(new SwappedStore(comm, device, compute, host, host_compute, o, std::move(io)));
}

}  // namespace zrt
