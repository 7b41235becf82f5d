// The swapped placement of the optimizer store (store_placements.h): the state as streams of swap
// files on NVMe (offload/swapper.h), compact moments as kept with their q8/q4 scales in streams of their
// own, streamed through host memory sub-group by sub-group by each step, a load's partial q8/q4 blocks
// held until they are whole.
#include "zrt/runtime/store_placements.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <tuple>
#include <utility>

#include "zrt/offload/swapper.h"
#include "zrt/runtime/capture.h"

namespace zrt::internal {

namespace {

class SwappedStore final : public OptimizerStore {
 public:
  SwappedStore(Communicator* comm, Device* device, Compute* compute, HostMemory* host, Compute* host_compute,
               const Options& o, std::unique_ptr<IoEngine> io)
      : OptimizerStore(comm, device, compute, host, host_compute, o), io_(std::move(io)) {}
  ~SwappedStore() override {
    for (auto& job : std::exchange(deferred_, {})) job->Done(FailedPreconditionError("the offloaded optimizer state was destroyed before a save received it"));
  }

  Status Update(const UpdateFn& fn) override {
    RETURN_IF_ERROR(FlushPending(), "step (nothing was updated)");
    std::vector<SwapAccess> access(streams_.size(), SwapAccess::kReadWrite);
    if (params_ >= 0 && !no_master_) access[static_cast<size_t>(params_)] = SwapAccess::kWrite;  // else the parameters are state
    // Every rank learns of a problem on any rank: first before anything changes, then after streaming.
    RETURN_IF_ERROR(AgreeOnStatus(comm_, swapper_->CheckFiles()), "step (nothing was updated)");
    Delivery delivery(std::exchange(deferred_, {}), *this);
    Copies copies(*this);
    Status st = swapper_->Stream(access, [&](const StateSwapper::Window& w) -> Status {
      const int g = region_slot_[static_cast<size_t>(w.region)];
      if (w.offset == 0) RETURN_IF_ERROR(copies.Begin(static_cast<size_t>(g)));
      delivery.Put(w);  // the state as it was, before Adam changes it (a failed save: the step goes on)
      Slot& s = slots_[static_cast<size_t>(g)];
      const void* grads = static_cast<const char*>(HostGrads(s)) + static_cast<size_t>(w.offset) * DTypeSize(s.in.grad_dtype);
      if (s.compact()) {  // the window's moments as stored, their scales from its first block (windows are whole blocks)
        const CompactWindow cw{s.in.format, w.data[static_cast<size_t>(exp_avg_)], w.data[static_cast<size_t>(exp_avg_sq_)],
                               Data(w, exp_avg_scale_), Data(w, exp_avg_sq_scale_), s.in.index + w.offset};
        return fn(Window{g, w.offset, w.count, Data(w, master_), nullptr, nullptr, nullptr, grads, ParamsAt(w), host_compute_, &cw});
      }
      return fn(Window{g, w.offset, w.count, Data(w, master_), Data(w, exp_avg_), Data(w, exp_avg_sq_),
                       Data(w, max_exp_avg_sq_), grads, ParamsAt(w), host_compute_});
    }, &stats_);
    st = copies.Finish(std::move(st));
    delivery.Close(st);
    return AgreeOnStatus(comm_, st).WithContext("step: the offloaded optimizer state may be partly updated; restore from a checkpoint");
  }

  Status RefreshParams() override {
    Status st = FlushPending();
    std::vector<SwapAccess> access(streams_.size(), SwapAccess::kNone);
    access[static_cast<size_t>(master_)] = SwapAccess::kRead;
    if (params_ >= 0) access[static_cast<size_t>(params_)] = no_master_ ? SwapAccess::kReadWrite : SwapAccess::kWrite;
    if (st.ok()) st = swapper_->Stream(access, [&](const StateSwapper::Window& w) {
      const Slot& s = slots_[static_cast<size_t>(region_slot_[static_cast<size_t>(w.region)])];
      if (Data(w, master_) == nullptr) return Status();  // no master: the parameters are the state
      return host_compute_->Cast(Data(w, master_), DType::kF32, ParamsAt(w), s.in.dtype, w.count);
    }, &stats_);
    if (st.ok()) st = PushParams();
    return AgreeOnStatus(comm_, st).WithContext("refreshing the parameters from the offloaded master weights");
  }

