// Writes one shard's data file and index into a checkpoint directory (the per-rank half of a save).
// Used by the Checkpointer's writer thread (fed by a ChunkQueue, the disk save's sink of a capture) and
// by the offline tools (reshard, import: chunks pulled from their sources). No communication.
//
// File protocol: chunks are written to rank-r.data.tmp as they come (any order; raw chunks 4 KiB-
// aligned so they stay O_DIRECT-able), then fsync, rename to rank-r.data, and the index written last,
// durably: its presence says the rank's data is durable. Durability steps ask the IoEngine's hooks.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "zrt/checkpoint/options.h"
#include "zrt/checkpoint/format.h"
#include "zrt/core/device.h"
#include "zrt/core/state_view.h"
#include "zrt/core/thread_pool.h"
#include "zrt/offload/io_engine.h"

namespace zrt::ckpt {

struct ShardWriteStats {
  int64_t stored_bytes = 0;
};

// The manifest of a save of `state` (its counters, groups and layouts; f32 state buffers only), with
// the save's nonce and chunk size. A view with groups over data-parallel groups of their own is
// refused: its manifest takes every rank's part (snapshot.h StartSnapshot).
Result<Manifest> ManifestFor(const StateView& state, const nlohmann::json& trainer_state, int64_t chunk_elements,
                             const std::string& nonce);
namespace internal {
// The same for any view, this rank's groups as they are (an own group's entry over its own group).
Result<Manifest> LocalManifest(const StateView& state, const nlohmann::json& trainer_state, int64_t chunk_elements,
                               const std::string& nonce);
}  // namespace internal

struct ShardWriteOptions {
  CompressOptions compression;
  // Encode (compress) and checksum chunks on these threads too, several chunks at a time (null: on the
  // calling thread only). The file is the same either way.
  ThreadPool* encoders = nullptr;
  // The part of the shard written (format.h PartPlan: a save spread over the shard's replicas, each
  // writing the chunks of its part), in [0, m.parts).
  int part = 0;
};

// One shard's files (or one part's of them), written chunk by chunk. Not thread-safe (one caller,
// typically a writer thread). The data file is preallocated for its chunks stored raw (IoFile::Reserve:
// every write is an overwrite) and cut to what was written at the end.
class ShardWriter {
 public:
  // Creates dir/rank-r.data.tmp (rank-r.part-p.data.tmp) for shard `shard` of the checkpoint `m` describes.
  static Result<std::unique_ptr<ShardWriter>> Open(IoEngine& io, const std::string& dir, const Manifest& m, int shard,
                                                   const ShardWriteOptions& options = {});
  // Waits for every write in flight (giving each chunk back); an unfinished file keeps its temp name.
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  // Chunk elements [offset, offset + count) of (group, kind): offset a multiple of the manifest's
  // chunk_elements, count the chunk's full size (the last one of a shard may be short), a chunk of
  // this writer's part (wants()). `data` (fp32,
  // 4 KiB-aligned for raw writes to go O_DIRECT) must stay valid until `release` is called, on this
  // thread, once the chunk is written or the writer gives up on it. Each chunk once, in any order.
  Status Write(int group, int kind, int64_t offset, int64_t count, const float* data, std::function<void()> release = {});
  // The same chunk already in the form the manifest stores its kind in (format.h GroupEntry::format(kind).Bytes of it: f32 or
  // bf16 values, or q8 codes then the blocks' scales), written as it is: nothing decoded or encoded.
  Status WriteStored(int group, int kind, int64_t offset, int64_t count, const void* stored, std::function<void()> release = {});
  // Whether the chunk at `offset` of (group, kind) is this writer's part's.
  bool wants(int group, int kind, int64_t offset) const;
  // Every chunk given so far is written and released.
  Status Flush();
  // Every chunk of the shard was written: fsync, rename, then the index. `stats` gets the stored bytes.
  Status Finish(ShardWriteStats* stats = nullptr);

 private:
  struct InFlight;
  ShardWriter(IoEngine& io, const std::string& dir, const Manifest& m, int shard, const ShardWriteOptions& o);
  Status Take(int group, int kind, int64_t offset, int64_t count, const char* data, bool stored, std::function<void()> release);
  Status Encode(InFlight& w, std::vector<char>* scratch) const;
  Status Issue(size_t in_flight);  // the oldest encoded chunk, written at the end of the file
  Status Drain(size_t keep);       // waits for writes until `keep` are in flight
  void Abandon();                  // every chunk on its way waited for and released (after an error)

