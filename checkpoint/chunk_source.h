// The chunk pipeline of a checkpoint's reads (load.cc plans what to read; this reads it): the saved
// shards opened on demand, each index read and checked against the manifest (its chunks tile every
// (group, kind) exactly once) before any of its chunks is read; whole buffers read in place through
// one pipeline of reads; ranges read through a small cache of decoded chunks, with a read-ahead of
// the chunks planned in the order they will be asked for. Every chunk is checked (checksum, decode)
// before a byte of it is used. A data file that lives in memory (tmpfs: the memory tier's copies) is
// not read through the I/O engine: it is mapped, and each chunk copied out of the mapping and hashed
// in one pass (a read would copy it from the same pages, then the check read it again).
// Internal to zrt_checkpoint; not thread-safe.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "zrt/checkpoint/files.h"

namespace zrt::ckpt::internal {

struct FreeFloatsFwd {
  void operator()(void* p) const { std::free(p); }
};

// The saved shards, opened on demand: each index is read and checked against the manifest (its chunks
// tile every (group, kind) exactly once) before any of its chunks is read. Callers name a group's
// saved shard (`rank` below: the shard of that group's layout); the file holding it is the manifest's
// business (format.h FileOf).
class ShardSource {
 public:
  ShardSource(const CheckpointDir& dir, const Manifest& m, std::vector<ShardLayout> layouts, IoEngine& io)
      : dir_(dir), m_(m), io_(io), layouts_(std::move(layouts)) {}
  ~ShardSource() {
    for (Ahead& a : ahead_) (void)a.handle.Wait();  // nothing is freed while the engine still writes it
  }
  const ShardLayout& layout(int g) const { return layouts_[static_cast<size_t>(g)]; }
  int64_t bytes_read() const { return bytes_read_; }

  // Read-ahead: the chunks Read will be asked for, in order (Load plans every read before the first).
  // They are read asynchronously through the IoEngine, Start's `window` bytes at most in flight or waiting,
  // and each is checked when Read reaches it while the next ones are on their way.
  Status Plan(int rank, int group, int kind, int64_t begin, int64_t count);
  // Starts the read-ahead of what was planned, `window` bytes at most.
  void Start(int64_t window);

  // The whole of saved rank `rank`'s (group, kind) straight into `dst` (`count` elements: a target
  // buffer laid out exactly as the saved shard), for every target in one pipeline: raw chunks are read
  // in place, 16 in flight across the targets (a buffer of a few chunks leaves no bubble), and checked
  // there; no copy. Compressed chunks are decoded into place.
  struct Whole {
    int rank, group, kind;
    float* dst;
    int64_t count;
    std::string what;  // the error's context
  };
  Status ReadWhole(const std::vector<Whole>& targets);

  // The whole of saved rank `rank`'s (group, kind), a compact kind of `count` elements, chunk by chunk
  // in its stored form, each checked (StoredChunk): fn(first element, elements, stored form).
  Status ForEachStored(int rank, int group, int kind, int64_t count,
                       const std::function<Status(int64_t begin, int64_t n, const char* stored)>& fn);

  // The same straight into `into`, where the owner keeps that kind as stored (StateView::StoredMemory:
  // values or codes from element 0, q8/q4 scales apart): a raw chunk of a data file in memory is copied
  // there as it is hashed, its codes scanned on the way (one pass over what lands), then judged with
  // its scales (core/state_view.h CodeScan); other chunks are copied from StoredChunk's checked form.
  Status CopyStored(int rank, int group, int kind, int64_t count, const StoredPart& into);

  // Copies elements [begin, begin+count) of saved rank `rank`'s shard of (group, kind) into dst.
  Status Read(int rank, int group, int kind, int64_t begin, int64_t count, float* dst);

 private:
  // A read-only mapping of a data file that lives in memory, its pages mapped at once.
  class InMemory {
   public:
    InMemory() = default;
    InMemory(const InMemory&) = delete;
    InMemory& operator=(const InMemory&) = delete;
    ~InMemory();
    // Maps `f` (`bytes` long: its size, checked) when its filesystem keeps it in memory and it is this
    // user's alone to change (owned, not group- or world-writable); else nothing.
    void MapIfInMemory(const IoFile& f, int64_t bytes);
    const char* data() const { return p_; }

   private:
    const char* p_ = nullptr;
    size_t n_ = 0;
  };
  // One index file of a shard and its data file.
  struct Part {
    RankIndex index;
    IoFile file;
    InMemory memory;  // data() null: read through the I/O engine
  };
  // A chunk of a shard: part p's chunk k.
  struct Ref {
    size_t p, k;
    bool operator==(const Ref&) const = default;
  };
  struct Rank {
    int rank = 0;
    std::vector<Part> parts;  // one unless the save was spread over replicas (Manifest::parts)
    std::map<std::pair<int, int>, std::vector<Ref>> by_kind;  // each (group, kind)'s chunks by element
    const ChunkEntry& chunk(Ref c) const { return parts[c.p].index.chunks[c.k]; }
  };
  // The file holding saved shard `shard` of `group` (-1 when out of range: Open refuses it).
  int File(int group, int shard) const {
    if (group < 0 || static_cast<size_t>(group) >= m_.groups.size() || shard < 0 || shard >= GroupShards(m_, group)) return -1;
    return FileOf(m_, group, shard);
  }
  Result<Rank*> Open(int rank);  // file `rank`'s parts
  static size_t Need(const ChunkEntry& ce);
  // An aligned buffer of at least `need` bytes: a spare one (the cache's oldest entry's, or one
  // returned by the read-ahead) when large enough, else a new one.
  Result<std::unique_ptr<float, FreeFloatsFwd>> Buffer(size_t need, size_t* capacity, const std::string& file);
  // One spare buffer at most, the larger kept (memory stays bounded: the cache, the
  // read-ahead window and these).
  void Spare(std::unique_ptr<float, FreeFloatsFwd> p, size_t capacity);
  // Issues reads for planned chunks while the window has room.
  void Pump();
  Result<const float*> Decoded(Rank& r, Ref c);
  using FreeFloats = FreeFloatsFwd;
  // A few decoded chunks stay cached: consecutive pieces usually fall in the same chunk.
  struct Cached {
    int rank;
    Ref chunk;
    std::unique_ptr<float, FreeFloats> data;  // kIoAlignment-aligned: raw chunks are read into it directly
    size_t capacity;
  };
  const CheckpointDir& dir_;
  const Manifest& m_;
  IoEngine& io_;
  std::vector<ShardLayout> layouts_;
  std::map<int, std::unique_ptr<Rank>> ranks_;
  std::list<Cached> cache_;
  // Read-ahead (Plan): chunks read or being read ahead of Read, in plan order.
  struct Ahead {
    int rank;
    Ref chunk;
    std::unique_ptr<float, FreeFloats> data;  // the decoded chunk's buffer (a raw chunk is read into it)
    size_t capacity;
    std::unique_ptr<float, FreeFloats> stored;  // a compressed chunk's stored bytes
    size_t stored_capacity;
    IoHandle handle;
  };
  std::vector<std::pair<int, Ref>> plan_;
  size_t next_ = 0;
  std::deque<Ahead> ahead_;
  int64_t ahead_bytes_ = 0, window_ = 0;
  std::vector<std::pair<std::unique_ptr<float, FreeFloats>, size_t>> spare_;
  std::vector<char> scratch_;
  int64_t bytes_read_ = 0;
};


}  // namespace zrt::ckpt::internal