  ParamSource Params(int group) const override {
    const Slot& s = slots_[static_cast<size_t>(group)];
    if (params_ < 0 || s.in.frozen) return {s.param_shard.empty() ? s.in.params : s.param_shard.data(), {}, 0};
    ParamSource p;
    p.load = [sw = swapper_.get(), r = slot_region_[static_cast<size_t>(group)], k = params_](void* dst) { return sw->ReadRegionAsync(r, k, dst); };
    p.load_bytes = swapper_->RegionBytes(slot_region_[static_cast<size_t>(group)], params_);
    return p;
  }

  SwapStats swap_stats() const override { return stats_; }

 private:
  float* HostState(Slot&, int) override { return nullptr; }
  std::function<Result<const float*>(int, int64_t, int64_t, float*)> CaptureRead(Slot&) override { return {}; }
  // Captures wait for the next Update (or Deliver), which streams the state through host memory anyway.
  void Defer(std::shared_ptr<internal::CaptureJob> job) override { deferred_.push_back(std::move(job)); }
  // A read-only stream of the state kinds into the captures waiting for it.
  Status Deliver() override {
    if (deferred_.empty()) return Status();
    Delivery delivery(std::exchange(deferred_, {}), *this);
    Status st = FlushPending();
    std::vector<SwapAccess> access(streams_.size(), SwapAccess::kNone);
    for (int k : kinds_) access[static_cast<size_t>(k)] = SwapAccess::kRead;
    for (int k : {exp_avg_scale_, exp_avg_sq_scale_}) {
      if (k >= 0) access[static_cast<size_t>(k)] = SwapAccess::kRead;
    }
    if (params_ >= 0 && no_master_) access[static_cast<size_t>(params_)] = SwapAccess::kRead;
    if (st.ok()) st = swapper_->Stream(access, [&](const StateSwapper::Window& w) {
      delivery.Put(w);
      return Status();
    }, &stats_);
    delivery.Close(st);
    return st.WithContext("handing the offloaded optimizer state to a save");
  }
  Status ReadState(int g, int kind, int64_t offset, int64_t n, float* out) override {
    Slot& s = slots_[static_cast<size_t>(g)];
    if (!KindFormat(s, kind).compact()) {
      return swapper_->Read(slot_region_[static_cast<size_t>(g)], kinds_[static_cast<size_t>(kind)], offset, n, out);
    }
    RETURN_IF_ERROR(FlushPending());
    const auto [lo, hi] = Blocks(s, kind, offset, n);
    std::vector<float> v(static_cast<size_t>(hi - lo));
    RETURN_IF_ERROR(ReadDecoded(g, kind, lo, hi - lo, v.data()));
    std::memcpy(out, v.data() + (offset - lo), static_cast<size_t>(n) * 4);
    return Status();
  }
  // Compact kinds: bf16 values (and the parameters without a master) element by element; q8 and q4
  // whole blocks encoded at once, a block written in part kept as f32 values until the next step,
  // RefreshParams or read (FlushPending), so it is encoded once with all its values.
  Status WriteState(int g, int kind, int64_t offset, int64_t n, const float* in) override {
    Slot& s = slots_[static_cast<size_t>(g)];
    const int region = slot_region_[static_cast<size_t>(g)];
    if (!KindFormat(s, kind).compact()) return swapper_->Write(region, kinds_[static_cast<size_t>(kind)], offset, n, in);
    if (!KindFormat(s, kind).blockwise()) return WriteEncoded(g, kind, offset, n, in);
    const int64_t block = s.in.format.block;
    int64_t at = offset;
    while (at < offset + n) {
      const int64_t b = at / block * block, end = std::min(b + block, offset + n);
      if (at == b && end == b + block && !pending_.contains({g, kind, b})) {  // whole blocks: straight through
        const int64_t whole = (offset + n - at) / block * block;
        RETURN_IF_ERROR(WriteEncoded(g, kind, at, whole, in + (at - offset)));
        at += whole;
        continue;
      }
      auto [it, fresh] = pending_.try_emplace({g, kind, b});
      if (fresh) {
        it->second.resize(static_cast<size_t>(block));
        RETURN_IF_ERROR(ReadDecoded(g, kind, b, block, it->second.data()));
      }
      std::memcpy(it->second.data() + (at - b), in + (at - offset), static_cast<size_t>(end - at) * 4);
      at = end;
    }
    return Status();
  }
  // The q8 or q4 blocks (or bf16 elements) holding [offset, offset + n).
  std::pair<int64_t, int64_t> Blocks(const Slot& s, int kind, int64_t offset, int64_t n) const {
    const StateFormat f = KindFormat(s, kind);
    const int64_t unit = f.blockwise() ? f.block : 1;
    return {offset / unit * unit, (offset + n + unit - 1) / unit * unit};
  }
  // Bytes of `count` elements (whole blocks for scales) of `stream` in slot s's region.
  size_t StreamBytes(const Slot& s, int stream, int64_t count) const {
    if (stream == exp_avg_scale_ || stream == exp_avg_sq_scale_) return static_cast<size_t>(count / s.in.format.block * 4);
    if (stream == params_) return static_cast<size_t>(count) * esize(s);
    const int kind = stream == master_ ? 0 : stream == exp_avg_ ? 1 : stream == exp_avg_sq_ ? 2 : 3;
    return static_cast<size_t>(KindFormat(s, kind).ValuesBytes(count));
  }
  // The stream a compact kind's stored form is in, and its scales' (-1 unless q8 or q4).
  std::pair<int, int> StoredStreams(const Slot& s, int kind) const {
    if (kind == 0) return {params_, -1};
    return {kinds_[static_cast<size_t>(kind)], KindFormat(s, kind).blockwise() ? (kind == 1 ? exp_avg_scale_ : exp_avg_sq_scale_) : -1};
  }
  // Elements [offset, offset + n) of a compact kind (whole blocks for q8) from the swap files (kind 0
  // without a master: the parameters, on NVMe or in host memory).
  Status ReadDecoded(int g, int kind, int64_t offset, int64_t n, float* out) {
    Slot& s = slots_[static_cast<size_t>(g)];
    const int region = slot_region_[static_cast<size_t>(g)];
    const auto [stream, scale_stream] = StoredStreams(s, kind);
    std::vector<char> raw(static_cast<size_t>(KindFormat(s, kind).ValuesBytes(n)));
    if (stream >= 0) {
      RETURN_IF_ERROR(swapper_->Read(region, stream, offset, n, raw.data()));
    } else {
      std::memcpy(raw.data(), static_cast<const char*>(HostParams(s)) + static_cast<size_t>(offset) * esize(s), raw.size());
    }
    std::vector<float> scales(static_cast<size_t>(KindFormat(s, kind).Scales(n)));
    if (scale_stream >= 0) RETURN_IF_ERROR(swapper_->Read(region, scale_stream, offset, n, scales.data()));
    return DecodeKind(s, kind, raw.data(), scales.data(), offset, n, out);
  }
  Status WriteEncoded(int g, int kind, int64_t offset, int64_t n, const float* in) {
    Slot& s = slots_[static_cast<size_t>(g)];
    std::vector<char> raw(static_cast<size_t>(KindFormat(s, kind).ValuesBytes(n)));
    std::vector<float> scales(static_cast<size_t>(KindFormat(s, kind).Scales(n)));
    RETURN_IF_ERROR(EncodeKind(s, kind, in, n, raw.data(), scales.data()));
    return WriteRaw(g, kind, offset, n, raw.data(), scales.data());
  }
  // A compact kind's stored form into its streams (kind 0 without a master: the parameters).
  Status WriteRaw(int g, int kind, int64_t offset, int64_t n, const void* raw, const float* scales) {
    Slot& s = slots_[static_cast<size_t>(g)];
    const int region = slot_region_[static_cast<size_t>(g)];
    const auto [stream, scale_stream] = StoredStreams(s, kind);
    if (scale_stream >= 0) RETURN_IF_ERROR(swapper_->Write(region, scale_stream, offset, n, scales));
    if (stream >= 0) return swapper_->Write(region, stream, offset, n, raw);
    std::memcpy(static_cast<char*>(HostParams(s)) + static_cast<size_t>(offset) * esize(s), raw, static_cast<size_t>(n) * esize(s));
    return Status();  // RefreshParams, which follows a load, brings them to the device
  }
  // As stored: straight into the streams (q8 blocks a load wrote in part are encoded first, so the
  // later write wins).
  Status WriteStoredState(int g, int kind, int64_t offset, int64_t n, const void* values, const float* scales) override {
    RETURN_IF_ERROR(FlushPending());
    return WriteRaw(g, kind, offset, n, values, scales);
  }
  // The q8 blocks a load wrote in part, encoded now (each with every value it was given).
  Status FlushPending() {
    for (auto it = pending_.begin(); it != pending_.end(); it = pending_.erase(it)) {
      const auto& [g, kind, b] = it->first;
      RETURN_IF_ERROR(WriteEncoded(g, kind, b, static_cast<int64_t>(it->second.size()), it->second.data()));
    }
    return Status();
  }