  IoEngine& io_;
  std::string dir_;
  const Manifest& m_;
  ShardWriteOptions o_;
  std::vector<ShardLayout> layouts_;
  RankIndex index_;
  std::string tmp_;
  IoFile file_;
  std::deque<std::unique_ptr<InFlight>> encoding_, window_;
  std::vector<char> scratch_;
  std::vector<std::vector<std::vector<char>>> written_;  // [group][kind][chunk]: 0 to write, 1 given, 2 another part's
  int64_t file_offset_ = 0;
  int64_t stored_bytes_ = 0;
  Status failed_;
};

// Writes shard `shard` of `state` (options.part's chunks of it; its resident buffers where they are,
// others through the view's Read, a chunk at a time: memory stays O(chunk)), synchronously on this
// thread: tools and tests.
Status WriteShard(IoEngine& io, const std::string& dir, const Manifest& m, int shard, const StateView& state,
                  const ShardWriteOptions& options = {}, ShardWriteStats* stats = nullptr);

// One kind of a group as the save's queue holds it: its shard elements and the form its chunks are
// stored in (the manifest's: format.h GroupEntry::stored).
struct QueuedKind {
  int64_t count = 0;
  StateFormat format;
};
// The kinds of shard `layouts`' groups as the checkpoint `m` stores them.
std::vector<std::vector<QueuedKind>> QueuedKinds(const Manifest& m, const std::vector<ShardLayout>& layouts);

// The disk save's sink of a capture (core/state_view.h): each part is copied into chunk buffers
// (chunk-aligned within its buffer) in the form the checkpoint stores its kind (a compact part handed
// over as the owner keeps it, PutStored, is copied as it is; f32 values of a compact kind are encoded
// here), which the writer thread takes as they fill (Next), writes, and gives back (Release). The
// buffers (a chunk's stored bytes each) come from `spare` (the Checkpointer takes them back after the
// save, TakeBuffers, and hands them to the next: memory is touched once) or are allocated from
// `device` (which must outlive the queue), at most `budget_bytes` of them at once (0: no bound, the
// whole state if the writer lags; never fewer than the kinds + 2 of the largest chunks a capture can
// fill at once): Put waits for a buffer, so with a budget the owner's next change runs at the writer's
// pace at worst. Thread-safe: the capture's producers, the writer thread, and the save's owner (Stop).
class ChunkQueue final : public StateSink {
 public:
  // kinds[g][k]: group g's kind k. `keep` (empty: every chunk), [g][k][chunk]: whether the chunk is
  // wanted; the others' elements are passed over (a save spread over replicas).
  ChunkQueue(std::vector<std::vector<QueuedKind>> kinds, int64_t chunk_elements, int64_t budget_bytes, Device* device,
             std::vector<DeviceBuffer> spare, std::vector<std::vector<std::vector<char>>> keep = {});

  Status Put(int group, int buffer, int64_t offset, int64_t n, const float* data) override;
  Status PutStored(int group, int buffer, int64_t offset, int64_t n, const StateFormat& format, const void* values,
                   const float* scales) override;
  void Waited(double seconds) override;
  void Close(const Status& status) override;
  // The save gives up (its writer failed, or its Checkpointer is going away): Put fails at once from
  // now on and Next returns `why`.
  void Stop(const Status& why);
  bool closed() const;  // the delivery ended (Close), well or not

  struct Chunk {
    int group = 0, kind = 0;
    int64_t offset = 0, count = 0;
    DeviceBuffer buffer;  // the chunk's stored bytes (at least), 4 KiB-aligned; give it back with Release
  };
  // A filled chunk, or nullopt when none is filled yet (`wait` = false) or, waiting, once every part
  // arrived and was taken; an error if the delivery or the save stopped.
  Result<std::optional<Chunk>> Next(bool wait);
  void Release(DeviceBuffer buffer);
  double waited() const;       // what the owner waited for this capture (Waited)
  int64_t peak_bytes() const;  // the most chunk buffers' bytes held at once
  // Elements of compact kinds that arrived as f32 values and were encoded here (0 when the owner hands
  // over every compact part as it keeps it).
  int64_t encoded_elements() const;
  // Every buffer the queue holds, for the next save (once the writer gave its chunks back).
  std::vector<DeviceBuffer> TakeBuffers();

 private:
  struct Filling {
    QueuedKind form;   // the buffer's elements and stored form
    int64_t next = 0;  // the next offset expected
    DeviceBuffer buf;  // the chunk being filled (from next rounded down to a chunk)
  };
  // `fill(chunk, chunk_count, at, done, take)` copies the part's elements [done, done + take) to
  // element `at` of the chunk buffer `chunk` of `chunk_count` elements, without the lock.
  template <typename Fill>
  Status Arrive(int group, int buffer, int64_t offset, int64_t n, Fill fill);
  Result<Filling*> Expect(int group, int buffer, int64_t offset, int64_t n);
  Result<DeviceBuffer> Acquire(std::unique_lock<std::mutex>& lock, int64_t bytes);

  const int64_t chunk_;
  std::vector<std::vector<std::vector<char>>> keep_;
  Device* device_;
  std::vector<DeviceBuffer> spare_;
  int64_t max_bytes_ = 0, held_ = 0, peak_ = 0;  // buffer bytes
  int64_t encoded_ = 0;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::vector<Filling>> fill_;
  std::deque<Chunk> ready_;
  bool closed_ = false, stopped_ = false;
  Status status_;  // the delivery's (Close), or Stop's
  double waited_ = 0;
};

// The disk save's writer: shard `shard` written from `queue` chunk by chunk as they fill, until the
// delivery ends; then the files are finished. A failure stops the queue (the owner stops putting and
// never waits for buffers again). `m` must outlive the call. `groups`: the queue's group g is the
// manifest's groups[g] (empty: the same; snapshot.h SnapshotStart::groups).
Status WriteQueuedShard(IoEngine& io, const std::string& dir, const Manifest& m, int shard, ChunkQueue& queue,
                        const ShardWriteOptions& options = {}, ShardWriteStats* stats = nullptr, std::span<const int> groups = {});

}  // namespace zrt::ckpt
