#include "zrt/checkpoint/load.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <set>

#include "zrt/checkpoint/files.h"
#include "zrt/checkpoint/state_fill.h"
#include "zrt/checkpoint/tensor_reader.h"
#include "zrt/checkpoint/whole_group.h"

namespace zrt::ckpt {

namespace {

struct FreeFloatsFwd {
  void operator()(void* p) const { std::free(p); }
};

// The saved shards, opened on demand: each index is read and checked against the manifest (its chunks
// tile every (group, kind) exactly once) before any of its chunks is read.
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
  Status Plan(int rank, int group, int kind, int64_t begin, int64_t count) {
    ASSIGN_OR_RETURN(Rank * r, Open(rank));
    const auto& list = r->by_kind[{group, kind}];
    auto it = std::upper_bound(list.begin(), list.end(), begin, [&](int64_t v, size_t k) { return v < r->index.chunks[k].elem_offset; });
    if (it != list.begin()) --it;
    for (; it != list.end() && r->index.chunks[*it].elem_offset < begin + count; ++it) {
      if (!plan_.empty() && plan_.back().first == rank && plan_.back().second == *it) continue;
      plan_.emplace_back(rank, *it);
    }
    return Status();
  }
  // Starts the read-ahead of what was planned, `window` bytes at most.
  void Start(int64_t window) {
    window_ = window;
    Pump();
  }

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
  Status ReadWhole(const std::vector<Whole>& targets) {
    struct InFlight {
      size_t t, k;
      Rank* r;
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
      auto opened = Open(w.rank);
      if (!opened.ok()) {
        s = opened.status().WithContext(w.what);
        break;
      }
      Rank* r = *opened;
      const ShardLayout& l = layouts_[static_cast<size_t>(w.group)];
      for (size_t k : r->by_kind[{w.group, w.kind}]) {
        const ChunkEntry& c = r->index.chunks[k];
        if (c.elem_offset < 0 || c.elem_offset + c.elements > w.count) {
          s = DataLossError(r->index.data_file, ": ", ChunkName(m_, l, r->index, k), " outside the shard of ", w.count, " elements").WithContext(w.what);
          break;
        }
        if (c.codec != Codec::kRaw) {
          while (!q.empty() && s.ok()) s = finish();
          if (s.ok()) s = ReadChunkInto(io_, r->file, m_, l, r->index, k, w.dst + c.elem_offset, &scratch_, &bytes_read_).WithContext(w.what);
          if (!s.ok()) break;
          continue;
        }
        if (!(s = CheckRawChunkSize(r->file, m_, l, r->index, k).WithContext(w.what)).ok()) break;
        auto h = io_.Read(r->file, w.dst + c.elem_offset, static_cast<size_t>(c.stored_bytes), c.file_offset);
        if (!h.ok()) {
          s = h.status().WithContext(ChunkName(m_, l, r->index, k)).WithContext(w.what);
          break;
        }
        q.push_back({t, k, r, std::move(*h)});
        if (q.size() >= 16 && !(s = finish()).ok()) break;
      }
    }
    while (!q.empty()) {  // every read finishes before any target may be touched again
      Status f = finish();
      if (s.ok()) s = f;
    }
    return s;
  }

  // Copies elements [begin, begin+count) of saved rank `rank`'s shard of (group, kind) into dst.
  Status Read(int rank, int group, int kind, int64_t begin, int64_t count, float* dst) {
    ASSIGN_OR_RETURN(Rank * r, Open(rank));
    const auto& list = r->by_kind[{group, kind}];  // chunk indices sorted by elem_offset
    auto it = std::upper_bound(list.begin(), list.end(), begin,
                               [&](int64_t v, size_t k) { return v < r->index.chunks[k].elem_offset; });
    if (it == list.begin()) return DataLossError(r->index.data_file, ": no chunk holds element ", begin);
    --it;
    for (int64_t at = begin; at < begin + count; ++it) {
      if (it == list.end()) return DataLossError(r->index.data_file, ": no chunk holds element ", at);
      const size_t k = *it;
      const ChunkEntry& c = r->index.chunks[k];
      ASSIGN_OR_RETURN(const float* data, Decoded(*r, k));
      const int64_t lo = std::max(at, c.elem_offset), hi = std::min(begin + count, c.elem_offset + c.elements);
      if (lo != at) return DataLossError(r->index.data_file, ": chunks leave a gap at element ", at);
      std::memcpy(dst + (lo - begin), data + (lo - c.elem_offset), static_cast<size_t>(hi - lo) * 4);
      at = hi;
    }
    return Status();
  }

