// The resident placement of the optimizer store (store_placements.h): the state in device memory
// (offload none) or host memory (offload host); compact state with its q8/q4 scales, and the f32 values a
// load writes into a compact moment, staged until the next refresh or step encodes them whole.
#include "zrt/runtime/store_placements.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "zrt/kernels/cast.h"
#include "zrt/runtime/capture.h"

namespace zrt::internal {

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

  // Whole shards, or windows of the capture's part while a capture still reads the state.
  Status Update(const UpdateFn& fn) override {
    for (Slot& s : slots_) RETURN_IF_ERROR(FlushStaged(s), "step");
    Copies copies(*this);
    Status st;
    const bool windows = capturing();
    for (size_t g = 0; g < slots_.size() && st.ok(); ++g) {
      Slot& s = slots_[g];
      if (s.in.frozen) continue;
      st = copies.Begin(g);
      const int64_t step = windows ? capture_part() : std::max<int64_t>(s.in.elements, 1);
      for (int64_t off = 0; off < s.in.elements && st.ok(); off += step) {
        const int64_t n = std::min(step, s.in.elements - off);
        WaitForCaptures(static_cast<int>(g), off + n);
        CompactWindow cw{};
        st = fn(WindowAt(static_cast<int>(g), off, n, &cw));
      }
    }
    return copies.Finish(std::move(st));
  }

  Status RefreshParams() override {
    Status st;
    for (size_t g = 0; g < slots_.size() && st.ok(); ++g) {
      if (!slots_[g].in.frozen) st = FlushStaged(slots_[g]);
      if (st.ok() && !slots_[g].in.frozen) st = RefreshParams(slots_[g]);
    }
    return AgreeOnStatus(comm_, st).WithContext("refreshing the parameters from the master weights");
  }

  ParamSource Params(int group) const override {
    const Slot& s = slots_[static_cast<size_t>(group)];
    return {s.param_shard.empty() ? s.in.params : s.param_shard.data(), {}, 0};
  }

 private:
  DeviceBuffer& Buffer(Slot& s, int kind) {
    DeviceBuffer* b[] = {&s.master, &s.exp_avg, &s.exp_avg_sq, &s.max_exp_avg_sq};
    return *b[kind];
  }
  // A state kind's memory: an f32 group's master is its parameters where Adam writes them.
  float* State(Slot& s, int kind) { return kind == 0 && s.master_is_params ? static_cast<float*>(HostParams(s)) : Buffer(s, kind).as<float>(); }
  // Where a kind is f32 values in host memory (else null: device memory, or compact state).
  float* HostState(Slot& s, int kind) override {
    return state_dev_->host_accessible() && !KindFormat(s, kind).compact() ? State(s, kind) : nullptr;
  }

  // Compact kinds in host memory stream as kept (codes, scales, bf16 values), where the store keeps
  // them: a sink that stores the form takes them as they are. Staged values (a load's, not encoded
  // yet) and f32 kinds go as values.
  std::function<Result<std::optional<StoredPart>>(int, int64_t, int64_t)> CaptureStored(Slot& s) override {
    if (!s.compact() || !state_dev_->host_accessible()) return {};
    return [this, &s](int k, int64_t off, int64_t) -> Result<std::optional<StoredPart>> {
      if (!TakesStored(s, k) || (k > 0 && !s.staged[k].empty())) return std::nullopt;
      StoredPart st{KindFormat(s, k)};
      st.values = static_cast<char*>(KindMemory(s, k)) + st.format.ValuesBytes(off);
      if (st.format.blockwise()) st.scales = (k == 1 ? s.exp_avg_scale : s.exp_avg_sq_scale).as<float>() + off / st.format.block;
      return std::optional<StoredPart>(st);
    };
  }
  // Host memory is read where it is. Device memory is copied to the host on the snapshot stream, which
  // waits only for the last step's update; the next update waits for the capture (WaitForCaptures).
  std::function<Result<const float*>(int, int64_t, int64_t, float*)> CaptureRead(Slot& s) override {
    if (s.compact()) {
      return [this, &s](int k, int64_t off, int64_t n, float* bounce) -> Result<const float*> {
        RETURN_IF_ERROR(Decode(s, k, off, n, bounce, true), "capturing group '", s.in.name, "'");
        return bounce;
      };
    }
    if (state_dev_->host_accessible()) {
      return [this, &s](int k, int64_t off, int64_t, float*) -> Result<const float*> { return State(s, k) + off; };
    }
    return [this, &s](int k, int64_t off, int64_t n, float* bounce) -> Result<const float*> {
      RETURN_IF_ERROR(compute_->CopyToHost(bounce, State(s, k) + off, static_cast<size_t>(n) * 4),
                      "capturing group '", s.in.name, "'");
      return bounce;
    };
  }

