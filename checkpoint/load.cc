#include "zrt/checkpoint/load.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
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

// The saved shards, opened on demand: each index is read and checked against the manifest (its chunks
// tile every (group, kind) exactly once) before any of its chunks is read.
class ShardSource {
 public:
  ShardSource(const CheckpointDir& dir, const Manifest& m, std::vector<ShardLayout> layouts, IoEngine& io)
      : dir_(dir), m_(m), io_(io), layouts_(std::move(layouts)) {}
  const ShardLayout& layout(int g) const { return layouts_[static_cast<size_t>(g)]; }
  int64_t bytes_read() const { return bytes_read_; }

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
  Result<const float*> Decoded(Rank& r, size_t k) {
    for (auto it = cache_.begin(); it != cache_.end(); ++it) {
      if (it->rank == r.index.rank && it->chunk == k) {
        cache_.splice(cache_.begin(), cache_, it);
        return cache_.front().data.get();
      }
    }
    const ChunkEntry& ce = r.index.chunks[k];
    const size_t need = (static_cast<size_t>(std::max(ce.elements * 4, ce.stored_bytes)) + kIoAlignment - 1) / kIoAlignment * kIoAlignment;
    Cached c{r.index.rank, k, nullptr, 0};
    if (cache_.size() >= 4) {  // the oldest entry's memory holds the new chunk when it is large enough
      if (cache_.back().capacity >= need) {
        c.data = std::move(cache_.back().data);
        c.capacity = cache_.back().capacity;
      }
      cache_.pop_back();
    }
    if (!c.data) {
      c.data.reset(static_cast<float*>(std::aligned_alloc(kIoAlignment, need)));
      if (!c.data) return OutOfMemoryError(r.index.data_file, ": no memory for a chunk of ", need, " bytes");
      c.capacity = need;
    }
    const int g = ce.group;  // in range: the index was validated
    RETURN_IF_ERROR(ReadChunkInto(io_, r.file, m_, layouts_[static_cast<size_t>(g)], r.index, k, c.data.get(), &scratch_, &bytes_read_));
    cache_.push_front(std::move(c));
    return cache_.front().data.get();
  }
  struct FreeFloats {
    void operator()(float* p) const { std::free(p); }
  };
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

Status TensorReader::Read(const std::string& name, const std::string& kind, int64_t offset, int64_t count, float* out) {
  ASSIGN_OR_RETURN(auto found, Find(name));
  const auto [g, t] = impl_->where.at(name);
  const GroupEntry& ge = *found.first;
  const auto k = std::find(ge.kinds.begin(), ge.kinds.end(), kind);
  if (k == ge.kinds.end()) return NotFoundError("tensor '", name, "' has no ", kind, " in ", impl_->cd.path());
  if (offset < 0 || count < 0 || offset > found.second->numel - count) {
    return InvalidArgumentError("tensor '", name, "': elements [", offset, ", ", offset + count, ") outside its ", found.second->numel);
  }
  for (const ShardPiece& op : impl_->src->layout(g).Locate(t, offset, offset + count)) {
    RETURN_IF_ERROR(impl_->src->Read(op.rank, g, static_cast<int>(k - ge.kinds.begin()), op.shard_offset, op.count,
                                     out + (op.tensor_offset - offset)),
                    "reading tensor '", name, "' (", kind, ") from ", impl_->cd.path());
  }
  return Status();
}

Result<LoadResult> Load(const std::string& dir, const StateView& target, const LoadOptions& options) {
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
  ShardSource src(cd, m, saved, *io);
  for (const StateGroup& tg : target.groups) {
    const int rank = tg.layout.world_size() == 1 ? 0 : target.rank;
    for (const StateBuffer& b : tg.buffers) {
      if (b.dtype != DType::kF32) return InvalidArgumentError("load: state '", b.kind, "' must be f32");
      if (!b.resident() && !b.write) return InvalidArgumentError("load: state '", b.kind, "' of group '", tg.name, "' is not resident and has no write");
      // Resolve this buffer's pieces first (one check per tensor).
      struct Source {
        ShardPiece piece;  // in the target shard
        int group, tensor, kind;
      };
      std::vector<Source> sources;
      if (!options.params_only || b.kind == "master") {
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
          sources.push_back({p, g, t, static_cast<int>(kind - ge.kinds.begin())});
        }
      }
      auto fill = [&](int64_t w0, int64_t w1, float* base) -> Status {
        for (const Source& src_piece : sources) {
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
      RETURN_IF_ERROR(FillStateBuffer(b, tg.name, fill));
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
  RETURN_IF_ERROR(Load(dir, w.view, o).status());
  return w;
}

}  // namespace zrt::ckpt
