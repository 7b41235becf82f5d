// OptimizerStore: where the optimizer state lives and how a step reaches it. The one component of the
// engine that knows placement (../shared/DESIGN.md "runtime/"): fp32 master weights, Adam moments and
// max moments in device memory, in host memory (ZeRO-Offload) or in swap files on NVMe streamed
// through host memory (ZeRO-Infinity); host mirrors of device memory the host cannot address (the
// gradient shard going down, the updated parameters going up, overlapped with the CPU Adam on a copy
// thread); and, at stage 3 with offload.params, this rank's parameter shards themselves. Frozen groups
// are slots too: their state is their parameters (kind "master", read and written through casts).
//
// The store is also the one place that streams a snapshot of the state to whoever asks (Capture: the
// engine's StateOwner side; runtime/capture.h): once per placement, whatever the receiver.
//
// Two implementations behind this interface: resident (device or host memory) and swapped (NVMe).
// The engine hands over, per group, pointers to its own gradient shard and parameter block at Init;
// the store owns every buffer it allocates and never reaches back into the engine. A step is
//   engine: flush -> norm -> scalars -> store.Update(window -> Adam) -> gather.
//
// Thread-safety: one thread at a time (the engine's); the copy and capture threads are internal.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "zrt/core/communicator.h"
#include "zrt/core/device.h"
#include "zrt/core/state_view.h"
#include "zrt/offload/host_memory.h"
#include "zrt/offload/io_engine.h"
#include "zrt/runtime/compute.h"
#include "zrt/runtime/engine_config.h"
#include "zrt/runtime/stats.h"

namespace zrt {

namespace internal {
class Captures;
class CaptureJob;
}  // namespace internal

class OptimizerStore {
 public:
  // One parameter group as the engine hands it over at Init (the store's slot g is the engine's group g).
  struct Group {
    std::string name;   // for errors
    DType dtype = DType::kF32;       // of the parameters
    DType grad_dtype = DType::kF32;  // of the gradient shard (dtype, or f32 with fp32 main gradients)
    int64_t elements = 0;       // this rank's shard
    // No gradients and no moments: the slot's state is its parameters (master = their f32 values).
    bool frozen = false;
    const void* grads = nullptr;  // this rank's reduced gradient shard (the engine's device memory); null if frozen
    // This rank's block of the model parameters (the engine's device memory); null when the store
    // holds the parameter shard (holds_params(); a frozen slot's then in host memory).
    void* params = nullptr;
    // Writes the fp32 initial values of shard elements [offset, offset + count) into out (padding
    // elements are left as they are: zero). Used only during Init.
    std::function<void(int64_t offset, int64_t count, float* out)> init;
    // How the trainable state is stored (kernels/adam.h; EngineConfig::state): compact() moments are
    // bf16 values, or q8 or q4 codes with their scales, and without a master the parameters are the state.
    kernels::CompactFormat format;
    int64_t index = 0;  // shard element 0's index in the group's flat buffer (rank x shard size)
  };

  struct Options {
    OffloadConfig offload;
    bool amsgrad = false;
    int rank = 0;        // names this rank's swap directory
    int world_size = 0;  // swap directories of ranks beyond it (a job resumed on fewer) are removed
  };

  // `compute` runs on `device`'s memory, `host_compute` on host memory; all must outlive the store.
  static Result<std::unique_ptr<OptimizerStore>> Create(Communicator* comm, Device* device, Compute* compute,
                                                        HostMemory* host, Compute* host_compute, const Options& options);
  // Abandons a capture still waiting for NVMe state (its sink is closed with an error); finishes the
  // others first.
  virtual ~OptimizerStore();

  // Stage 3 with offload.params: the store holds the parameter shards (host memory or NVMe; a frozen
  // slot's in host memory), and Group::params is null.
  bool holds_params() const { return o_.offload.params != OffloadTarget::kNone; }

  // Allocates and initialises the state (master from Group::init, zero moments) and this rank's
  // parameters (cast from master; a frozen slot's from its init). Collective: a failure on one rank
  // (no space on its disk) is every rank's error.
  Status Init(std::vector<Group> groups);