  Status ReadState(int g, int kind, int64_t offset, int64_t n, float* out) override {
    Slot& s = slots_[static_cast<size_t>(g)];
    if (s.compact()) return Decode(s, kind, offset, n, out, false);
    return state_dev_->Copy(out, State(s, kind) + offset, static_cast<size_t>(n) * 4);
  }
  Status WriteState(int g, int kind, int64_t offset, int64_t n, const float* in) override {
    Slot& s = slots_[static_cast<size_t>(g)];
    if (!s.compact() || (kind == 0 && s.in.format.master)) {
      return state_dev_->Copy(State(s, kind) + offset, in, static_cast<size_t>(n) * 4);
    }
    if (kind == 0) return WriteParams(s, offset, n, in);  // no master: the parameters, rounded to nearest
    std::vector<float>& staged = s.staged[kind];
    if (staged.empty()) {  // what is not written keeps its value (padding): decoded before staging starts
      std::vector<float> values(static_cast<size_t>(s.in.elements));
      RETURN_IF_ERROR(Decode(s, kind, 0, s.in.elements, values.data(), false));
      staged = std::move(values);
    }
    std::memcpy(staged.data() + offset, in, static_cast<size_t>(n) * 4);
    return Status();
  }
  // As stored: the codes (values) and scales copied into place; f32 values a load staged before are
  // encoded first, so the later write wins.
  Status WriteStoredState(int g, int kind, int64_t offset, int64_t n, const void* values, const float* scales) override {
    Slot& s = slots_[static_cast<size_t>(g)];
    if (kind > 0 && !s.staged[kind].empty()) RETURN_IF_ERROR(FlushStaged(s));
    const StateFormat f = KindFormat(s, kind);
    RETURN_IF_ERROR(state_dev_->Copy(static_cast<char*>(KindMemory(s, kind)) + f.ValuesBytes(offset), values, static_cast<size_t>(f.ValuesBytes(n))));
    if (f.Scales(n) == 0) return Status();
    return state_dev_->Copy(Scales(s, kind) + offset / f.block, scales, static_cast<size_t>(f.Scales(n)) * 4);
  }

