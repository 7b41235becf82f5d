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
#include <string_view>
#include <vector>

#include "zrt/core/dtype.h"
#include "zrt/core/shard_layout.h"
#include "zrt/core/status.h"
#include "zrt/core/tensor_spec.h"

namespace zrt {

// ---- How a buffer is stored (docs/checkpoint-format.md "Stored state", docs/kernels.md "Compact
// state"; the q8 rule is core/quant_math.h; defined in state_format.cc) ----
// The one definition the engine's configuration, its store, the checkpoint format, the memory tier
// and the tools share. A Precision is what a trainer chooses per moment; a StateFormat is a buffer
// stored in one: the precision, and for q8 the code's sign (the first moment's code is signed, the
// second's not) and the elements per block. A stored part of n elements is its values (ValuesBytes:
// 4, 2 or 1 bytes each, q4 two a byte), followed (q8, q4) by its blocks' f32 scales, the codes and the
// scales in places of their own where the owner keeps them so. Parts start at a block boundary; only
// the last may end inside a block.

enum class Precision : uint8_t {
  kF32 = 0,   // f32 values
  kBF16 = 1,  // bf16 values (round to nearest even)
  kQ8 = 2,    // 8-bit codes per block with an f32 scale per block
  kQ4 = 3,    // 4-bit codes (two a byte) per block with an f32 scale per block
  kBf16 = kBF16,  // 0.1's spelling (kernels::MomentFormat, now an alias of this type)
};
std::string_view PrecisionName(Precision p);  // "f32", "bf16", "q8", "q4"
// The names above; InvalidArgument listing them otherwise.
Result<Precision> ParsePrecision(std::string_view name);
// Bits of one element's value: f32 32, bf16 16, q8 8, q4 4 (its code; the block's scale lies apart).
constexpr int64_t ValueBits(Precision p) {
  return p == Precision::kF32 ? 32 : p == Precision::kBF16 ? 16 : p == Precision::kQ8 ? 8 : 4;
}
// Whether values are codes in blocks with an f32 scale each.
constexpr bool IsBlockwise(Precision p) { return p == Precision::kQ8 || p == Precision::kQ4; }

struct StateFormat {
  Precision precision = Precision::kF32;
  bool is_signed = false;  // q8, q4: the first moment's code
  int64_t block = 0;       // q8, q4: elements per block (a power of two); 0 otherwise

  // A buffer of `kind` ("master", "exp_avg", ...) stored as `p`: q8 and q4 codes are signed for
  // exp_avg only (the format's rule: the one place a kind's name decides it).
  static StateFormat Of(Precision p, std::string_view kind, int64_t block);

  bool compact() const { return precision != Precision::kF32; }
  bool blockwise() const { return IsBlockwise(precision) && block > 0; }
  // The bytes a value is moved in (byte shuffles, compression): 4, 2, or 1 for codes (q4: a pair).
  int64_t value_bytes() const { return ValueBits(precision) >= 8 ? ValueBits(precision) / 8 : 1; }
  int64_t Scales(int64_t n) const { return blockwise() ? (n + block - 1) / block : 0; }
  // Bytes of n values (q4: a last odd one takes a byte); from a block boundary, also where element n's
  // value starts.
  int64_t ValuesBytes(int64_t n) const { return (n * ValueBits(precision) + 7) / 8; }
  int64_t Bytes(int64_t n) const { return ValuesBytes(n) + 4 * Scales(n); }  // values, then scales

  // `n` values into their stored form, rounding (bf16: to nearest even; q8, q4: each block's scale its
  // largest magnitude). `scales`: Scales(n) floats (unused unless blockwise).
  void Encode(const float* in, int64_t n, void* values, float* scales) const;
  // The same, refusing values the form does not hold exactly (InvalidArgument naming the element):
  // a save never changes a value.
  Status EncodeExact(const float* in, int64_t n, void* values, float* scales) const;
  // What `n` stored elements from element `first` of the buffer decode to: `values` from the byte
  // holding that element's (q4: its nibble by first's parity), `scales` from the scale of the block
  // holding it. No check (the caller's own memory).
  void Decode(const void* values, const float* scales, int64_t first, int64_t n, float* out) const;
  // The form is one encoding writes (whole blocks): q8 and q4 scales finite and >= 0, codes no larger
  // than 1.0's and no negative zero, a block with a positive scale holding 1.0's code and one with a
  // zero scale only code 0; DataLoss naming the block otherwise. What a load checks before it trusts
  // stored bytes.
  Status Check(const void* values, const float* scales, int64_t n) const;
  // Check, then Decode.
  Status DecodeChecked(const void* values, const float* scales, int64_t n, float* out) const;