  // A window of a slot with compact state: the moments as stored from the window's first element (a
  // block's start), their q8 or q4 scales from its first block, and the window's first global index.
  // Window::master is null without a master: Window::params are updated in place.
  struct CompactWindow {
    kernels::CompactFormat format;
    void* exp_avg;
    void* exp_avg_sq;
    float* exp_avg_scale;     // null unless q8 or q4
    float* exp_avg_sq_scale;
    int64_t index;
  };
  // A contiguous part of one slot's shard during Update: the state, the gradients and where the
  // updated parameters go, all at element `offset` of the shard and addressable by `compute`.
  struct Window {
    int group;
    int64_t offset;
    int64_t count;
    float* master;
    float* exp_avg;
    float* exp_avg_sq;
    float* max_exp_avg_sq;  // null unless amsgrad
    const void* grads;
    void* params;
    Compute* compute;
    const CompactWindow* compact = nullptr;  // set for compact state (exp_avg... above are then null)
  };
  using UpdateFn = std::function<Status(const Window&)>;
  // Calls fn once for every part of every trainable slot, in slot order (whole shards when resident
  // and nothing is being captured, windows otherwise), and brings the updated parameters to the
  // engine's buffers. Each window first waits for the captures still reading it. Collective for the
  // swapped store (agreement before anything changes and after streaming).
  virtual Status Update(const UpdateFn& fn) = 0;

  // Casts master into the parameters (after a checkpoint load wrote master). Collective.
  virtual Status RefreshParams() = 0;

  // ---- the state as a checkpoint sees it (the engine's StateOwner; core/state_view.h) ----
  // Slot g's buffers: master, exp_avg, exp_avg_sq[, max_exp_avg_sq] (a frozen slot: master), with
  // `data` where they are host memory.
  std::vector<StateBuffer> StateBuffers(int group);
  // Streams the state as it is now into `sink` (runtime/capture.h): memory on the capture thread
  // (the next Update waits window by window for what it is about to change), NVMe state as the next
  // Update streams it (or Settle).
  Status Capture(std::shared_ptr<StateSink> sink);
  // Every capture finished now (NVMe state still owed is streamed at once): sinks closed on return.
  Status Settle();
  // Elements [offset, offset + n) of slot g's buffer `kind` (StateBuffers' order). Write settles first.
  Status Read(int group, int kind, int64_t offset, int64_t n, float* out);
  Status Write(int group, int kind, int64_t offset, int64_t n, const float* in);
  // A compact kind's elements as stored (StateOwner::WriteStored): copied as they are. Unavailable for
  // f32 kinds, frozen groups and parameters of another dtype than the stored bf16.
  Status WriteStored(int group, int kind, int64_t offset, int64_t n, const void* values, const float* scales);
  // Where a compact kind's whole shard is kept as stored in host memory (StateOwner::StoredMemory),
  // for a writer that fills it in place; nullopt where WriteStored cannot take it or it is not host
  // memory (device, NVMe) or a load staged f32 values of it. Settles first.
  Result<std::optional<StoredPart>> StoredMemory(int group, int kind);
  // Seconds Update and Settle waited for captures since the last call (the engine's checkpoint stall).
  double TakeCaptureWait();

  // Where the stage-3 gatherer finds group g's parameter shard: resident (`shard`) or read from
  // NVMe (`load` into a 4 KiB-aligned buffer of load_bytes).
  struct ParamSource {
    const void* shard = nullptr;
    std::function<Result<IoHandle>(void* dst)> load;
    size_t load_bytes = 0;
  };
  virtual ParamSource Params(int group) const = 0;
  // Held parameter shards are in host memory while the device's buffers are not host memory: each
  // goes through a device copy before its all-gather.
  bool params_need_upload() const { return holds_params() && !device_->host_accessible(); }

  virtual SwapStats swap_stats() const { return {}; }

