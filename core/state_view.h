// StateView: the engine's model and optimizer state as named flat shard buffers plus the layouts that
// say what each element is. The checkpoint module works on this view only, so it never includes the
// engine (../shared/DESIGN.md layers).
//
// Lifetime: the pointers are the engine's; a view is valid until the engine's next mutating call
// (which first runs the waits registered with StateView::hold).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "zrt/core/dtype.h"
#include "zrt/core/shard_layout.h"
#include "zrt/core/status.h"
#include "zrt/core/tensor_spec.h"

namespace zrt {

// This rank's shard of one group's flat buffer: `count` = layout.shard_size() elements of `dtype`.
// Resident state (host memory) has `data`; state that lives elsewhere has data == nullptr and is
// reached through read/write of `n` elements at element `offset`: device memory (snapshot = true:
// read is a fast copy, so a checkpoint copies it into host staging while training waits and writes in
// the background) or NVMe swap files (snapshot = false: a checkpoint takes it as the owner's next
// update streams it through host memory, StateView::defer, or else reads it at once).
// concurrent_read: `read` may also run on another thread while the owner goes on, until the waits
// registered with StateView::hold return (device memory copied on a stream of its own): the memory
// tier and the disk checkpointer's writer then copy this buffer in the background as they do host
// memory.
struct StateBuffer {
  std::string kind;  // "master" (fp32 weights), "exp_avg", "exp_avg_sq", "max_exp_avg_sq"
  DType dtype = DType::kF32;
  void* data = nullptr;
  int64_t count = 0;
  std::function<Status(int64_t offset, int64_t n, void* out)> read;
  std::function<Status(int64_t offset, int64_t n, const void* in)> write;
  bool snapshot = false;
  bool concurrent_read = false;
  bool resident() const { return data != nullptr || count == 0; }
  // Whether a thread other than the owner's may copy it (until the view's holds return).
  bool copyable_anywhere() const { return resident() || (read && concurrent_read); }
};

struct StateGroup {
  std::string name;
  std::vector<TensorSpec> tensors;  // in layout order
  ShardLayout layout;               // over `tensors`, for the engine's world size
  std::vector<StateBuffer> buffers;
  double lr = 0;
  double weight_decay = 0;
};

// The owner's counters a checkpoint carries besides the buffers.
struct StateCounters {
  int64_t step = 0;               // optimizer steps taken (skipped ones excluded)
  double loss_scale = 1;          // current dynamic/static loss scale
  int64_t scaler_good_steps = 0;  // dynamic loss scaler's counters
  int scaler_hysteresis_left = 1;
  // The owner's settings that evolve or must come back with the state (the engine: its lr, schedule
  // and per-tensor optimizer settings), as the text of a JSON object; carried verbatim.
  std::string engine_state = "{}";
};

// Receives the deferred buffers (every one with data == nullptr and snapshot == false) of a StateView
// during its owner's next update (StateView::defer). Called on the owner's thread.
class StateSink {
 public:
  virtual ~StateSink() = default;
  // `n` elements of StateView::groups[group].buffers[buffer] from element `offset`, as they were when
  // the view was taken; each buffer's parts come in order of offset. `data` is valid during the call
  // only. An error ends the delivery (the update itself goes on).
  virtual Status Put(int group, int buffer, int64_t offset, int64_t n, const float* data) = 0;
  // The delivery is over: every part was put (ok) or it stopped (why). Called once.
  virtual void Close(const Status& status) = 0;
  // False once the receiver gave up: the owner drops the sink without delivering or closing it.
  virtual bool wanted() const = 0;
};

struct StateView {
  int rank = 0;
  int world_size = 1;
  int stage = 0;
  StateCounters counters;
  std::vector<StateGroup> groups;
  // Set by the state's owner (the engine): after a load wrote the buffers, takes the saved counters
  // and re-derives what depends on the state (the parameters, from master). Collective; called by
  // ckpt::Resume on every rank once every rank's load succeeded. Empty: nothing to re-derive.
  std::function<Status(const StateCounters& saved)> restore;
  // Set by the owner: told how long a checkpoint's snapshot made training wait (its step metrics).
  std::function<void(double seconds)> stalled;
  // Set by an owner whose non-resident state passes through host memory at every update (NVMe
  // offload: every sub-group is read, updated and written back): `defer(sink)` registers `sink` to
  // receive the deferred buffers as they are now, part by part, during the owner's next update, each
  // part before it changes (or before anything else changes them: a load); `deliver()` streams them
  // to the registered sinks at once (a save that cannot wait for the next step; not collective).
  // Several sinks may wait at once (a disk save and a memory-tier snapshot of the same step).
  std::function<Status(std::shared_ptr<StateSink> sink)> defer;
  std::function<Status()> deliver;
  // Set by the owner: `hold(wait)` registers `wait`, which the owner calls on its thread before it
  // next changes a resident buffer or frees the view's memory (its next update, a load, its
  // destruction): a checkpoint copying the resident buffers in the background (the memory tier)
  // finishes its copy there, so training waits only for what the copy has not done by then.
  // `settle()` runs the registered waits now (a writer of the buffers other than the owner calls it
  // first: Load). Both empty: the owner cannot hold, and a snapshot copies while training waits.
  std::function<void(std::function<void()> wait)> hold;
  std::function<void()> settle;
};

}  // namespace zrt
