// OptimizerStore: where the optimizer state lives and how a step reaches it. The one component of the
// engine that knows placement (../shared/DESIGN.md "runtime/"): fp32 master weights, Adam moments and
// max moments in device memory, in host memory (ZeRO-Offload) or in swap files on NVMe streamed
// through host memory (ZeRO-Infinity); host mirrors of device memory the host cannot address (the
// gradient shard going down, the updated parameters going up, overlapped with the CPU Adam on a copy
// thread); and, at stage 3 with offload.params, this rank's parameter shards themselves.
//
// Two implementations behind this interface: resident (device or host memory) and swapped (NVMe).
// The engine hands over, per group, pointers to its own gradient shard and parameter block at Init;
// the store owns every buffer it allocates and never reaches back into the engine. A step is
//   engine: flush -> norm -> scalars -> store.Update(window -> Adam) -> gather.
//
// Thread-safety: one thread at a time (the engine's); the copy thread is internal.
#pragma once

#include <functional>
#include <memory>
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

class OptimizerStore {
 public:
  // One parameter group as the engine hands it over at Init.
  struct Group {
    std::string name;   // for errors
    DType dtype = DType::kF32;       // of the parameters
    DType grad_dtype = DType::kF32;  // of the gradient shard (dtype, or f32 with fp32 main gradients)
    int64_t elements = 0;       // this rank's shard
    const void* grads = nullptr;  // this rank's reduced gradient shard (the engine's device memory)
    // This rank's block of the model parameters (the engine's device memory); null when the store
    // holds the parameter shard (holds_params()).
    void* params = nullptr;
    // Writes the fp32 initial values of shard elements [offset, offset + count) into out (padding
    // elements are left as they are: zero). Used only during Init.
    std::function<void(int64_t offset, int64_t count, float* out)> init;
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
  virtual ~OptimizerStore();

  // Stage 3 with offload.params: the store holds the parameter shards (host memory or NVMe), and
  // Group::params is null.
  bool holds_params() const { return o_.offload.params != OffloadTarget::kNone; }

  // Allocates and initialises the state (master from Group::init, zero moments) and this rank's
  // parameters (cast from master). Collective: a failure on one rank (no space on its disk) is every
  // rank's error.
  Status Init(std::vector<Group> groups);

  // A contiguous part of one group's shard during Update: the state, the gradients and where the
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
  };
  using UpdateFn = std::function<Status(const Window&)>;
  // Calls fn once for every part of every group, in group order (whole shards when resident, sub-groups
  // when streamed), and brings the updated parameters to the engine's buffers. Collective for the
  // swapped store (agreement before anything changes and after streaming).
  virtual Status Update(const UpdateFn& fn) = 0;

  // Casts master into the parameters (after a checkpoint load wrote master). Collective.
  virtual Status RefreshParams() = 0;

  // Group g's state as a checkpoint sees it: master, exp_avg, exp_avg_sq[, max_exp_avg_sq].
  virtual std::vector<StateBuffer> StateBuffers(int group) = 0;

  // StateView::defer and deliver for the buffers StateBuffers gives without data or snapshot (the
  // swapped store's): Defer registers `sink` (beside any others), which receives every such buffer of
  // every group (indices: the store's groups, the kinds' order) during the next Update, each
  // sub-group before Adam changes it, or at once from Deliver, or before a StateBuffer::write changes
  // the state. A sink registered when the store is destroyed is closed with an error.
  virtual bool can_defer() const { return false; }
  virtual Status Defer(std::shared_ptr<StateSink> sink);
  virtual Status Deliver() { return Status(); }

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
    DeviceBuffer host_grad, host_params;  // mirrors of device memory the host cannot address
    DeviceBuffer param_shard;             // held parameters in host memory
  };
  OptimizerStore(Communicator* comm, Device* device, Compute* compute, HostMemory* host, Compute* host_compute,
                 const Options& o);
  virtual Status Allocate() = 0;  // after the mirrors and held parameters exist
  size_t esize(const Slot& s) const { return DTypeSize(s.in.dtype); }
  // The gradient shard and the parameters where the CPU (offloaded optimizer) reads and writes them.
  const void* HostGrads(const Slot& s) const;
  void* HostParams(Slot& s);
  Status GradsDown(Slot& s);  // mirror <- device gradients (no-op without mirrors)
  Status ParamsUp(Slot& s);   // device parameters <- mirror (no-op without mirrors)
  // The copies of one Update around the per-group work: every gradient shard goes down first (queued
  // on the copy thread), each group's parameters go up as soon as the next group starts.
  class Copies;

  Communicator* comm_;
  Device* device_;
  Compute* compute_;
  HostMemory* host_;
  Compute* host_compute_;
  Options o_;
  bool mirror_ = false;  // an offloaded optimizer with device memory the host cannot address
  std::unique_ptr<ThreadPool> copier_;
  std::vector<Slot> slots_;
};

}  // namespace zrt