 protected:
  // The store's side of a group.
  struct Slot {
    Group in;
    DeviceBuffer master, exp_avg, exp_avg_sq, max_exp_avg_sq;  // resident state
    bool master_is_params = false;  // an f32 group's resident master: its parameters (HostParams), no copy
    DeviceBuffer host_grad, host_params;  // mirrors of device memory the host cannot address
    DeviceBuffer param_shard;             // held parameters in host memory
    // Compact state: q8 or q4 scales, and the f32 values a checkpoint load wrote, encoded at the next
    // RefreshParams or Update (a block is encoded whole).
    DeviceBuffer exp_avg_scale, exp_avg_sq_scale;
    std::vector<float> staged[3];
    bool compact() const { return !in.frozen && in.format.compact(); }
  };
  OptimizerStore(Communicator* comm, Device* device, Compute* compute, HostMemory* host, Compute* host_compute,
                 const Options& o);
  virtual Status Allocate() = 0;  // the trainable slots' state, after the mirrors and held parameters exist
  size_t esize(const Slot& s) const { return DTypeSize(s.in.dtype); }
  // How kind `kind` (0 master, 1 exp_avg, 2 exp_avg_sq, 3 max_exp_avg_sq) is kept: a compact slot's
  // moments in their precision, its master as the bf16 parameters where it has none; f32 otherwise.
  StateFormat KindFormat(const Slot& s, int kind) const;
  // n elements of a compact kind from the form the slot keeps it in (`raw` at shard element `off`; q8, q4:
  // `scales` from the block holding `off`) into f32, and back (whole blocks: `off` and, but at the end
  // of the shard, `n` multiples of the block). Kind 0 without a master: the parameters.
  Status DecodeKind(const Slot& s, int kind, const void* raw, const float* scales, int64_t off, int64_t n, float* out) const;
  Status EncodeKind(const Slot& s, int kind, const float* in, int64_t n, void* raw, float* scales) const;
  int kinds(const Slot& s) const { return s.in.frozen ? 1 : (o_.amsgrad ? 4 : 3); }
  // The gradient shard and the parameters where the CPU (offloaded optimizer) reads and writes them.
  const void* HostGrads(const Slot& s) const;
  void* HostParams(Slot& s);
  Status GradsDown(Slot& s);  // mirror <- device gradients (no-op without mirrors)
  Status ParamsUp(Slot& s);   // device parameters <- mirror (no-op without mirrors)
  // The copies of one Update around the per-group work: every gradient shard goes down first (queued
  // on the copy thread), each group's parameters go up as soon as the next group starts.
  class Copies;

  // ---- placement hooks of the state (trainable slots; frozen ones are the base's) ----
  // Host memory of a state kind, or null (device memory, NVMe).
  virtual float* HostState(Slot& s, int kind) = 0;
  // How the capture thread reads a trainable slot's kind (host memory, or device memory into the
  // bounce buffer); an empty function: the slot is on NVMe and comes with the next Update (Defer).
  virtual std::function<Result<const float*>(int kind, int64_t offset, int64_t n, float* bounce)> CaptureRead(Slot& s) = 0;
  // How it reads a compact slot's kinds as kept, where it can (host memory); empty: as f32 values only.
  virtual std::function<Result<std::optional<StoredPart>>(int kind, int64_t offset, int64_t n)> CaptureStored(Slot&) {
    return {};
  }
  // The NVMe part of a capture: delivered during the next Update, or now by Deliver.
  virtual void Defer(std::shared_ptr<internal::CaptureJob> /*job*/) {}
  virtual Status Deliver() { return Status(); }
  virtual Status ReadState(int g, int kind, int64_t offset, int64_t n, float* out) = 0;
  virtual Status WriteState(int g, int kind, int64_t offset, int64_t n, const float* in) = 0;
  virtual Status WriteStoredState(int g, int kind, int64_t offset, int64_t n, const void* values, const float* scales) = 0;
  // Whether WriteStored can take slot s's kind as stored (a compact kind; the bf16 parameters without a master).
  bool TakesStored(const Slot& s, int kind) const {
    return s.compact() && KindFormat(s, kind).compact() && (kind != 0 || s.in.dtype == DType::kBF16);
  }
  // Waits for the captures reading slot g's elements [0, end) (the next change of them).
  void WaitForCaptures(int g, int64_t end);
  bool capturing() const;
  int64_t capture_part() const;

  Communicator* comm_;
  Device* device_;
  Compute* compute_;
  HostMemory* host_;
  Compute* host_compute_;
  Options o_;
  bool mirror_ = false;  // an offloaded optimizer with device memory the host cannot address
  std::unique_ptr<ThreadPool> copier_;
  std::vector<Slot> slots_;

 private:
  Status InitFrozen(Slot& s);
  Result<const float*> FrozenRead(Slot& s, int64_t offset, int64_t n, float* out);
  Status FrozenWrite(Slot& s, int64_t offset, int64_t n, const float* in);
  void* FrozenParams(Slot& s) { return s.param_shard.empty() ? s.in.params : s.param_shard.data(); }

  double capture_wait_ = 0;
  std::unique_ptr<internal::Captures> captures_;  // after slots_: its thread reads them, and goes first
};

}  // namespace zrt
