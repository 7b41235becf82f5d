// The chunk pipeline (chunk_source.h).
#include "zrt/checkpoint/chunk_source.h"
#include "zrt/core/base.h"
#include "zrt/checkpoint/codec.h"

#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

namespace zrt::ckpt::internal {

ShardSource::InMemory::~InMemory() {
  if (p_ != nullptr) ::munmap(const_cast<char*>(p_), n_);
}

void ShardSource::InMemory::MapIfInMemory(const IoFile& f, int64_t bytes) {
  struct statfs fs {};
  if (bytes <= 0 || ::fstatfs(f.fd(), &fs) != 0 || (fs.f_type != TMPFS_MAGIC && fs.f_type != RAMFS_MAGIC)) return;
  // Only a file no one else may shorten: a mapped file truncated under the reader kills it (SIGBUS),
  // where a read would only come up short.
  struct stat st {};
  if (::fstat(f.fd(), &st) != 0 || st.st_uid != ::geteuid() || (st.st_mode & (S_IWGRP | S_IWOTH)) != 0) return;
  void* p = ::mmap(nullptr, static_cast<size_t>(bytes), PROT_READ, MAP_SHARED | MAP_POPULATE, f.fd(), 0);
  if (p == MAP_FAILED) return;  // read through the I/O engine instead
  p_ = static_cast<const char*>(p);
  n_ = static_cast<size_t>(bytes);
}

Status ShardSource::Plan(int shard, int group, int kind, int64_t begin, int64_t count) {
  const int rank = File(group, shard);
  ASSIGN_OR_RETURN(Rank * r, Open(rank));
  const auto& list = r->by_kind[{group, kind}];
  auto it = std::upper_bound(list.begin(), list.end(), begin, [&](int64_t v, Ref c) { return v < r->chunk(c).elem_offset; });
  if (it != list.begin()) --it;
  for (; it != list.end() && r->chunk(*it).elem_offset < begin + count; ++it) {
    if (!plan_.empty() && plan_.back().first == rank && plan_.back().second == *it) continue;
    plan_.emplace_back(rank, *it);
  }
  return Status();
}

void ShardSource::Start(int64_t window) {
  window_ = window;
  Pump();
}

Status ShardSource::ReadWhole(const std::vector<Whole>& targets) {
  struct InFlight {
    size_t t, k;
    Part* r;
    IoHandle h;
  };
  std::deque<InFlight> q;
  auto finish = [&]() -> Status {
    InFlight f = std::move(q.front());
    q.pop_front();
    const Whole& w = targets[f.t];
    const ShardLayout& l = layouts_[static_cast<size_t>(w.group)];
    Status st = f.h.Wait().WithContext(ChunkName(m_, l, f.r->index, f.k));
    const ChunkEntry& c = f.r->index.chunks[f.k];
    if (st.ok()) {
      char* at = reinterpret_cast<char*>(w.dst + c.elem_offset);
      st = FinishChunkRead(f.r->file, m_, l, f.r->index, f.k, at, w.dst + c.elem_offset, &scratch_);
    }
    if (st.ok()) bytes_read_ += c.stored_bytes;
    return st.WithContext(w.what);
  };
  Status s;
  for (size_t t = 0; t < targets.size() && s.ok(); ++t) {
    const Whole& w = targets[t];
    auto opened = Open(File(w.group, w.rank));
    if (!opened.ok()) {
      s = opened.status().WithContext(w.what);
      break;
    }
    Rank* r = *opened;
    const ShardLayout& l = layouts_[static_cast<size_t>(w.group)];
    for (const Ref ref : r->by_kind[{w.group, w.kind}]) {
      Part* part = &r->parts[ref.p];
      const size_t k = ref.k;
      const ChunkEntry& c = r->chunk(ref);
      if (c.elem_offset < 0 || c.elem_offset + c.elements > w.count) {
        s = DataLossError(part->index.data_file, ": ", ChunkName(m_, l, part->index, k), " outside the shard of ", w.count, " elements").WithContext(w.what);
        break;
      }
      if (!ChunkInPlace(m_, c)) {
        while (!q.empty() && s.ok()) s = finish();
        if (s.ok()) s = ReadChunkInto(io_, part->file, m_, l, part->index, k, w.dst + c.elem_offset, &scratch_, &bytes_read_).WithContext(w.what);
        if (!s.ok()) break;
        continue;
      }
      if (!(s = CheckRawChunkSize(part->file, m_, l, part->index, k).WithContext(w.what)).ok()) break;
      if (part->memory.data() != nullptr) {  // copied out of the mapping and hashed in one pass
        s = FinishChunkRead(part->file, m_, l, part->index, k, part->memory.data() + c.file_offset, w.dst + c.elem_offset, &scratch_)
                .WithContext(w.what);
        if (!s.ok()) break;
        bytes_read_ += c.stored_bytes;
        continue;
      }
      auto h = io_.Read(part->file, w.dst + c.elem_offset, static_cast<size_t>(c.stored_bytes), c.file_offset);
      if (!h.ok()) {
        s = h.status().WithContext(ChunkName(m_, l, part->index, k)).WithContext(w.what);
        break;
      }
      q.push_back({t, k, part, std::move(*h)});
      if (q.size() >= 16 && !(s = finish()).ok()) break;
    }
  }
  while (!q.empty()) {  // every read finishes before any target may be touched again
    Status f = finish();
    if (s.ok()) s = f;
  }
  return s;
}

Status ShardSource::ForEachStored(int shard, int group, int kind, int64_t count,
                                  const std::function<Status(int64_t begin, int64_t n, const char* stored)>& fn) {
  ASSIGN_OR_RETURN(Rank * r, Open(File(group, shard)));
  const ShardLayout& l = layouts_[static_cast<size_t>(group)];
  std::vector<char> unpacked;
  for (const Ref ref : r->by_kind[{group, kind}]) {  // sorted by elem_offset; they tile the shard (ReadShardIndexes)
    const Part& part = r->parts[ref.p];
    const ChunkEntry& c = r->chunk(ref);
    if (c.elem_offset < 0 || c.elem_offset + c.elements > count) {
      return DataLossError(part.index.data_file, ": ", ChunkName(m_, l, part.index, ref.k), " outside the shard of ", count, " elements");
    }
    const char* mapped = part.memory.data() != nullptr ? part.memory.data() + c.file_offset : nullptr;
    ASSIGN_OR_RETURN(const char* stored, StoredChunk(io_, part.file, m_, l, part.index, ref.k, mapped, &unpacked, &scratch_, &bytes_read_));
    RETURN_IF_ERROR(fn(c.elem_offset, c.elements, stored), ChunkName(m_, l, part.index, ref.k));
  }
  return Status();
}

Status ShardSource::CopyStored(int shard, int group, int kind, int64_t count, const StoredPart& into) {
  ASSIGN_OR_RETURN(Rank * r, Open(File(group, shard)));
  const ShardLayout& l = layouts_[static_cast<size_t>(group)];
  const GroupEntry& ge = m_.groups[static_cast<size_t>(group)];
  const StateFormat form = ge.format(static_cast<size_t>(kind));
  const bool q8 = form.blockwise();  // codes in blocks (q8, q4)
  std::vector<char> unpacked;
  for (const Ref ref : r->by_kind[{group, kind}]) {  // sorted by elem_offset; they tile the shard (ReadShardIndexes)
    const Part& part = r->parts[ref.p];
    const ChunkEntry& c = r->chunk(ref);
    if (c.elem_offset < 0 || c.elem_offset + c.elements > count || (q8 && c.elem_offset % ge.block != 0)) {
      return DataLossError(part.index.data_file, ": ", ChunkName(m_, l, part.index, ref.k), " outside the shard of ", count,
                           " elements or not at a block's start");
    }
    char* values = static_cast<char*>(into.values) + form.ValuesBytes(c.elem_offset);
    float* scales = q8 ? into.scales + c.elem_offset / ge.block : nullptr;
    const int64_t value_bytes = form.ValuesBytes(c.elements), stored_bytes = form.Bytes(c.elements);
    if (part.memory.data() == nullptr || c.codec != Codec::kRaw) {  // read or decompressed, checked, then copied
      ASSIGN_OR_RETURN(const char* stored, StoredChunk(io_, part.file, m_, l, part.index, ref.k, nullptr, &unpacked, &scratch_, &bytes_read_));
      std::memcpy(values, stored, static_cast<size_t>(value_bytes));
      if (q8) std::memcpy(scales, stored + value_bytes, static_cast<size_t>(stored_bytes - value_bytes));
      continue;
    }
    RETURN_IF_ERROR(CheckRawChunkSize(part.file, m_, l, part.index, ref.k));
    const char* mapped = part.memory.data() + c.file_offset;
    CodeScan scan(form, q8 ? c.elements : 0);  // the codes checked as they land
    if (CopyAndChecksum(values, static_cast<size_t>(value_bytes), scales, mapped, static_cast<size_t>(c.stored_bytes), q8 ? &CodeScan::Seen : nullptr,
                        &scan) != c.xxh3) {
      return DataLossError(part.file.path(), ": ", ChunkName(m_, l, part.index, ref.k), ": checksum mismatch (the data is corrupt)");
    }
    bytes_read_ += c.stored_bytes;
    if (q8) RETURN_IF_ERROR(scan.Check(values, scales), part.file.path(), ": ", ChunkName(m_, l, part.index, ref.k));
  }
  return Status();
}

Status ShardSource::Read(int shard, int group, int kind, int64_t begin, int64_t count, float* dst) {
  ASSIGN_OR_RETURN(Rank * r, Open(File(group, shard)));
  const auto& list = r->by_kind[{group, kind}];  // chunks sorted by elem_offset
  const std::string& file = r->parts[0].index.data_file;
  auto it = std::upper_bound(list.begin(), list.end(), begin, [&](int64_t v, Ref c) { return v < r->chunk(c).elem_offset; });
  if (it == list.begin()) return DataLossError(file, ": no chunk holds element ", begin);
  --it;
  for (int64_t at = begin; at < begin + count; ++it) {
    if (it == list.end()) return DataLossError(file, ": no chunk holds element ", at);
    const ChunkEntry& c = r->chunk(*it);
    ASSIGN_OR_RETURN(const float* data, Decoded(*r, *it));
    const int64_t lo = std::max(at, c.elem_offset), hi = std::min(begin + count, c.elem_offset + c.elements);
    if (lo != at) return DataLossError(file, ": chunks leave a gap at element ", at);
    std::memcpy(dst + (lo - begin), data + (lo - c.elem_offset), static_cast<size_t>(hi - lo) * 4);
    at = hi;
  }
  return Status();
}

Result<ShardSource::Rank*> ShardSource::Open(int rank) {
  if (rank < 0 || rank >= m_.shards) return InvalidArgumentError(dir_.path(), ": no such saved shard (a read outside the manifest's groups)");
  auto it = ranks_.find(rank);
  if (it != ranks_.end()) return it->second.get();
  auto r = std::make_unique<Rank>();
  r->rank = rank;
  ASSIGN_OR_RETURN(std::vector<RankIndex> indexes, ReadShardIndexes(dir_, m_, layouts_, rank));
  r->parts = std::vector<Part>(indexes.size());
  for (size_t p = 0; p < indexes.size(); ++p) {
    Part& part = r->parts[p];
    part.index = std::move(indexes[p]);
    ASSIGN_OR_RETURN(part.file, dir_.OpenData(part.index.data_file, part.index.data_bytes));
    part.memory.MapIfInMemory(part.file, part.index.data_bytes);
    for (size_t k = 0; k < part.index.chunks.size(); ++k) r->by_kind[{part.index.chunks[k].group, part.index.chunks[k].kind}].push_back({p, k});
  }
  for (auto& [key, v] : r->by_kind) {
    std::sort(v.begin(), v.end(), [&](Ref a, Ref b) { return r->chunk(a).elem_offset < r->chunk(b).elem_offset; });
  }
  return (ranks_[rank] = std::move(r)).get();
}

size_t ShardSource::Need(const ChunkEntry& ce) {
  return static_cast<size_t>(AlignUp(std::max(ce.elements * 4, ce.stored_bytes), static_cast<int64_t>(kIoAlignment)));
}

Result<std::unique_ptr<float, FreeFloatsFwd>> ShardSource::Buffer(size_t need, size_t* capacity, const std::string& file) {
  for (auto it = spare_.begin(); it != spare_.end(); ++it) {
    if (it->second >= need) {
      *capacity = it->second;
      auto p = std::move(it->first);
      spare_.erase(it);
      return p;
    }
  }
  std::unique_ptr<float, FreeFloatsFwd> p(static_cast<float*>(std::aligned_alloc(kIoAlignment, need)));
  if (!p) return OutOfMemoryError(file, ": no memory for a chunk of ", need, " bytes");
  *capacity = need;
  return p;
}

void ShardSource::Spare(std::unique_ptr<float, FreeFloatsFwd> p, size_t capacity) {
  spare_.emplace_back(std::move(p), capacity);
  if (spare_.size() > 1) {
    auto smallest = std::min_element(spare_.begin(), spare_.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
    spare_.erase(smallest);
  }
}

void ShardSource::Pump() {
  while (next_ < plan_.size() && ahead_bytes_ < window_) {
    const auto [rank, ref] = plan_[next_++];
    Part& r = ranks_.at(rank)->parts[ref.p];
    const size_t k = ref.k;
    const ChunkEntry& ce = r.index.chunks[k];
    bool cached = false;
    for (const Cached& c : cache_) cached = cached || (c.rank == rank && c.chunk == ref);
    if (cached || r.memory.data() != nullptr || !CheckRawChunkSize(r.file, m_, layouts_[static_cast<size_t>(ce.group)], r.index, k).ok()) {
      continue;  // read (and refused) in order; a mapped file needs no read
    }
    Ahead a{rank, ref, nullptr, 0, nullptr, 0, IoHandle()};
    auto data = Buffer(Need(ce), &a.capacity, r.index.data_file);
    if (!data.ok()) return;
    a.data = std::move(*data);
    char* into = reinterpret_cast<char*>(a.data.get());
    if (!ChunkInPlace(m_, ce)) {
      auto stored = Buffer(static_cast<size_t>(ce.stored_bytes), &a.stored_capacity, r.index.data_file);
      if (!stored.ok()) return;
      a.stored = std::move(*stored);
      into = reinterpret_cast<char*>(a.stored.get());
    }
    auto h = io_.Read(r.file, into, static_cast<size_t>(ce.stored_bytes), ce.file_offset);
    if (!h.ok()) {  // Read finds it not ahead and reads it itself, reporting the error
      Spare(std::move(a.data), a.capacity);
      return;
    }
    a.handle = std::move(*h);
    ahead_bytes_ += static_cast<int64_t>(a.capacity + a.stored_capacity);
    ahead_.push_back(std::move(a));
  }
}

Result<const float*> ShardSource::Decoded(Rank& shard, Ref ref) {
  for (auto it = cache_.begin(); it != cache_.end(); ++it) {
    if (it->rank == shard.rank && it->chunk == ref) {
      cache_.splice(cache_.begin(), cache_, it);
      return cache_.front().data.get();
    }
  }
  Part& r = shard.parts[ref.p];
  const size_t k = ref.k;
  const ChunkEntry& ce = r.index.chunks[k];
  const int g = ce.group;  // in range: the index was validated
  Cached c{shard.rank, ref, nullptr, 0};
  if (cache_.size() >= 4) {  // the oldest entry's memory is reused
    Spare(std::move(cache_.back().data), cache_.back().capacity);
    cache_.pop_back();
  }
  auto ahead = std::find_if(ahead_.begin(), ahead_.end(), [&](const Ahead& a) { return a.rank == shard.rank && a.chunk == ref; });
  if (ahead != ahead_.end()) {
    Ahead a = std::move(*ahead);
    ahead_.erase(ahead);
    ahead_bytes_ -= static_cast<int64_t>(a.capacity + a.stored_capacity);
    Status s = a.handle.Wait().WithContext(ChunkName(m_, layouts_[static_cast<size_t>(g)], r.index, k));
    const char* stored = a.stored ? reinterpret_cast<const char*>(a.stored.get()) : reinterpret_cast<const char*>(a.data.get());
    if (s.ok()) s = FinishChunkRead(r.file, m_, layouts_[static_cast<size_t>(g)], r.index, k, stored, a.data.get(), &scratch_);
    if (a.stored) Spare(std::move(a.stored), a.stored_capacity);
    Pump();
    if (!s.ok()) return s;
    bytes_read_ += ce.stored_bytes;
    c.data = std::move(a.data);
    c.capacity = a.capacity;
  } else {
    ASSIGN_OR_RETURN(c.data, Buffer(Need(ce), &c.capacity, r.index.data_file));
    const ShardLayout& l = layouts_[static_cast<size_t>(g)];
    if (r.memory.data() != nullptr) {
      RETURN_IF_ERROR(CheckRawChunkSize(r.file, m_, l, r.index, k));
      RETURN_IF_ERROR(FinishChunkRead(r.file, m_, l, r.index, k, r.memory.data() + ce.file_offset, c.data.get(), &scratch_));
      bytes_read_ += ce.stored_bytes;
    } else {
      RETURN_IF_ERROR(ReadChunkInto(io_, r.file, m_, l, r.index, k, c.data.get(), &scratch_, &bytes_read_));
    }
    Pump();
  }
  cache_.push_front(std::move(c));
  return cache_.front().data.get();
}

}  // namespace zrt::ckpt::internal