  friend bool operator==(const StateFormat&, const StateFormat&) = default;
};

// Check of q8 or q4 codes in two halves: the codes taken as they go by, in pieces of any size and in
// order (a copy's bounce blocks, while in cache), then judged with the scales once all are there: the
// same verdicts and messages as StateFormat::Check. Another format: every code passes.
class CodeScan {
 public:
  CodeScan(const StateFormat& format, int64_t n);
  void Take(const char* codes, size_t bytes);  // the next bytes of codes (any beyond n's are ignored)
  static void Seen(void* scan, const char* codes, size_t bytes) { static_cast<CodeScan*>(scan)->Take(codes, bytes); }
  Status Check(const void* codes, const float* scales) const;  // every code taken, and where they are now

 private:
  StateFormat format_;
  int64_t n_;
  bool whole_ = false;                            // blockwise, of whole blocks
  int64_t block_bytes_ = 0, bytes_ = 0, at_ = 0;  // bytes of a block, of all n codes, taken
  std::vector<uint8_t> largest_, negative_zero_;  // per block
};

// This rank's shard of one group's flat buffer: `count` = layout.shard_size() elements of `dtype`.
// `data`: host memory that loads write and captures read directly (resident); null: the state lives
// elsewhere (device memory, NVMe swap files, a cast of the parameters) and is reached through the
// view's owner.
struct StateBuffer {
  std::string kind;  // "master" (fp32 weights), "exp_avg", "exp_avg_sq", "max_exp_avg_sq"
  DType dtype = DType::kF32;
  void* data = nullptr;
  int64_t count = 0;
  // How the owner keeps it, and so how a disk checkpoint stores it: f32, bf16 or q8 (a q8 block a
  // power of two dividing the layout's alignment). The view's values are f32 either way; a compact
  // buffer's are exactly what its stored form decodes to.
  StateFormat format;
  bool resident() const { return data != nullptr || count == 0; }
};

struct StateGroup {
  std::string name;
  std::vector<TensorSpec> tensors;  // in layout order
  ShardLayout layout;               // over `tensors`, for the owner's world size
  std::vector<StateBuffer> buffers;
  double lr = 0;
  double weight_decay = 0;
  // The world ranks of the group's own data-parallel group, in its order (the engine's
  // ParamOptions::data_parallel: the layout is over it at stages 1-3, member i holding shard i; at
  // stage 0 each member holds all of it), or empty: the view's mesh. A checkpoint (disk or memory
  // tier) records it (the group's shards in its members' files); the full state and safetensors
  // initialisation read it.
  std::vector<int> own_group;
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
  StateFormat format;
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
  // The same part of a compact buffer as the owner keeps it (StateBuffer::format, `format` here):
  // bf16 values, or q8 codes of whole blocks from a block boundary with their blocks' scales. The
  // default decodes them and puts the values; a sink that stores the form (the memory tier) takes it
  // as it is, nothing decoded and encoded again.
  virtual Status PutStored(int group, int buffer, int64_t offset, int64_t n, const StateFormat& format, const void* values,
                           const float* scales);
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
  // A compact buffer's elements [offset, offset + n) as they are stored (StateBuffer::format): bf16
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
  // Whether a group is over a data-parallel group of its own (StateGroup::own_group; such a view has
  // no hybrid sharding: `rank` is the rank in the world).
  bool has_own_groups() const;
  // This rank's shard of group `g`'s layout: 0 for one shard, its place in the group's own group, or
  // `rank` (-1: the rank is not in its own group, a malformed view).
  int ShardOf(const StateGroup& g) const;
  // OK unless a group is over a data-parallel group of its own, which `what` (a manifest of one rank's
  // view alone, ...) cannot describe: FailedPrecondition naming it.
  Status CheckOneMesh(std::string_view what) const;
};

}  // namespace zrt