  // ---- compact state as f32 values (a checkpoint's view) ----
  void* KindMemory(Slot& s, int kind) { return kind == 0 && !s.in.format.master ? HostParams(s) : static_cast<void*>(State(s, kind)); }
  float* Scales(Slot& s, int kind) { return (kind == 1 ? s.exp_avg_scale : s.exp_avg_sq_scale).as<float>(); }  // a q8 or q4 moment's
  // Host <- the store's memory (on the capture thread: the snapshot stream, which waits for the step).
  Status Fetch(void* dst, const void* src, size_t bytes, bool capture) {
    if (state_dev_->host_accessible()) {
      std::memcpy(dst, src, bytes);
      return Status();
    }
    return capture ? compute_->CopyToHost(dst, src, bytes) : state_dev_->Copy(dst, src, bytes);
  }
  // Elements [off, off + n) of kind k as f32: decoded from bf16, or q8 or q4 codes and their blocks'
  // scales (from the byte holding element off's value).
  Status Decode(Slot& s, int k, int64_t off, int64_t n, float* out, bool capture) {
    if (n == 0) return Status();
    if (!s.staged[k].empty()) {
      std::memcpy(out, s.staged[k].data() + off, static_cast<size_t>(n) * 4);
      return Status();
    }
    const StateFormat f = KindFormat(s, k);
    const int64_t at = off * ValueBits(f.precision) / 8;
    const char* src = static_cast<const char*>(KindMemory(s, k)) + at;
    if (!f.compact()) return Fetch(out, src, static_cast<size_t>(n) * 4, capture);
    const bool q8 = f.blockwise();
    const int64_t q0 = q8 ? off / f.block : 0, blocks = q8 ? (off + n - 1) / f.block + 1 - q0 : 0;  // the blocks holding them
    const float* scales = q8 ? Scales(s, k) + q0 : nullptr;
    if (state_dev_->host_accessible()) return DecodeKind(s, k, src, scales, off, n, out);  // read where it is
    std::vector<uint8_t> raw(static_cast<size_t>(f.ValuesBytes(off + n) - at));
    std::vector<float> host_scales(static_cast<size_t>(blocks));
    RETURN_IF_ERROR(Fetch(raw.data(), src, raw.size(), capture));
    if (q8) RETURN_IF_ERROR(Fetch(host_scales.data(), scales, host_scales.size() * 4, capture));
    return DecodeKind(s, k, raw.data(), host_scales.data(), off, n, out);
  }
  // Without a master the parameters are the state: f32 values rounded to nearest even.
  Status WriteParams(Slot& s, int64_t off, int64_t n, const float* in) {
    std::vector<uint8_t> raw(static_cast<size_t>(n) * esize(s));
    RETURN_IF_ERROR(kernels::CastCpu(in, DType::kF32, raw.data(), s.in.dtype, n));
    return state_dev_->Copy(static_cast<char*>(HostParams(s)) + static_cast<size_t>(off) * esize(s), raw.data(), raw.size());
  }
  // The moments a load wrote, encoded whole: bf16 rounded to nearest even, q8 and q4 block by block (the
  // scale the block's largest magnitude). A block decoded from this format encodes back to itself.
  Status FlushStaged(Slot& s) {
    if (s.staged[1].empty() && s.staged[2].empty()) return Status();
    RETURN_IF_ERROR(Settle());  // no capture reads the staged values while they go
    for (int k = 1; k <= 2; ++k) {
      std::vector<float>& v = s.staged[k];
      if (v.empty()) continue;
      const StateFormat f = KindFormat(s, k);
      const auto n = static_cast<int64_t>(v.size());
      std::vector<uint8_t> raw(static_cast<size_t>(f.ValuesBytes(n)));
      std::vector<float> scales(static_cast<size_t>(f.Scales(n)));
      RETURN_IF_ERROR(EncodeKind(s, k, v.data(), n, raw.data(), scales.data()));
      if (!scales.empty()) RETURN_IF_ERROR(state_dev_->Copy(Scales(s, k), scales.data(), scales.size() * 4));
      RETURN_IF_ERROR(state_dev_->Copy(KindMemory(s, k), raw.data(), raw.size()), "group '", s.in.name, "'");
      std::vector<float>().swap(v);
    }
    return Status();
  }

  Status Allocate() override {
    for (Slot& s : slots_) {
      if (s.in.frozen) continue;
      const auto S = static_cast<size_t>(s.in.elements);
      const std::string ctx = "allocating the optimizer state of group '" + s.in.name + "'";
      // An f32 model's parameters are its master weights wherever the state's device reaches them (a
      // second f32 copy would hold the same values): 16 bytes per parameter of model state, not 20.
      const bool params_here = state_dev_->host_accessible() ? (!s.host_params.empty() || !s.param_shard.empty() || device_->host_accessible())
                                                             : (s.host_params.empty() && s.param_shard.empty());
      s.master_is_params = s.in.dtype == DType::kF32 && params_here;
      const bool no_master = s.compact() && !s.in.format.master;  // the parameters are the state
      for (int k = s.master_is_params || no_master ? 1 : 0; k < kinds(s); ++k) {
        DeviceBuffer& b = Buffer(s, k);
        const auto bytes = static_cast<size_t>(KindFormat(s, k).ValuesBytes(s.in.elements));
        ASSIGN_OR_RETURN(b, state_dev_->Allocate(bytes, MemCategory::kOptimizerState), ctx);
        RETURN_IF_ERROR(state_dev_->Fill(b.data(), 0, bytes), ctx);
      }
      RETURN_IF_ERROR(AllocateScales(s), ctx);
      if (no_master) {
        RETURN_IF_ERROR(InitParams(s), ctx);
        continue;
      }
      if (s.master_is_params) RETURN_IF_ERROR(state_dev_->Fill(State(s, 0), 0, S * 4), ctx);  // padding: zero
      // Initial values, through host memory if need be (padding stays zero).
      std::vector<float> staged;
      float* master = State(s, 0);
      if (!state_dev_->host_accessible()) {
        staged.assign(S, 0.0f);
        master = staged.data();
      }
      s.in.init(0, s.in.elements, master);
      if (!staged.empty()) RETURN_IF_ERROR(state_dev_->Copy(State(s, 0), staged.data(), S * 4), ctx);
      RETURN_IF_ERROR(RefreshParams(s), ctx);
    }
    return Status();
  }