 private:
  struct Rank {
    RankIndex index;
    IoFile file;
    std::map<std::pair<int, int>, std::vector<size_t>> by_kind;
  };
  Result<Rank*> Open(int rank) {
    auto it = ranks_.find(rank);
    if (it != ranks_.end()) return it->second.get();
    auto r = std::make_unique<Rank>();
    ASSIGN_OR_RETURN(r->index, ReadIndex(dir_, m_, layouts_, rank));
    ASSIGN_OR_RETURN(r->file, dir_.OpenData(r->index.data_file, r->index.data_bytes));
    for (size_t k = 0; k < r->index.chunks.size(); ++k) r->by_kind[{r->index.chunks[k].group, r->index.chunks[k].kind}].push_back(k);
    for (auto& [key, v] : r->by_kind) {
      std::sort(v.begin(), v.end(), [&](size_t a, size_t b) { return r->index.chunks[a].elem_offset < r->index.chunks[b].elem_offset; });
    }
    return (ranks_[rank] = std::move(r)).get();
  }
  static size_t Need(const ChunkEntry& ce) {
    return (static_cast<size_t>(std::max(ce.elements * 4, ce.stored_bytes)) + kIoAlignment - 1) / kIoAlignment * kIoAlignment;
  }
  // An aligned buffer of at least `need` bytes: a spare one (the cache's oldest entry's, or one
  // returned by the read-ahead) when large enough, else a new one.
  Result<std::unique_ptr<float, FreeFloatsFwd>> Buffer(size_t need, size_t* capacity, const std::string& file) {
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
  // One spare buffer at most, the larger kept (memory stays bounded: the cache, the
  // read-ahead window and these).
  void Spare(std::unique_ptr<float, FreeFloatsFwd> p, size_t capacity) {
    spare_.emplace_back(std::move(p), capacity);
    if (spare_.size() > 1) {
      auto smallest = std::min_element(spare_.begin(), spare_.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
      spare_.erase(smallest);
    }
  }
  // Issues reads for planned chunks while the window has room.
  void Pump() {
    while (next_ < plan_.size() && ahead_bytes_ < window_) {
      const auto [rank, k] = plan_[next_++];
      Rank& r = *ranks_.at(rank);
      const ChunkEntry& ce = r.index.chunks[k];
      bool cached = false;
      for (const Cached& c : cache_) cached = cached || (c.rank == rank && c.chunk == k);
      if (cached || !CheckRawChunkSize(r.file, m_, layouts_[static_cast<size_t>(ce.group)], r.index, k).ok()) continue;  // read (and refused) in order
      Ahead a{rank, k, nullptr, 0, nullptr, 0, IoHandle()};
      auto data = Buffer(Need(ce), &a.capacity, r.index.data_file);
      if (!data.ok()) return;
      a.data = std::move(*data);
      char* into = reinterpret_cast<char*>(a.data.get());
      if (ce.codec != Codec::kRaw) {
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
  Result<const float*> Decoded(Rank& r, size_t k) {
    for (auto it = cache_.begin(); it != cache_.end(); ++it) {
      if (it->rank == r.index.rank && it->chunk == k) {
        cache_.splice(cache_.begin(), cache_, it);
        return cache_.front().data.get();
      }
    }
    const ChunkEntry& ce = r.index.chunks[k];
    const int g = ce.group;  // in range: the index was validated
    Cached c{r.index.rank, k, nullptr, 0};
    if (cache_.size() >= 4) {  // the oldest entry's memory is reused
      Spare(std::move(cache_.back().data), cache_.back().capacity);
      cache_.pop_back();
    }
    auto ahead = std::find_if(ahead_.begin(), ahead_.end(), [&](const Ahead& a) { return a.rank == r.index.rank && a.chunk == k; });
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
      RETURN_IF_ERROR(ReadChunkInto(io_, r.file, m_, layouts_[static_cast<size_t>(g)], r.index, k, c.data.get(), &scratch_, &bytes_read_));
      Pump();
    }
    cache_.push_front(std::move(c));
    return cache_.front().data.get();
  }
  using FreeFloats = FreeFloatsFwd;
  // A few decoded chunks stay cached: consecutive pieces usually fall in the same chunk.
  struct Cached {
    int rank;
    size_t chunk;
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
    size_t chunk;
    std::unique_ptr<float, FreeFloats> data;  // the decoded chunk's buffer (a raw chunk is read into it)
    size_t capacity;
    std::unique_ptr<float, FreeFloats> stored;  // a compressed chunk's stored bytes
    size_t stored_capacity;
    IoHandle handle;
  };
  std::vector<std::pair<int, size_t>> plan_;
  size_t next_ = 0;
  std::deque<Ahead> ahead_;
  int64_t ahead_bytes_ = 0, window_ = 0;
  std::vector<std::pair<std::unique_ptr<float, FreeFloats>, size_t>> spare_;
  std::vector<char> scratch_;
  int64_t bytes_read_ = 0;
};

}  // namespace

struct TensorReader::Impl {
  CheckpointDir cd;
  Manifest m;
  std::unique_ptr<IoEngine> io;
  std::unique_ptr<ShardSource> src;
  std::map<std::string, std::pair<int, int>> where;  // name -> (group, tensor)
};

TensorReader::TensorReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TensorReader::~TensorReader() = default;
const Manifest& TensorReader::manifest() const { return impl_->m; }
const std::string& TensorReader::dir() const { return impl_->cd.path(); }

Result<std::unique_ptr<TensorReader>> TensorReader::Open(const std::string& dir) {
  auto impl = std::make_unique<Impl>();
  ASSIGN_OR_RETURN(impl->cd, CheckpointDir::Open(dir), "reading checkpoint");
  ASSIGN_OR_RETURN(impl->m, ReadManifest(impl->cd), "reading checkpoint");
  ASSIGN_OR_RETURN(std::vector<ShardLayout> saved, SavedLayouts(impl->m), "reading checkpoint");
  ASSIGN_OR_RETURN(impl->io, IoEngine::Create(IoOptions{}), "reading checkpoint");
  impl->src = std::make_unique<ShardSource>(impl->cd, impl->m, std::move(saved), *impl->io);
  for (int g = 0; g < static_cast<int>(impl->m.groups.size()); ++g) {
    for (int t = 0; t < static_cast<int>(impl->m.groups[static_cast<size_t>(g)].tensors.size()); ++t) {
      impl->where[impl->m.groups[static_cast<size_t>(g)].tensors[static_cast<size_t>(t)].name] = {g, t};
    }
  }
  return std::unique_ptr<TensorReader>(new TensorReader(std::move(impl)));
}

Result<std::pair<const GroupEntry*, const TensorEntry*>> TensorReader::Find(const std::string& name) const {
  auto w = impl_->where.find(name);
  if (w == impl_->where.end()) return NotFoundError("no tensor '", name, "' in ", impl_->cd.path());
  const GroupEntry& ge = impl_->m.groups[static_cast<size_t>(w->second.first)];
  return std::pair<const GroupEntry*, const TensorEntry*>{&ge, &ge.tensors[static_cast<size_t>(w->second.second)]};
}

Status TensorReader::ForEachPiece(const std::string& name, const std::string& kind, int64_t offset, int64_t count,
                                  const std::function<Status(int group, int kind, const ShardPiece&)>& fn) {
  ASSIGN_OR_RETURN(auto found, Find(name));
  const auto [g, t] = impl_->where.at(name);
  const GroupEntry& ge = *found.first;
  const auto k = std::find(ge.kinds.begin(), ge.kinds.end(), kind);
  if (k == ge.kinds.end()) return NotFoundError("tensor '", name, "' has no ", kind, " in ", impl_->cd.path());
  if (offset < 0 || count < 0 || offset > found.second->numel - count) {
    return InvalidArgumentError("tensor '", name, "': elements [", offset, ", ", offset + count, ") outside its ", found.second->numel);
  }
  for (const ShardPiece& op : impl_->src->layout(g).Locate(t, offset, offset + count)) {
    RETURN_IF_ERROR(fn(g, static_cast<int>(k - ge.kinds.begin()), op), "reading tensor '", name, "' (", kind, ") from ", impl_->cd.path());
  }
  return Status();
}

Status TensorReader::Read(const std::string& name, const std::string& kind, int64_t offset, int64_t count, float* out) {
  return ForEachPiece(name, kind, offset, count, [&](int g, int k, const ShardPiece& op) {
    return impl_->src->Read(op.rank, g, k, op.shard_offset, op.count, out + (op.tensor_offset - offset));
  });
}

Status TensorReader::Plan(const std::string& name, const std::string& kind, int64_t offset, int64_t count) {
  return ForEachPiece(name, kind, offset, count,
                      [&](int g, int k, const ShardPiece& op) { return impl_->src->Plan(op.rank, g, k, op.shard_offset, op.count); });
}

void TensorReader::StartReadAhead(int64_t window_bytes) { impl_->src->Start(window_bytes); }

Result<LoadResult> Load(const std::string& dir, const StateView& target, const LoadOptions& options) {
  RETURN_IF_ERROR(target.Settle(), "loading checkpoint");  // a capture still reading the buffers ends before they change
  ASSIGN_OR_RETURN(CheckpointDir cd, CheckpointDir::Open(dir), "loading checkpoint");
  ASSIGN_OR_RETURN(Manifest m, ReadManifest(cd), "loading checkpoint");
  ASSIGN_OR_RETURN(std::vector<ShardLayout> saved, SavedLayouts(m), "loading checkpoint");
  ASSIGN_OR_RETURN(auto io, IoEngine::Create(options.io), "loading checkpoint");
  LoadResult r;
  std::map<std::string, std::pair<int, int>> where;  // tensor name -> (group, tensor); names are unique
  for (int g = 0; g < static_cast<int>(m.groups.size()); ++g) {
    for (int t = 0; t < static_cast<int>(m.groups[static_cast<size_t>(g)].tensors.size()); ++t) {
      where[m.groups[static_cast<size_t>(g)].tensors[static_cast<size_t>(t)].name] = {g, t};
    }
  }
  // Every target tensor against the checkpoint first (names, shapes, dtypes), before any data is read.
  std::set<std::string> in_target;
  for (const StateGroup& tg : target.groups) {
    for (const TensorSpec& spec : tg.tensors) {
      in_target.insert(spec.name);
      auto w = where.find(spec.name);
      if (w == where.end()) {
        if (options.strict) {
          return NotFoundError("load: tensor '", spec.name, "' is not in checkpoint ", dir, " (LoadOptions::strict = false starts it at zero)");
        }
        r.missing.push_back("tensor '" + spec.name + "'");
        continue;
      }
      const TensorEntry& te = m.groups[static_cast<size_t>(w->second.first)].tensors[static_cast<size_t>(w->second.second)];
      if (te.shape != spec.shape) {
        return InvalidArgumentError("load: tensor '", spec.name, "' has shape ", TensorSpec{te.name, te.shape, te.dtype}.ToString(),
                                    " in ", dir, ", the model has ", spec.ToString());
      }
      if (te.dtype != spec.dtype) {
        const std::string what = ::zrt::internal::StrCat("tensor '", spec.name, "': ", DTypeName(te.dtype), " in the checkpoint, ",
                                                         DTypeName(spec.dtype), " in the model");
        if (options.strict) return InvalidArgumentError("load: ", what, " (", dir, "; LoadOptions::strict = false loads it)");
        r.mismatched.push_back(what);
      }
    }
  }
  for (const auto& [name, gt] : where) {
    if (in_target.contains(name)) continue;
    if (options.strict) {
      return InvalidArgumentError("load: checkpoint ", dir, " has tensor '", name, "', which the model does not (",
                                  "LoadOptions::strict = false ignores it)");
    }
    r.unexpected.push_back("tensor '" + name + "'");
  }
  // Every buffer's sources first (one check per tensor), then every read planned in the order the
  // fill makes them (the read-ahead's order), then the fill.
  struct Source {
    ShardPiece piece;  // in the target shard
    int group, tensor, kind;
  };
  std::vector<std::vector<std::vector<Source>>> sources(target.groups.size());
  for (size_t gi = 0; gi < target.groups.size(); ++gi) {
    const StateGroup& tg = target.groups[gi];
    const int rank = tg.layout.world_size() == 1 ? 0 : target.rank;
    for (const StateBuffer& b : tg.buffers) {
      if (b.dtype != DType::kF32) return InvalidArgumentError("load: state '", b.kind, "' must be f32");
      if (!b.resident() && target.owner == nullptr) {
        return InvalidArgumentError("load: state '", b.kind, "' of group '", tg.name, "' is not resident and the view has no owner");
      }
      std::vector<Source>& list = sources[gi].emplace_back();
      if (options.params_only && b.kind != "master") continue;
      for (const ShardPiece& p : tg.layout.RankPieces(rank)) {
        const TensorSpec& spec = tg.tensors[static_cast<size_t>(p.tensor)];
        auto w = where.find(spec.name);
        if (w == where.end()) continue;  // not strict, reported above
        const auto [g, t] = w->second;
        const GroupEntry& ge = m.groups[static_cast<size_t>(g)];
        const auto kind = std::find(ge.kinds.begin(), ge.kinds.end(), b.kind);
        if (kind == ge.kinds.end()) {
          if (options.strict || b.kind == "master") {
            return DataLossError("load: checkpoint ", dir, " has no ", b.kind, " for tensor '", spec.name, "' (group '", ge.name,
                                 "' saved ", ge.kinds.size(), " state kinds)");
          }
          if (p.tensor_offset == 0) r.missing.push_back("tensor '" + spec.name + "' (" + b.kind + ")");
          continue;
        }
        list.push_back({p, g, t, static_cast<int>(kind - ge.kinds.begin())});
      }
    }
  }
  // A target group laid out exactly as a saved one (same tensors at the same offsets, shard size and
  // number of shards: a restart at the same size) is read straight into its resident buffers.
  std::vector<int> same(target.groups.size(), -1);
  for (size_t gi = 0; gi < target.groups.size(); ++gi) {
    const StateGroup& tg = target.groups[gi];
    if (tg.tensors.empty()) continue;
    auto w = where.find(tg.tensors[0].name);
    if (w == where.end() || w->second.second != 0) continue;
    const int g = w->second.first;
    const GroupEntry& ge = m.groups[static_cast<size_t>(g)];
    bool equal = ge.tensors.size() == tg.tensors.size() && saved[static_cast<size_t>(g)].shard_size() == tg.layout.shard_size() &&
                 saved[static_cast<size_t>(g)].world_size() == tg.layout.world_size();
    for (size_t t = 0; equal && t < tg.tensors.size(); ++t) {
      equal = ge.tensors[t].name == tg.tensors[t].name && ge.tensors[t].numel == tg.tensors[t].numel() &&
              ge.tensors[t].offset == tg.layout.tensor_offset(static_cast<int64_t>(t));
    }
    if (equal) same[gi] = g;
  }
  auto whole = [&](size_t gi, size_t bi) -> int {  // the saved kind read whole into buffer bi, or -1
    const StateBuffer& b = target.groups[gi].buffers[bi];
    if (same[gi] < 0 || b.data == nullptr || (options.params_only && b.kind != "master")) return -1;
    const GroupEntry& ge = m.groups[static_cast<size_t>(same[gi])];
    const auto k = std::find(ge.kinds.begin(), ge.kinds.end(), b.kind);
    return k == ge.kinds.end() ? -1 : static_cast<int>(k - ge.kinds.begin());
  };
  ShardSource src(cd, m, saved, *io);
  for (size_t gi = 0; gi < sources.size(); ++gi) {
    for (size_t bi = 0; bi < sources[gi].size(); ++bi) {
      if (whole(gi, bi) >= 0) continue;
      for (const Source& sp : sources[gi][bi]) {
        const ShardPiece& p = sp.piece;
        for (const ShardPiece& op : saved[static_cast<size_t>(sp.group)].Locate(sp.tensor, p.tensor_offset, p.tensor_offset + p.count)) {
          RETURN_IF_ERROR(src.Plan(op.rank, sp.group, sp.kind, op.shard_offset, op.count), "loading from ", dir);
        }
      }
    }
  }
  src.Start(options.read_ahead_bytes);
  std::vector<ShardSource::Whole> wholes;  // the buffers read in place, all in one pipeline
  for (size_t gi = 0; gi < target.groups.size(); ++gi) {
    const StateGroup& tg = target.groups[gi];
    for (size_t bi = 0; bi < tg.buffers.size(); ++bi) {
      const StateBuffer& b = tg.buffers[bi];
      if (const int kind = whole(gi, bi); kind >= 0) {
        wholes.push_back({tg.layout.world_size() == 1 ? 0 : target.rank, same[gi], kind, static_cast<float*>(b.data), b.count,
                          "loading group '" + tg.name + "' (" + b.kind + ") from " + dir});
      }
    }
  }
  RETURN_IF_ERROR(src.ReadWhole(wholes));
  for (size_t gi = 0; gi < target.groups.size(); ++gi) {
    const StateGroup& tg = target.groups[gi];
    for (size_t bi = 0; bi < tg.buffers.size(); ++bi) {
      const StateBuffer& b = tg.buffers[bi];
      if (whole(gi, bi) >= 0) continue;
      const std::vector<Source>& list = sources[gi][bi];
      auto fill = [&](int64_t w0, int64_t w1, float* base) -> Status {
        for (const Source& src_piece : list) {
          const ShardPiece& p = src_piece.piece;
          const int64_t lo = std::max(w0, p.shard_offset), hi = std::min(w1, p.shard_offset + p.count);
          if (lo >= hi) continue;
          const int64_t t0 = p.tensor_offset + (lo - p.shard_offset);
          for (const ShardPiece& op : saved[static_cast<size_t>(src_piece.group)].Locate(src_piece.tensor, t0, t0 + (hi - lo))) {
            float* dst = base + (p.shard_offset - w0) + (op.tensor_offset - p.tensor_offset);
            RETURN_IF_ERROR(src.Read(op.rank, src_piece.group, src_piece.kind, op.shard_offset, op.count, dst),
                            "loading tensor '", tg.tensors[static_cast<size_t>(p.tensor)].name, "' (", b.kind, ") from ", dir);
          }
        }
        return Status();
      };
      RETURN_IF_ERROR(FillStateBuffer(target, static_cast<int>(gi), static_cast<int>(bi), fill));
    }
  }
  r.counters = {m.step, m.loss_scale, m.scaler_good_steps, m.scaler_hysteresis_left, m.engine_state.dump()};
  r.trainer_state = m.trainer_state;
  r.saved_world_size = m.world_size;
  r.saved_stage = m.stage;
  r.bytes_read = src.bytes_read();
  return r;
}

Result<StateGroup> GroupForShards(const Manifest& m, int group, int shards) {
  if (group < 0 || group >= static_cast<int>(m.groups.size())) return InvalidArgumentError("no group #", group);
  const GroupEntry& ge = m.groups[static_cast<size_t>(group)];
  StateGroup sg;
  sg.name = ge.name;
  sg.lr = ge.lr;
  sg.weight_decay = ge.weight_decay;
  std::vector<int64_t> numels;
  for (const TensorEntry& t : ge.tensors) {
    sg.tensors.push_back(TensorSpec{t.name, t.shape, t.dtype});
    numels.push_back(t.numel);
  }
  ASSIGN_OR_RETURN(sg.layout, ShardLayout::Create(numels, shards, ge.alignment), "group '", ge.name, "'");
  return sg;
}

Result<WholeGroup> LoadWholeGroup(const std::string& dir, const Manifest& m, int group, const std::vector<std::string>& kinds) {
  WholeGroup w;
  ASSIGN_OR_RETURN(StateGroup sg, GroupForShards(m, group, 1));
  w.data.resize(kinds.size());
  for (size_t k = 0; k < kinds.size(); ++k) {
    try {  // the size comes from the file: a hostile one may ask for more than the machine has
      w.data[k].resize(static_cast<size_t>(sg.layout.shard_size()));
    } catch (const std::exception&) {
      return OutOfMemoryError("group '", sg.name, "' of ", dir, ": no memory for ", sg.layout.shard_size(), " elements of ", kinds[k]);
    }
    sg.buffers.push_back({kinds[k], DType::kF32, w.data[k].data(), sg.layout.shard_size()});
  }
  w.view.groups.push_back(std::move(sg));
  LoadOptions o;
  o.strict = false;  // one group of the checkpoint: the others are expected to be "missing" from the view
  o.read_ahead_bytes = 0;  // the tools' memory bound: the whole group is already held
  RETURN_IF_ERROR(Load(dir, w.view, o).status());
  return w;
}

}  // namespace zrt::ckpt
