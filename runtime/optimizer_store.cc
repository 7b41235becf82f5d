// OptimizerStore (optimizer_store.h): the part every placement shares (the mirrors of device memory,
// frozen slots: their state is their parameters, through casts; the state as a checkpoint sees it:
// buffers, random access, the capture of runtime/capture.h). The two placements are files of their
// own: resident_store.cc, swapped_store.cc (store_placements.h).
//
// Buffers per group (S = shard elements, E = bytes per element of the group's dtype):
//   resident: master, exp_avg, exp_avg_sq[, max_exp_avg_sq]: S x 4 each, in device memory (offload
//             none) or host memory (offload host); compact state (Group::format): each moment S x 4,
//             2, 1 or 1/2 plus S / block x 4 of q8/q4 scales, no master without one (the parameters are the
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
#include "zrt/runtime/store_placements.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "zrt/core/thread_pool.h"
#include "zrt/kernels/cast.h"
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

namespace {
constexpr const char* kKinds[] = {"master", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
}  // namespace

std::vector<StateBuffer> OptimizerStore::StateBuffers(int group) {
  Slot& s = slots_[static_cast<size_t>(group)];
  std::vector<StateBuffer> out;
  for (int k = 0; k < kinds(s); ++k) {
    // A checkpoint stores the compact kinds as they are kept (without a master: the bf16 parameters).
    out.push_back(StateBuffer{kKinds[k], DType::kF32, s.in.frozen ? nullptr : HostState(s, k), s.in.elements, KindFormat(s, k)});
  }
  return out;
}

StateFormat OptimizerStore::KindFormat(const Slot& s, int kind) const {
  if (!s.compact() || kind > 2) return StateFormat{};
  const kernels::CompactFormat& f = s.in.format;
  if (kind == 0) return StateFormat{f.master ? Precision::kF32 : Precision::kBF16};
  return kind == 1 ? f.exp_avg_format() : f.exp_avg_sq_format();
}

Status OptimizerStore::DecodeKind(const Slot& s, int k, const void* raw, const float* scales, int64_t off, int64_t n, float* out) const {
  KindFormat(s, k).Decode(raw, scales, off, n, out);
  return Status();
}

Status OptimizerStore::EncodeKind(const Slot& s, int k, const float* in, int64_t n, void* raw, float* scales) const {
  KindFormat(s, k).Encode(in, n, raw, scales);  // bf16 to nearest even; each q8 block's scale its largest magnitude
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
  const int64_t block = KindFormat(s, kind).blockwise() ? s.in.format.block : 1;
  if (offset % block != 0 || (n % block != 0 && offset + n != s.in.elements)) {
    return InvalidArgumentError("optimizer store: ", PrecisionName(KindFormat(s, kind).precision), " state of group '", s.in.name,
                                "' written at elements [", offset, ", ", offset + n,
                                "), not whole blocks of ", block);
  }
  RETURN_IF_ERROR(Settle());  // a capture still reading (or owed) the state gets it as it was
  if (n == 0) return Status();
  return WriteStoredState(group, kind, offset, n, values, scales);
}

Result<std::optional<StoredPart>> OptimizerStore::StoredMemory(int group, int kind) {
  if (group < 0 || static_cast<size_t>(group) >= slots_.size()) return InvalidArgumentError("optimizer store: no group ", group);
  Slot& s = slots_[static_cast<size_t>(group)];
  if (kind < 0 || kind >= kinds(s)) return InvalidArgumentError("optimizer store: group '", s.in.name, "' has no kind ", kind);
  if (!TakesStored(s, kind)) return std::optional<StoredPart>();
  const auto kept = CaptureStored(s);  // where captures read it as kept: the same memory
  if (!kept) return std::optional<StoredPart>();
  RETURN_IF_ERROR(Settle());  // a capture still reading (or owed) the state gets it as it was
  return kept(kind, 0, s.in.elements);
}

Result<std::unique_ptr<OptimizerStore>> OptimizerStore::Create(Communicator* comm, Device* device, Compute* compute,
                                                               HostMemory* host, Compute* host_compute, const Options& o) {
  if (comm == nullptr || device == nullptr || compute == nullptr || host == nullptr || host_compute == nullptr) {
    return InvalidArgumentError("optimizer store: null argument");
  }
  if (o.offload.optimizer != OffloadTarget::kNvme) {
    return internal::MakeResidentStore(comm, device, compute, host, host_compute, o);
  }
  ASSIGN_OR_RETURN(auto io, IoEngine::Create(o.offload.io), "offload I/O");
  return internal::MakeSwappedStore(comm, device, compute, host, host_compute, o, std::move(io));
}

}  // namespace zrt