  Window WindowAt(int g, int64_t off, int64_t n, CompactWindow* cw) {
    Slot& s = slots_[static_cast<size_t>(g)];
    const void* grads = static_cast<const char*>(HostGrads(s)) + static_cast<size_t>(off) * DTypeSize(s.in.grad_dtype);
    void* params = static_cast<char*>(HostParams(s)) + static_cast<size_t>(off) * esize(s);
    if (s.compact()) {
      const kernels::CompactFormat& f = s.in.format;
      const auto q = static_cast<size_t>(off / f.block);
      auto scales = [q](DeviceBuffer& b) { return b.empty() ? nullptr : b.as<float>() + q; };
      *cw = CompactWindow{f, static_cast<char*>(s.exp_avg.data()) + KindFormat(s, 1).ValuesBytes(off),  // off: whole blocks
                          static_cast<char*>(s.exp_avg_sq.data()) + KindFormat(s, 2).ValuesBytes(off), scales(s.exp_avg_scale),
                          scales(s.exp_avg_sq_scale), s.in.index + off};
      return Window{g, off, n, f.master ? State(s, 0) + off : nullptr, nullptr, nullptr, nullptr, grads, params, state_compute_, cw};
    }
    auto at = [off](DeviceBuffer& b) { return b.empty() ? nullptr : b.as<float>() + off; };
    return Window{g, off, n, State(s, 0) + off, at(s.exp_avg), at(s.exp_avg_sq), at(s.max_exp_avg_sq), grads, params, state_compute_};
  }

  Status RefreshParams(Slot& s) {
    const bool no_master = s.compact() && !s.in.format.master;
    if (!s.master_is_params && !no_master) {
      RETURN_IF_ERROR(state_compute_->Cast(s.master.data(), DType::kF32, HostParams(s), s.in.dtype, s.in.elements));
    }
    return ParamsUp(s);
  }

  Status AllocateScales(Slot& s) {
    for (auto [kind, buf] : {std::pair{1, &s.exp_avg_scale}, std::pair{2, &s.exp_avg_sq_scale}}) {
      if (!KindFormat(s, kind).blockwise()) continue;
      const auto bytes = static_cast<size_t>(KindFormat(s, kind).Scales(s.in.elements)) * 4;
      ASSIGN_OR_RETURN(*buf, state_dev_->Allocate(bytes, MemCategory::kOptimizerState));
      RETURN_IF_ERROR(state_dev_->Fill(buf->data(), 0, bytes));
    }
    return Status();
  }
  // Without a master: the initial values rounded to nearest into the parameters (padding zero).
  Status InitParams(Slot& s) {
    std::vector<float> values(static_cast<size_t>(s.in.elements), 0.0f);
    s.in.init(0, s.in.elements, values.data());
    RETURN_IF_ERROR(WriteParams(s, 0, s.in.elements, values.data()));
    return ParamsUp(s);
  }

  bool offloaded_ = false;
  Device* state_dev_ = nullptr;
  Compute* state_compute_ = nullptr;
};

}  // namespace

std::unique_ptr<OptimizerStore> MakeResidentStore(Communicator* comm, Device* device, Compute* compute, HostMemory* host, Compute* host_compute,
                                                  const OptimizerStore::Options& o) {
  return std::make_unique<ResidentStore>(comm, device, compute, host, host_compute, o);
}

}  // namespace zrt::internal
