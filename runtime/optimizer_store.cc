// OptimizerStore (optimizer_store.h): first the part every placement shares (the mirrors of device
// memory, frozen slots: their state is their parameters, through casts; the state as a checkpoint
// sees it: buffers, random access, the capture of runtime/capture.h), then the two placements.
//
// Buffers per group (S = shard elements, E = bytes per element of the group's dtype):
//   resident: master, exp_avg, exp_avg_sq[, max_exp_avg_sq]: S x 4 each, in device memory (offload
//             none) or host memory (offload host); compact state (Group::format): each moment S x 4,
//             2 or 1 plus S / block x 4 of q8 scales, no master without one (the parameters are the
//             state), and while a checkpoint load writes a moment, S x 4 in host memory (staged)
//   swapped:  the same as streams of preallocated swap files (offload/swapper.h), plus the parameter
//             shard as a stream (offload.params = nvme); 3 host buffer sets of one sub-group
//   mirrors:  host_grad S x E and host_params S x E in host memory, when the optimizer is offloaded and
//             the device's memory is not host memory (a GPU); params held in host memory are their own
//             mirror
//   frozen:   no state of its own; held parameters (stage 3 with offload.params) S x E in host memory
//   capture:  where state is device memory or a frozen cast: a bounce buffer of up to kCapturePart x 4
//             in host memory per capture in flight, kept from the first capture on
#include "zrt/runtime/optimizer_store.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <future>
#include <map>
#include <tuple>
#include <utility>

#include "zrt/core/thread_pool.h"
#include "zrt/kernels/cast.h"
#include "zrt/offload/swapper.h"
#include "zrt/runtime/capture.h"

namespace zrt {

namespace {
// Elements of every kind the capture thread streams before its progress moves on, and the size of the
// windows an Update then works in: large enough that per-window costs vanish, small enough that the
// step waits only for what it is about to change.
constexpr int64_t kCapturePart = int64_t{1} << 20;
}  // namespace

OptimizerStore::OptimizerStore(Communicator* comm, Device* device, Compute* compute, HostMemory* host,
                               Compute* host_compute, const Options& o)
    : comm_(comm), device_(device), compute_(compute), host_(host), host_compute_(host_compute), o_(o) {
  mirror_ = o.offload.optimizer != OffloadTarget::kNone && !device->host_accessible();
  if (mirror_) copier_ = std::make_unique<ThreadPool>(1, "zrt-copy");
}

OptimizerStore::~OptimizerStore() { captures_.reset(); }  // its thread reads the slots

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
      // Held parameters in host memory; a frozen slot's whenever the store holds parameters (the
      // stream of parameters on NVMe is the step's, and a frozen slot takes no step).
      if (holds_params() && (o_.offload.params == OffloadTarget::kHost || s.in.frozen)) {
        ASSIGN_OR_RETURN(s.param_shard, host_->Allocate(bytes, MemCategory::kParameters), ctx);
      }
      if (mirror_ && !s.in.frozen) {
        ASSIGN_OR_RETURN(s.host_grad, host_->Allocate(static_cast<size_t>(s.in.elements) * DTypeSize(s.in.grad_dtype), MemCategory::kGradients), ctx);
        if (!holds_params()) {
          ASSIGN_OR_RETURN(s.host_params, host_->Allocate(bytes, MemCategory::kParameters), ctx);
        }
      }
    }
    for (Slot& s : slots_) {
      if (s.in.frozen) RETURN_IF_ERROR(InitFrozen(s), "initialising frozen group '", s.in.name, "'");
    }
    return Allocate();
  };
  // A problem on one rank (no space on its disk, a budget too small) must not leave the others waiting
  // in the engine's next collective.
  return AgreeOnStatus(comm_, local());
}

// ---- frozen slots: the parameters are the state ---------------------------------------------------

Status OptimizerStore::InitFrozen(Slot& s) {
  std::vector<float> values(static_cast<size_t>(s.in.elements), 0.0f);  // padding: zero
  s.in.init(0, s.in.elements, values.data());
  return FrozenWrite(s, 0, s.in.elements, values.data());
}

