// Writes one shard's data file and index into a checkpoint directory (the per-rank half of a save).
// Used by the Checkpointer's background thread and by the offline tools (reshard, import). No
// communication.
#pragma once

#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "zrt/checkpoint/compression.h"
#include "zrt/checkpoint/format.h"
#include "zrt/core/device.h"
#include "zrt/core/state_view.h"
#include "zrt/core/thread_pool.h"
#include "zrt/offload/io_engine.h"

namespace zrt::ckpt {

// This shard's state: state[g][k] holds the shard's elements of manifest group g, kind k (fp32). A
// buffer's data must stay valid until WriteShard returns; 4 KiB-aligned data lets raw chunks go
// O_DIRECT. State that is not resident (NVMe offload) has no data and a `read`, asked for one chunk at
// a time (memory stays O(chunk)).
using ShardState = std::vector<std::vector<StateBuffer>>;

struct ShardWriteStats {
  int64_t stored_bytes = 0;
};

// The manifest of a save of `state` (its counters, groups and layouts; f32 state buffers only), with
// the save's nonce and chunk size.
Result<Manifest> ManifestFor(const StateView& state, const nlohmann::json& trainer_state, int64_t chunk_elements,
                             const std::string& nonce);

// The buffers a StateView defers (StateView::defer: NVMe state its owner hands over during its next
// step, before changing it), arriving while their shard is written. The owner's thread Puts parts,
// copied into chunk buffers from a bounded pool (2 x kinds + 8 chunks); Put waits while every buffer
// is full and queued or being written, so the step runs at the writer's pace at worst. WriteShard
// takes the chunks in the order they fill, one buffer's parts in order of offset.
// Thread-safe: one putting thread, the writer, and the save's owner (Stop).
class ArrivingState final : public StateSink {
 public:
  // counts[g][k]: the elements of group g's buffer k that arrive (0: none arrive, it is not deferred).
  ArrivingState(std::vector<std::vector<int64_t>> counts, int64_t chunk_elements);
  Status Put(int group, int buffer, int64_t offset, int64_t n, const float* data) override;
  void Close(const Status& status) override;
  bool wanted() const override;
  // The save gives up (its writer failed, or its Checkpointer is going away): Put fails at once from
  // now on and Next returns `why`.
  void Stop(const Status& why);
  // The delivery ended (Close), well or not.
  bool closed() const;

  struct Chunk {
    int group = 0, kind = 0;
    int64_t offset = 0, count = 0;
    DeviceBuffer buffer;  // chunk_elements x 4 bytes, 4 KiB-aligned; give it back with Release
  };
  // A filled chunk, or nullopt when none is filled yet (`wait` = false) or, waiting, once every part
  // arrived and was taken; an error if the delivery stopped or the save was stopped.
  Result<std::optional<Chunk>> Next(bool wait);
  void Release(DeviceBuffer buffer);

 private:
  struct Filling {
    int64_t count = 0;  // elements that arrive
    int64_t next = 0;   // the next offset expected
    DeviceBuffer buf;   // the chunk being filled (from chunk_start = next rounded down)
  };
  Result<DeviceBuffer> Acquire(std::unique_lock<std::mutex>& lock);

  CpuDevice host_;  // before every buffer: destroyed after them
  const int64_t chunk_;
  size_t pool_max_ = 0, allocated_ = 0;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::vector<Filling>> fill_;
  std::vector<DeviceBuffer> free_;
  std::deque<Chunk> ready_;
  bool closed_ = false;
  Status status_;  // the delivery's (Close), or Stop's
  bool stopped_ = false;
};

struct ShardWriteOptions {
  CompressOptions compression;
  // Encode (compress) and checksum chunks on these threads too, several chunks at a time (null: on the
  // calling thread only). The file is the same either way.
  ThreadPool* encoders = nullptr;
  // Supplies the buffers of `state` that have neither data nor a read (their chunks are written as
  // they fill, after the others); a failed write stops it.
  ArrivingState* arriving = nullptr;
};

// dir/rank-r.data (temp name, fsync, rename) then dir/rank-r.index.json (written last, durably: its
// presence says the rank's data is durable). Durability steps ask io's hooks.
Status WriteShard(IoEngine& io, const std::string& dir, const Manifest& m, int rank, const ShardState& state,
                  const ShardWriteOptions& options = {}, ShardWriteStats* stats = nullptr);

}  // namespace zrt::ckpt
