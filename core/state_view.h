// StateView: a rank's model and optimizer state as the checkpoint module sees it: named flat shard
// buffers, the layouts that say what each element is, and one way to take a snapshot of them
// (Capture). The checkpoint module works on this view only, so it never includes the engine
// (../shared/DESIGN.md layers).
//
// A snapshot is a stream: Capture hands the state, as it is at the call, to a StateSink part by part
// and closes it. Where the state lives decides how it is streamed, and that is the owner's business
// (the engine's optimizer store: runtime/optimizer_store.h), not the receivers': the disk writer and
// the memory tier are two sinks of the same stream.
//
// Lifetime: the pointers are the owner's; a view is valid until the owner's next structural change
// (the engine: for its life).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "zrt/core/dtype.h"
#include "zrt/core/shard_layout.h"
#include "zrt/core/status.h"
#include "zrt/core/tensor_spec.h"

namespace zrt {

// This rank's shard of one group's flat buffer: `count` = layout.shard_size() elements of `dtype`.
// `data`: host memory that loads write and captures read directly (resident); null: the state lives
// elsewhere (device memory, NVMe swap files, a cast of the parameters) and is reached through the
// view's owner.
// How the owner keeps a kind, and so how a disk checkpoint stores it: f32 values, bf16 values, or q8
// (8-bit codes per block of `block` elements with an f32 scale; core/quant_math.h). The view's values
// are f32 either way; a bf16 or q8 kind's are exactly what its stored form decodes to.
enum class StoredAs : uint8_t { kF32, kBF16, kQ8 };
// Bytes of one element's value in a stored form: f32 4, bf16 2, q8 1 (its code; the block's scale
// lies apart).
constexpr int64_t ValueBytes(StoredAs s) { return s == StoredAs::kF32 ? 4 : s == StoredAs::kBF16 ? 2 : 1; }

struct StateBuffer {
  std::string kind;  // "master" (fp32 weights), "exp_avg", "exp_avg_sq", "max_exp_avg_sq"
  DType dtype = DType::kF32;
  void* data = nullptr;
  int64_t count = 0;
  StoredAs stored = StoredAs::kF32;
  int64_t block = 0;  // q8: elements per block (a power of two dividing the layout's alignment)
  bool resident() const { return data != nullptr || count == 0; }
};

struct StateGroup {
  std::string name;
  std::vector<TensorSpec> tensors;  // in layout order
  ShardLayout layout;               // over `tensors`, for the owner's world size
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

// Where a part of a compact buffer is, as its owner keeps it: bf16 values, or q8 codes of whole blocks
// of `block` (`is_signed`: the first moment's code) and their blocks' scales. Read by a capture;
// written only through StateView::StoredMemory's contract.
struct StoredPart {
  StoredAs as = StoredAs::kF32;
  int64_t block = 0;
  bool is_signed = false;
  void* values = nullptr;
  float* scales = nullptr;
};

// Receives one capture: the state as it was when Capture was called.
// Threading: Put and Close come from one thread at a time, but not always the same one (the owner's
// capture thread, or its training thread as a step streams NVMe state); Waited from any thread.
class StateSink {
 public:
  virtual ~StateSink() = default;
  // `n` elements of groups[group].buffers[buffer] from element `offset`; each buffer's parts come
  // once, in order of offset (parts of different buffers interleave). `data` is valid during the call
  // only. An error ends the delivery to this sink: no more Put, and Close gets the error.
  virtual Status Put(int group, int buffer, int64_t offset, int64_t n, const float* data) = 0;
  // The same part of a compact buffer as the owner keeps it (StateBuffer::stored, `stored` here):
  // bf16 values, or q8 codes of whole blocks of `block` from a block boundary (`is_signed`: the first
  // moment's code) with their blocks' scales. The default decodes them and puts the values; a sink
  // that stores the form (the memory tier) takes it as it is, nothing decoded and encoded again.
  virtual Status PutStored(int group, int buffer, int64_t offset, int64_t n, StoredAs stored, int64_t block, bool is_signed,
                           const void* values, const float* scales);
  // The owner's thread waited `seconds` for this capture before changing its state (what the capture
  // cost training beyond the Capture call itself).
  virtual void Waited(double /*seconds*/) {}
  // The delivery is over: every part was put (ok), or why not. Called once, last.
  virtual void Close(const Status& status) = 0;
};

// The owner of a view's state (the engine). Called on the owner's thread, never during its step.
class StateOwner {
 public:
  virtual ~StateOwner() = default;
  // Starts streaming this rank's state as it is now into `sink` and returns: host memory is copied
  // on a thread of the owner's, device memory on a copy stream, and NVMe state is handed over as the
  // owner's next step streams it through host memory; the owner's next change of any part waits only
  // for that part to be put. A slow sink (Put blocks) slows that change down, nothing else. The sink
  // is closed when every part was put, or with the first error.
  virtual Status Capture(std::shared_ptr<StateSink> sink) = 0;
  // Every capture is finished now (state waiting for the next step is streamed at once); their sinks
  // are closed when this returns. A writer of the state other than the owner calls it first (Load).
  virtual Status Settle() = 0;
  // Random access for loads and queries, synchronous; Write settles first.
  virtual Status Read(int group, int buffer, int64_t offset, int64_t n, float* out) = 0;
  virtual Status Write(int group, int buffer, int64_t offset, int64_t n, const float* in) = 0;
  // A compact buffer's elements [offset, offset + n) as they are stored (StateBuffer::stored): bf16
  // values, or q8 codes of whole blocks from a block boundary (n: whole blocks, or up to the end of
  // the shard) with their blocks' scales; the form already checked by the caller (a load: it is one
  // that encoding writes). Restored as stored: nothing decoded or encoded again. Settles first.
  // Unavailable where the owner (or this part of its state) takes f32 values only: use Write.
  virtual Status WriteStored(int /*group*/, int /*buffer*/, int64_t /*offset*/, int64_t /*n*/, const void* /*values*/,
                             const float* /*scales*/) {
    return UnavailableError("the state's owner takes f32 values only");
  }
  // Where a compact buffer's whole shard is kept in host memory as stored (StoredPart: its values or
  // codes from element 0, the q8 blocks' scales from block 0), for a writer that fills all of it in
  // place (the memory tier's peer restore: the transfer lands there, then is checked as a load checks
  // it, the form included). Settles first. Nullopt where the owner keeps it otherwise (f32 values,
  // device or NVMe memory, values a load staged): write it with WriteStored or Write then.
  virtual Result<std::optional<StoredPart>> StoredMemory(int /*group*/, int /*buffer*/) { return std::optional<StoredPart>(); }
  // After a load wrote the buffers: takes the saved counters and re-derives what depends on the state
  // (the parameters, from master). Collective.
  virtual Status Restore(const StateCounters& saved) = 0;
  // A saver made the owner's thread wait `seconds` besides Capture (its agreement and set-up): the
  // owner's step metrics count it.
  virtual void Stalled(double /*seconds*/) {}
};

// The mesh: `world_size` ranks hold the state; each group's layout is over S = layout.world_size()
// shards. S = world_size: every rank its own shard (plain ZeRO). S = 1 (stage 0): one shard, on every
// rank. Otherwise (hybrid sharding) ranks form shard groups of S consecutive ranks, and rank q holds
// shard q % S, as do the other R - 1 = world_size / S - 1 ranks of its replica group: `rank` is the
// shard (the layout's rank) and the first replica group's ranks are shards 0..S-1 themselves.
struct StateView {
  int rank = 0;        // this rank's shard in the layouts (stage 0: the rank in the world)
  int world_size = 1;  // ranks in the world
  int stage = 0;
  StateCounters counters;
  std::vector<StateGroup> groups;
  // Null: every buffer is resident and nothing else changes it while a capture runs (tools, tests).
  StateOwner* owner = nullptr;

  // The owner's Capture; without an owner, the resident buffers are put now, on this thread.
  Status Capture(std::shared_ptr<StateSink> sink) const;
  // The owner's Settle, Read, Write and Restore; without an owner, resident buffers are read and
  // written directly, Settle and Restore do nothing, and a buffer that is not resident is an error.
  Status Settle() const;
  Status Read(int group, int buffer, int64_t offset, int64_t n, float* out) const;
  Status Write(int group, int buffer, int64_t offset, int64_t n, const float* in) const;
  // The owner's WriteStored; Unavailable without an owner (resident buffers hold f32 values).
  Status WriteStored(int group, int buffer, int64_t offset, int64_t n, const void* values, const float* scales) const;
  // The owner's StoredMemory; nullopt without an owner.
  Result<std::optional<StoredPart>> StoredMemory(int group, int buffer) const;
  Status Restore(const StateCounters& saved) const;
};

}  // namespace zrt