// f32 values of the frozen parameters [offset, offset + n) in `out` (host memory); the pointer to them.
Result<const float*> OptimizerStore::FrozenRead(Slot& s, int64_t offset, int64_t n, float* out) {
  const char* src = static_cast<const char*>(FrozenParams(s)) + static_cast<size_t>(offset) * esize(s);
  if (!s.param_shard.empty() || device_->host_accessible()) {
    if (s.in.dtype == DType::kF32) return reinterpret_cast<const float*>(src);
    RETURN_IF_ERROR(kernels::CastCpu(src, s.in.dtype, out, DType::kF32, n));  // this thread alone: the capture's may call it
    return out;
  }
  ASSIGN_OR_RETURN(DeviceBuffer tmp, device_->Allocate(static_cast<size_t>(n) * 4, MemCategory::kStaging), "frozen group '", s.in.name, "'");
  RETURN_IF_ERROR(compute_->Cast(src, s.in.dtype, tmp.data(), DType::kF32, n));
  RETURN_IF_ERROR(compute_->Synchronize());
  RETURN_IF_ERROR(device_->Copy(out, tmp.data(), static_cast<size_t>(n) * 4));
  return out;
}

Status OptimizerStore::FrozenWrite(Slot& s, int64_t offset, int64_t n, const float* in) {
  char* dst = static_cast<char*>(FrozenParams(s)) + static_cast<size_t>(offset) * esize(s);
  if (!s.param_shard.empty() || device_->host_accessible()) return host_compute_->Cast(in, DType::kF32, dst, s.in.dtype, n);
  ASSIGN_OR_RETURN(DeviceBuffer tmp, device_->Allocate(static_cast<size_t>(n) * 4, MemCategory::kStaging), "frozen group '", s.in.name, "'");
  RETURN_IF_ERROR(device_->Copy(tmp.data(), in, static_cast<size_t>(n) * 4));
  RETURN_IF_ERROR(compute_->Cast(tmp.data(), DType::kF32, dst, s.in.dtype, n));
  return compute_->Synchronize();
}

// ---- the state as a checkpoint sees it ------------------------------------------------------------