  // The streams, each named where it is pushed (the state kinds a checkpoint sees, in order).
  int AddStream(std::vector<SwapStream>& streams, const char* name, bool state) {
    const int k = static_cast<int>(streams.size());
    streams.push_back({name, 4});
    if (state) kinds_.push_back(k);
    return k;
  }

  Status Allocate() override {
    std::vector<SwapStream> streams;
    master_ = AddStream(streams, "master", true);
    exp_avg_ = AddStream(streams, "exp_avg", true);
    exp_avg_sq_ = AddStream(streams, "exp_avg_sq", true);
    if (o_.amsgrad) max_exp_avg_sq_ = AddStream(streams, "max_exp_avg_sq", true);
    if (o_.offload.params == OffloadTarget::kNvme) params_ = AddStream(streams, "params", false);
    bool blocks = false;
    for (const Slot& s : slots_) {
      blocks = blocks || KindFormat(s, 1).blockwise() || KindFormat(s, 2).blockwise();
      no_master_ = no_master_ || (s.compact() && !s.in.format.master);
    }
    if (blocks) {  // one f32 scale per q8 or q4 block
      exp_avg_scale_ = AddStream(streams, "exp_avg_scale", false);
      exp_avg_sq_scale_ = AddStream(streams, "exp_avg_sq_scale", false);
    }
    streams_ = streams;
    std::vector<SwapRegion> regions;
    slot_region_.assign(slots_.size(), -1);
    for (size_t g = 0; g < slots_.size(); ++g) {  // frozen slots take no step: no swap files
      const Slot& s = slots_[g];
      if (s.in.frozen) continue;
      SwapRegion r{"group '" + s.in.name + "'", s.in.elements, std::vector<size_t>(streams.size(), 4), {}};
      if (params_ >= 0) r.element_bytes[static_cast<size_t>(params_)] = esize(s);
      r.elements_per.assign(streams.size(), 1);
      if (s.compact()) {  // the moments as kept (q4: a byte per two); no master stream without one
        r.element_bytes[static_cast<size_t>(master_)] = s.in.format.master ? 4 : 0;
        for (auto [stream, kind] : {std::pair{exp_avg_, 1}, std::pair{exp_avg_sq_, 2}}) {
          const StateFormat f = KindFormat(s, kind);
          r.element_bytes[static_cast<size_t>(stream)] = static_cast<size_t>(f.value_bytes());
          r.elements_per[static_cast<size_t>(stream)] = f.value_bytes() * 8 / ValueBits(f.precision);
        }
      }
      if (blocks) {  // scales for q8 and q4 moments
        for (auto [stream, kind] : {std::pair{exp_avg_scale_, 1}, std::pair{exp_avg_sq_scale_, 2}}) {
          const bool has = KindFormat(s, kind).blockwise();
          r.element_bytes[static_cast<size_t>(stream)] = has ? 4 : 0;
          r.elements_per[static_cast<size_t>(stream)] = has ? s.in.format.block : 1;
        }
      }
      slot_region_[g] = static_cast<int>(regions.size());
      region_slot_.push_back(static_cast<int>(g));
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
    std::vector<float> values;
    RETURN_IF_ERROR(swapper_->Stream(access, [&](const StateSwapper::Window& w) -> Status {
      const Slot& s = slots_[static_cast<size_t>(region_slot_[static_cast<size_t>(w.region)])];
      for (size_t k = 0; k < streams_.size(); ++k) {
        if (w.data[k] != nullptr && static_cast<int>(k) != params_) std::memset(w.data[k], 0, StreamBytes(s, static_cast<int>(k), w.count));
      }
      float* master = Data(w, master_);
      if (master == nullptr) values.resize(static_cast<size_t>(w.count));  // no master: straight into the parameters
      s.in.init(w.offset, w.count, master != nullptr ? master : values.data());
      return host_compute_->Cast(master != nullptr ? master : values.data(), DType::kF32, ParamsAt(w), s.in.dtype, w.count);
    }, &stats_));
    return PushParams();
  }

  static float* Data(const StateSwapper::Window& w, int stream) {
    return stream < 0 ? nullptr : static_cast<float*>(w.data[static_cast<size_t>(stream)]);
  }

  // Where a window's updated parameters go: the params stream, or the host-side parameters.
  void* ParamsAt(const StateSwapper::Window& w) {
    if (params_ >= 0) return w.data[static_cast<size_t>(params_)];
    Slot& s = slots_[static_cast<size_t>(region_slot_[static_cast<size_t>(w.region)])];
    return static_cast<char*>(HostParams(s)) + static_cast<size_t>(w.offset) * esize(s);
  }

  Status PushParams() {
    for (Slot& s : slots_) {
      if (!s.in.frozen) RETURN_IF_ERROR(ParamsUp(s));
    }
    return Status();
  }

  // One delivery of the state kinds to the captures waiting for it, window by window; a capture's
  // first failed Put ends its part (the others go on).
  class Delivery {
   public:
    Delivery(std::vector<std::shared_ptr<internal::CaptureJob>> jobs, SwappedStore& store) : jobs_(std::move(jobs)), store_(store) {}
    ~Delivery() { Close(InternalError("optimizer store: the delivery to a save ended early")); }
    void Put(const StateSwapper::Window& w) {
      const int g = store_.region_slot_[static_cast<size_t>(w.region)];
      const Slot& s = store_.slots_[static_cast<size_t>(g)];
      for (size_t k = 0; k < store_.kinds_.size(); ++k) {
        const float* values = Data(w, store_.kinds_[k]);
        if (s.compact() && store_.KindFormat(s, static_cast<int>(k)).compact()) {
          const auto [stream, scales] = store_.StoredStreams(s, static_cast<int>(k));
          const void* raw = stream >= 0 ? w.data[static_cast<size_t>(stream)]
                                        : static_cast<const char*>(store_.HostParams(store_.slots_[static_cast<size_t>(g)])) +
                                              static_cast<size_t>(w.offset) * store_.esize(s);
          if (store_.TakesStored(s, static_cast<int>(k))) {  // as kept (windows are whole blocks): nothing decoded
            const StateFormat format = store_.KindFormat(s, static_cast<int>(k));
            for (auto& job : jobs_) {
              if (!job->failed()) (void)job->PutStored(g, static_cast<int>(k), w.offset, w.count, format, raw, Data(w, scales));
            }
            continue;
          }
          decoded_.resize(static_cast<size_t>(w.count));  // the f32 values of the compact form
          const Status st = store_.DecodeKind(s, static_cast<int>(k), raw, Data(w, scales), w.offset, w.count, decoded_.data());
          if (!st.ok()) {
            for (auto& job : jobs_) job->Done(st);
            jobs_.clear();
            return;
          }
          values = decoded_.data();
        }
        for (auto& job : jobs_) {
          if (!job->failed()) (void)job->Put(g, static_cast<int>(k), w.offset, w.count, values);
        }
      }
    }
    void Close(const Status& st) {
      for (auto& job : jobs_) job->Done(st);
      jobs_.clear();
    }

   private:
    std::vector<std::shared_ptr<internal::CaptureJob>> jobs_;
    SwappedStore& store_;
    std::vector<float> decoded_;
  };

  std::unique_ptr<IoEngine> io_;
  std::unique_ptr<StateSwapper> swapper_;  // after io_: destroyed before the engine it uses
  std::vector<std::shared_ptr<internal::CaptureJob>> deferred_;  // captures waiting for the next Update
  std::vector<SwapStream> streams_;
  std::vector<int> kinds_;        // state kind -> stream
  std::vector<int> slot_region_;  // -1 for frozen slots
  std::vector<int> region_slot_;
  int master_ = -1, exp_avg_ = -1, exp_avg_sq_ = -1, max_exp_avg_sq_ = -1, params_ = -1;
  int exp_avg_scale_ = -1, exp_avg_sq_scale_ = -1;  // with q8 or q4 moments
  bool no_master_ = false;                           // a group keeps no master: its parameters are state
  // q8 or q4 blocks a load wrote in part: (group, kind, first element) -> the block's f32 values.
  std::map<std::tuple<int, int, int64_t>, std::vector<float>> pending_;
  SwapStats stats_;
};

}  // namespace

std::unique_ptr<OptimizerStore> MakeSwappedStore(Communicator* comm, Device* device, Compute* compute, HostMemory* host, Compute* host_compute,
                                                 const OptimizerStore::Options& o, std::unique_ptr<IoEngine> io) {
  return std::make_unique<SwappedStore>(comm, device, compute, host, host_compute, o, std::move(io));
}

}  // namespace zrt::internal