std::vector<StateBuffer> OptimizerStore::StateBuffers(int group) {
  static constexpr const char* kKinds[] = {"master", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
  Slot& s = slots_[static_cast<size_t>(group)];
  std::vector<StateBuffer> out;
  for (int k = 0; k < kinds(s); ++k) {
    StateBuffer& b = out.emplace_back(StateBuffer{kKinds[k], DType::kF32, s.in.frozen ? nullptr : HostState(s, k), s.in.elements});
    if (!s.compact() || k > 2) continue;  // a checkpoint stores the compact kinds as they are
    const kernels::CompactFormat& f = s.in.format;
    const kernels::MomentFormat m = k == 1 ? f.exp_avg : f.exp_avg_sq;
    if (k == 0) b.stored = f.master ? StoredAs::kF32 : StoredAs::kBF16;  // without a master: the bf16 parameters
    if (k > 0) b.stored = m == kernels::MomentFormat::kF32 ? StoredAs::kF32 : m == kernels::MomentFormat::kBf16 ? StoredAs::kBF16 : StoredAs::kQ8;
    if (b.stored == StoredAs::kQ8) b.block = f.block;
  }
  return out;
}

size_t OptimizerStore::KindBytes(const Slot& s, int kind) const {
  if (!s.compact()) return 4;
  if (kind == 0) return s.in.format.master ? 4 : esize(s);
  const kernels::MomentFormat f = kind == 1 ? s.in.format.exp_avg : s.in.format.exp_avg_sq;
  return f == kernels::MomentFormat::kF32 ? 4 : f == kernels::MomentFormat::kBf16 ? 2 : 1;
}

Status OptimizerStore::DecodeKind(const Slot& s, int k, const void* raw, const float* scales, int64_t off, int64_t n, float* out) const {
  const size_t eb = KindBytes(s, k);
  if (eb == 4) {
    std::memcpy(out, raw, static_cast<size_t>(n) * 4);
    return Status();
  }
  if (eb == 2) return kernels::CastCpu(raw, k == 0 ? s.in.dtype : DType::kBF16, out, DType::kF32, n);
  const auto* codes = static_cast<const uint8_t*>(raw);
  const float* value = Q8Table(k == 1);
  const int64_t block = s.in.format.block;
  for (int64_t i = 0; i < n;) {  // block by block from `off` (which may start inside one)
    const int64_t end = std::min(n, (off + i) / block * block + block - off);
    const float scale = scales[(off + i) / block - off / block];
    for (; i < end; ++i) out[i] = value[codes[i]] * scale;
  }
  return Status();
}

Status OptimizerStore::EncodeKind(const Slot& s, int k, const float* in, int64_t n, void* raw, float* scales) const {
  const size_t eb = KindBytes(s, k);
  if (eb == 4) {
    std::memcpy(raw, in, static_cast<size_t>(n) * 4);
    return Status();
  }
  if (eb == 2) return kernels::CastCpu(in, DType::kF32, raw, k == 0 ? s.in.dtype : DType::kBF16, n);  // nearest even
  const int64_t block = s.in.format.block;  // each block's scale its largest magnitude
  for (int64_t q = 0; q < kernels::Q8Blocks(n, block); ++q) {
    scales[q] = Q8EncodeBlock(in + q * block, std::min(block, n - q * block), k == 1, static_cast<uint8_t*>(raw) + q * block);
  }
  return Status();
}

Status OptimizerStore::Capture(std::shared_ptr<StateSink> sink) {
  if (!captures_) {
    captures_ = std::make_unique<internal::Captures>(kCapturePart, [host = host_](size_t bytes) {
      return host->Allocate(bytes, MemCategory::kStaging, kIoAlignment);
    });
  }
  // What the step changes goes first (trainable slots in order), then the frozen ones. A frozen slot
  // the host cannot read (device memory: its cast runs on the compute stream) is copied now.
  std::vector<internal::Captures::Slot> memory;
  bool deferred = false;
  for (int g = 0; g < static_cast<int>(slots_.size()); ++g) {
    Slot& s = slots_[static_cast<size_t>(g)];
    if (s.in.frozen) continue;
    auto read = CaptureRead(s);
    if (!read) {
      deferred = true;
      continue;
    }
    memory.push_back({g, s.in.elements, kinds(s), HostState(s, 0) == nullptr || s.compact(), std::move(read), CaptureStored(s)});
  }
  for (int g = 0; g < static_cast<int>(slots_.size()); ++g) {
    Slot& s = slots_[static_cast<size_t>(g)];
    if (!s.in.frozen) continue;
    if (!s.param_shard.empty() || device_->host_accessible()) {
      memory.push_back({g, s.in.elements, 1, s.in.dtype != DType::kF32,
                        [this, &s](int, int64_t off, int64_t n, float* bounce) { return FrozenRead(s, off, n, bounce); }});
      continue;
    }
    auto copy = std::make_shared<std::vector<float>>(static_cast<size_t>(s.in.elements));
    if (s.in.elements > 0) RETURN_IF_ERROR(FrozenRead(s, 0, s.in.elements, copy->data()).status(), "capturing frozen group '", s.in.name, "'");
    memory.push_back({g, s.in.elements, 1, false, [copy](int, int64_t off, int64_t, float*) -> Result<const float*> { return copy->data() + off; }});
  }
  ASSIGN_OR_RETURN(std::shared_ptr<internal::CaptureJob> job, captures_->Start(std::move(sink), std::move(memory), deferred ? 1 : 0));
  if (deferred) Defer(std::move(job));
  return Status();
}

Status OptimizerStore::Settle() {
  Status s = Deliver();
  if (captures_) capture_wait_ += captures_->WaitAll();
  return s;
}

void OptimizerStore::WaitForCaptures(int g, int64_t end) {
  if (captures_) capture_wait_ += captures_->WaitPast(g, end);
}

bool OptimizerStore::capturing() const { return captures_ && captures_->active(); }
int64_t OptimizerStore::capture_part() const { return kCapturePart; }
double OptimizerStore::TakeCaptureWait() { return std::exchange(capture_wait_, 0.0); }

Status OptimizerStore::Read(int group, int kind, int64_t offset, int64_t n, float* out) {
  if (group < 0 || static_cast<size_t>(group) >= slots_.size()) return InvalidArgumentError("optimizer store: no group ", group);
  Slot& s = slots_[static_cast<size_t>(group)];
  if (kind < 0 || kind >= kinds(s) || offset < 0 || n < 0 || offset > s.in.elements - n) {
    return InvalidArgumentError("optimizer store: kind ", kind, " elements [", offset, ", ", offset + n, ") of group '", s.in.name, "'");
  }
  if (n == 0) return Status();
  if (!s.in.frozen) return ReadState(group, kind, offset, n, out);
  ASSIGN_OR_RETURN(const float* p, FrozenRead(s, offset, n, out));
  if (p != out) std::memcpy(out, p, static_cast<size_t>(n) * 4);
  return Status();
}

Status OptimizerStore::Write(int group, int kind, int64_t offset, int64_t n, const float* in) {
  if (group < 0 || static_cast<size_t>(group) >= slots_.size()) return InvalidArgumentError("optimizer store: no group ", group);
  Slot& s = slots_[static_cast<size_t>(group)];
  if (kind < 0 || kind >= kinds(s) || offset < 0 || n < 0 || offset > s.in.elements - n) {
    return InvalidArgumentError("optimizer store: kind ", kind, " elements [", offset, ", ", offset + n, ") of group '", s.in.name, "'");
  }
  RETURN_IF_ERROR(Settle());  // a capture still reading (or owed) the state gets it as it was
  if (n == 0) return Status();
  return s.in.frozen ? FrozenWrite(s, offset, n, in) : WriteState(group, kind, offset, n, in);
}

Status OptimizerStore::WriteStored(int group, int kind, int64_t offset, int64_t n, const void* values, const float* scales) {
  if (group < 0 || static_cast<size_t>(group) >= slots_.size()) return InvalidArgumentError("optimizer store: no group ", group);
  Slot& s = slots_[static_cast<size_t>(group)];
  if (kind < 0 || kind >= kinds(s) || offset < 0 || n < 0 || offset > s.in.elements - n) {
    return InvalidArgumentError("optimizer store: kind ", kind, " elements [", offset, ", ", offset + n, ") of group '", s.in.name, "'");
  }
  if (!TakesStored(s, kind)) return UnavailableError("optimizer store: group '", s.in.name, "' keeps kind ", kind, " as f32 values");
  const int64_t block = KindBytes(s, kind) == 1 ? s.in.format.block : 1;
  if (offset % block != 0 || (n % block != 0 && offset + n != s.in.elements)) {
    return InvalidArgumentError("optimizer store: q8 state of group '", s.in.name, "' written at elements [", offset, ", ", offset + n,
                                "), not whole blocks of ", block);
  }
  RETURN_IF_ERROR(Settle());  // a capture still reading (or owed) the state gets it as it was
  if (n == 0) return Status();
  return WriteStoredState(group, kind, offset, n, values, scales);
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
    return state_dev_->host_accessible() && StoredF32(s, kind) ? State(s, kind) : nullptr;
  }
  static bool StoredF32(const Slot& s, int kind) {
    if (!s.compact()) return true;
    const kernels::CompactFormat& f = s.in.format;
    return kind == 0 ? f.master : (kind == 1 ? f.exp_avg : f.exp_avg_sq) == kernels::MomentFormat::kF32;
  }

  // Compact kinds in host memory stream as kept (codes, scales, bf16 values), where the store keeps
  // them: a sink that stores the form takes them as they are. Staged values (a load's, not encoded
  // yet) and f32 kinds go as values.
  std::function<Result<std::optional<StoredPart>>(int, int64_t, int64_t)> CaptureStored(Slot& s) override {
    if (!s.compact() || !state_dev_->host_accessible()) return {};
    return [this, &s](int k, int64_t off, int64_t) -> Result<std::optional<StoredPart>> {
      if (!TakesStored(s, k) || (k > 0 && !s.staged[k].empty())) return std::nullopt;
      const size_t eb = KindBytes(s, k);
      StoredPart st;
      st.as = eb == 1 ? StoredAs::kQ8 : StoredAs::kBF16;
      st.values = static_cast<const char*>(KindMemory(s, k)) + static_cast<size_t>(off) * eb;
      if (eb == 1) {
        st.block = s.in.format.block;
        st.is_signed = k == 1;
        st.scales = (k == 1 ? s.exp_avg_scale : s.exp_avg_sq_scale).as<float>() + off / st.block;
      }
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
    if (staged.empty()) {  // what is not written keeps its value (padding)
      staged.resize(static_cast<size_t>(s.in.elements));
      RETURN_IF_ERROR(Decode(s, kind, 0, s.in.elements, staged.data(), false));
    }
    std::memcpy(staged.data() + offset, in, static_cast<size_t>(n) * 4);
    return Status();
  }
  // As stored: the codes (values) and scales copied into place; f32 values a load staged before are
  // encoded first, so the later write wins.
  Status WriteStoredState(int g, int kind, int64_t offset, int64_t n, const void* values, const float* scales) override {
    Slot& s = slots_[static_cast<size_t>(g)];
    if (kind > 0 && !s.staged[kind].empty()) RETURN_IF_ERROR(FlushStaged(s));
    const size_t eb = KindBytes(s, kind);
    RETURN_IF_ERROR(state_dev_->Copy(static_cast<char*>(KindMemory(s, kind)) + static_cast<size_t>(offset) * eb, values, static_cast<size_t>(n) * eb));
    if (eb != 1) return Status();
    const int64_t block = s.in.format.block;
    return state_dev_->Copy((kind == 1 ? s.exp_avg_scale : s.exp_avg_sq_scale).as<float>() + offset / block, scales,
                            static_cast<size_t>((n + block - 1) / block) * 4);
  }

  // ---- compact state as f32 values (a checkpoint's view) ----
  void* KindMemory(Slot& s, int kind) { return kind == 0 && !s.in.format.master ? HostParams(s) : static_cast<void*>(State(s, kind)); }
  // Host <- the store's memory (on the capture thread: the snapshot stream, which waits for the step).
  Status Fetch(void* dst, const void* src, size_t bytes, bool capture) {
    if (state_dev_->host_accessible()) {
      std::memcpy(dst, src, bytes);
      return Status();
    }
    return capture ? compute_->CopyToHost(dst, src, bytes) : state_dev_->Copy(dst, src, bytes);
  }
  // Elements [off, off + n) of kind k as f32: decoded from bf16 or q8 codes and their blocks' scales.
  Status Decode(Slot& s, int k, int64_t off, int64_t n, float* out, bool capture) {
    if (n == 0) return Status();
    if (!s.staged[k].empty()) {
      std::memcpy(out, s.staged[k].data() + off, static_cast<size_t>(n) * 4);
      return Status();
    }
    const size_t eb = KindBytes(s, k);
    const char* src = static_cast<const char*>(KindMemory(s, k)) + static_cast<size_t>(off) * eb;
    if (eb == 4) return Fetch(out, src, static_cast<size_t>(n) * 4, capture);
    const int64_t q0 = eb == 1 ? off / s.in.format.block : 0, blocks = eb == 1 ? (off + n - 1) / s.in.format.block + 1 - q0 : 0;
    const float* scales = eb == 1 ? (k == 1 ? s.exp_avg_scale : s.exp_avg_sq_scale).as<float>() + q0 : nullptr;
    if (state_dev_->host_accessible()) return DecodeKind(s, k, src, scales, off, n, out);  // read where it is
    std::vector<uint8_t> raw(static_cast<size_t>(n) * eb);
    std::vector<float> host_scales(static_cast<size_t>(blocks));
    RETURN_IF_ERROR(Fetch(raw.data(), src, raw.size(), capture));
    if (eb == 1) RETURN_IF_ERROR(Fetch(host_scales.data(), scales, host_scales.size() * 4, capture));
    return DecodeKind(s, k, raw.data(), host_scales.data(), off, n, out);
  }
  // Without a master the parameters are the state: f32 values rounded to nearest even.
  Status WriteParams(Slot& s, int64_t off, int64_t n, const float* in) {
    std::vector<uint8_t> raw(static_cast<size_t>(n) * esize(s));
    RETURN_IF_ERROR(kernels::CastCpu(in, DType::kF32, raw.data(), s.in.dtype, n));
    return state_dev_->Copy(static_cast<char*>(HostParams(s)) + static_cast<size_t>(off) * esize(s), raw.data(), raw.size());
  }
  // The moments a load wrote, encoded whole: bf16 rounded to nearest even, q8 block by block (the
  // scale the block's largest magnitude). A block decoded from this format encodes back to itself.
  Status FlushStaged(Slot& s) {
    if (s.staged[1].empty() && s.staged[2].empty()) return Status();
    RETURN_IF_ERROR(Settle());  // no capture reads the staged values while they go
    for (int k = 1; k <= 2; ++k) {
      std::vector<float>& v = s.staged[k];
      if (v.empty()) continue;
      const size_t eb = KindBytes(s, k);
      const auto n = static_cast<int64_t>(v.size());
      std::vector<uint8_t> raw(v.size() * eb);
      std::vector<float> scales(eb == 1 ? static_cast<size_t>(kernels::Q8Blocks(n, s.in.format.block)) : 0);
      RETURN_IF_ERROR(EncodeKind(s, k, v.data(), n, raw.data(), scales.data()));
      if (eb == 1) {
        RETURN_IF_ERROR(state_dev_->Copy((k == 1 ? s.exp_avg_scale : s.exp_avg_sq_scale).data(), scales.data(), scales.size() * 4));
      }
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
        const size_t bytes = S * (s.compact() ? KindBytes(s, k) : 4);
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
      *cw = CompactWindow{f, static_cast<char*>(s.exp_avg.data()) + static_cast<size_t>(off) * KindBytes(s, 1),
                          static_cast<char*>(s.exp_avg_sq.data()) + static_cast<size_t>(off) * KindBytes(s, 2), KindBytes(s, 1), KindBytes(s, 2),
                          scales(s.exp_avg_scale), scales(s.exp_avg_sq_scale), s.in.index + off};
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
    if (!s.compact()) return Status();
    const kernels::CompactFormat& f = s.in.format;
    const auto bytes = static_cast<size_t>(kernels::Q8Blocks(s.in.elements, f.block)) * 4;
    for (auto [fmt, buf] : {std::pair{f.exp_avg, &s.exp_avg_scale}, std::pair{f.exp_avg_sq, &s.exp_avg_sq_scale}}) {
      if (fmt != kernels::MomentFormat::kQ8) continue;
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

// ---- swapped: NVMe -------------------------------------------------------------------------------
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
        const CompactWindow cw{s.in.format, w.data[static_cast<size_t>(exp_avg_)], w.data[static_cast<size_t>(exp_avg_sq_)], KindBytes(s, 1),
                               KindBytes(s, 2), Data(w, exp_avg_scale_), Data(w, exp_avg_sq_scale_), s.in.index + w.offset};
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
    if (KindBytes(s, kind) == 4) return swapper_->Read(slot_region_[static_cast<size_t>(g)], kinds_[static_cast<size_t>(kind)], offset, n, out);
    RETURN_IF_ERROR(FlushPending());
    const auto [lo, hi] = Blocks(s, kind, offset, n);
    std::vector<float> v(static_cast<size_t>(hi - lo));
    RETURN_IF_ERROR(ReadDecoded(g, kind, lo, hi - lo, v.data()));
    std::memcpy(out, v.data() + (offset - lo), static_cast<size_t>(n) * 4);
    return Status();
  }
  // Compact kinds: bf16 values (and the parameters without a master) element by element; q8 whole
  // blocks encoded at once, a block written in part kept as f32 values until the next step,
  // RefreshParams or read (FlushPending), so it is encoded once with all its values.
  Status WriteState(int g, int kind, int64_t offset, int64_t n, const float* in) override {
    Slot& s = slots_[static_cast<size_t>(g)];
    const int region = slot_region_[static_cast<size_t>(g)];
    if (KindBytes(s, kind) == 4) return swapper_->Write(region, kinds_[static_cast<size_t>(kind)], offset, n, in);
    if (KindBytes(s, kind) != 1) return WriteEncoded(g, kind, offset, n, in);
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
  // The q8 blocks (or bf16 elements) holding [offset, offset + n).
  static std::pair<int64_t, int64_t> Blocks(const Slot& s, int kind, int64_t offset, int64_t n) {
    const int64_t unit = s.compact() && kind > 0 && s.in.format.block > 0 && (kind == 1 ? s.in.format.exp_avg : s.in.format.exp_avg_sq) == kernels::MomentFormat::kQ8 ? s.in.format.block : 1;
    return {offset / unit * unit, (offset + n + unit - 1) / unit * unit};
  }
  // Bytes of `count` elements (whole blocks for scales) of `stream` in slot s's region.
  size_t StreamBytes(const Slot& s, int stream, int64_t count) const {
    if (stream == exp_avg_scale_ || stream == exp_avg_sq_scale_) return static_cast<size_t>(count / s.in.format.block * 4);
    if (stream == params_) return static_cast<size_t>(count) * esize(s);
    const int kind = stream == master_ ? 0 : stream == exp_avg_ ? 1 : stream == exp_avg_sq_ ? 2 : 3;
    return static_cast<size_t>(count) * (kind == 3 ? 4 : KindBytes(s, kind));
  }
  // The stream a compact kind's stored form is in, and its scales' (-1 unless q8).
  std::pair<int, int> StoredStreams(const Slot& s, int kind) const {
    if (kind == 0) return {params_, -1};
    return {kinds_[static_cast<size_t>(kind)], KindBytes(s, kind) == 1 ? (kind == 1 ? exp_avg_scale_ : exp_avg_sq_scale_) : -1};
  }
  // Elements [offset, offset + n) of a compact kind (whole blocks for q8) from the swap files (kind 0
  // without a master: the parameters, on NVMe or in host memory).
  Status ReadDecoded(int g, int kind, int64_t offset, int64_t n, float* out) {
    Slot& s = slots_[static_cast<size_t>(g)];
    const int region = slot_region_[static_cast<size_t>(g)];
    const auto [stream, scale_stream] = StoredStreams(s, kind);
    std::vector<char> raw(static_cast<size_t>(n) * KindBytes(s, kind));
    if (stream >= 0) {
      RETURN_IF_ERROR(swapper_->Read(region, stream, offset, n, raw.data()));
    } else {
      std::memcpy(raw.data(), static_cast<const char*>(HostParams(s)) + static_cast<size_t>(offset) * esize(s), raw.size());
    }
    std::vector<float> scales(scale_stream >= 0 ? static_cast<size_t>(n / s.in.format.block) : 0);
    if (scale_stream >= 0) RETURN_IF_ERROR(swapper_->Read(region, scale_stream, offset, n, scales.data()));
    return DecodeKind(s, kind, raw.data(), scales.data(), offset, n, out);
  }
  Status WriteEncoded(int g, int kind, int64_t offset, int64_t n, const float* in) {
    Slot& s = slots_[static_cast<size_t>(g)];
    std::vector<char> raw(static_cast<size_t>(n) * KindBytes(s, kind));
    std::vector<float> scales(StoredStreams(s, kind).second >= 0 ? static_cast<size_t>(n / s.in.format.block) : 0);
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
    bool q8 = false;
    for (const Slot& s : slots_) {
      q8 = q8 || (s.compact() && (KindBytes(s, 1) == 1 || KindBytes(s, 2) == 1));
      no_master_ = no_master_ || (s.compact() && !s.in.format.master);
    }
    if (q8) {  // one f32 scale per q8 block
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
      if (s.compact()) {  // the moments as kept; no master stream without one; scales for q8 moments
        r.element_bytes[static_cast<size_t>(master_)] = s.in.format.master ? 4 : 0;
        r.element_bytes[static_cast<size_t>(exp_avg_)] = KindBytes(s, 1);
        r.element_bytes[static_cast<size_t>(exp_avg_sq_)] = KindBytes(s, 2);
      }
      if (q8) {
        r.elements_per.assign(streams.size(), 1);
        for (auto [stream, kind] : {std::pair{exp_avg_scale_, 1}, std::pair{exp_avg_sq_scale_, 2}}) {
          const bool has = s.compact() && KindBytes(s, kind) == 1;
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
        if (s.compact() && store_.KindBytes(s, static_cast<int>(k)) != 4) {  // the f32 values of the compact form
          decoded_.resize(static_cast<size_t>(w.count));
          const auto [stream, scales] = store_.StoredStreams(s, static_cast<int>(k));
          const void* raw = stream >= 0 ? w.data[static_cast<size_t>(stream)]
                                        : static_cast<const char*>(store_.HostParams(store_.slots_[static_cast<size_t>(g)])) +
                                              static_cast<size_t>(w.offset) * store_.esize(s);
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
  int exp_avg_scale_ = -1, exp_avg_sq_scale_ = -1;  // with q8 moments
  bool no_master_ = false;                           // a group keeps no master: its parameters are state
  // q8 blocks a load wrote in part: (group, kind, first element) -> the block's f32 values.
  std::map<std::tuple<int, int, int64_t>, std::vector<float>> pending_;
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
