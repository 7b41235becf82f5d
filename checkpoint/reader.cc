#include "zrt/checkpoint/reader.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <list>
#include <map>

#include "zrt/checkpoint/fs_util.h"
#include "zrt/core/logging.h"

namespace zrt::ckpt {

namespace fs = std::filesystem;

Result<Manifest> ReadManifest(const std::string& dir) {
  const std::string path = dir + "/" + std::string(kManifestFile);
  ASSIGN_OR_RETURN(std::string text, ReadWholeFile(path));
  return DecodeManifest(text, path);
}

Result<RankIndex> ReadIndex(const std::string& dir, int rank) {
  const std::string path = dir + "/" + IndexFileName(rank);
  ASSIGN_OR_RETURN(std::string text, ReadWholeFile(path));
  ASSIGN_OR_RETURN(RankIndex r, DecodeIndex(text, path));
  if (r.rank != rank) return DataLossError(path, ": index of rank ", r.rank, " under the name of rank ", rank);
  return r;
}

namespace {

struct AlignedBytes {
  explicit AlignedBytes(size_t n) : p(static_cast<char*>(std::aligned_alloc(kIoAlignment, (n / kIoAlignment + 1) * kIoAlignment))) {}
  ~AlignedBytes() { std::free(p); }
  AlignedBytes(const AlignedBytes&) = delete;
  AlignedBytes& operator=(const AlignedBytes&) = delete;
  char* p;
};

// "tensors a, b, c" overlapping elements [begin, end) of `rank`'s shard.
std::string TensorsIn(const Manifest& m, const ShardLayout& l, int group, int rank, int64_t begin, int64_t end) {
  std::string out;
  int named = 0;
  for (const ShardPiece& p : l.RankPieces(rank)) {
    if (p.shard_offset + p.count <= begin || p.shard_offset >= end) continue;
    if (named == 3) {
      out += ", ...";
      break;
    }
    out += (named++ ? ", " : "") + m.groups[static_cast<size_t>(group)].tensors[static_cast<size_t>(p.tensor)].name;
  }
  return named ? "tensors " + out : "padding only";
}

std::string ChunkName(const Manifest& m, const ShardLayout& l, const RankIndex& r, size_t k) {
  const ChunkEntry& c = r.chunks[k];
  const GroupEntry& g = m.groups[static_cast<size_t>(c.group)];
  return ::zrt::internal::StrCat(r.data_file, " chunk ", k, " (group '", g.name, "', ",
                          c.kind >= 0 && c.kind < static_cast<int>(g.kinds.size()) ? g.kinds[static_cast<size_t>(c.kind)] : "?",
                          ", elements ", c.elem_offset, "..", c.elem_offset + c.elements, ", ",
                          TensorsIn(m, l, c.group, r.rank, c.elem_offset, c.elem_offset + c.elements), ")");
}

// Reads, checks and decodes chunk k of a rank's data file into `out` (elements floats).
Status ReadChunk(IoEngine& io, const IoFile& f, const Manifest& m, const ShardLayout& l, const RankIndex& r, size_t k,
                 std::vector<float>* out, std::vector<char>* scratch, int64_t* bytes_read) {
  const ChunkEntry& c = r.chunks[k];
  AlignedBytes buf(static_cast<size_t>(c.stored_bytes));
  RETURN_IF_ERROR(io.ReadSync(f, buf.p, static_cast<size_t>(c.stored_bytes), c.file_offset), ChunkName(m, l, r, k));
  *bytes_read += c.stored_bytes;
  if (Checksum(buf.p, static_cast<size_t>(c.stored_bytes)) != c.xxh3) {
    return DataLossError(f.path(), ": ", ChunkName(m, l, r, k), ": checksum mismatch (the data is corrupt)");
  }
  out->resize(static_cast<size_t>(c.elements));
  RETURN_IF_ERROR(DecodeChunk(c.codec, buf.p, static_cast<size_t>(c.stored_bytes), out->data(),
                              static_cast<size_t>(c.elements) * 4, 4, scratch),
                  f.path(), ": ", ChunkName(m, l, r, k));
  return Status();
}

}  // namespace

Status CheckComplete(const std::string& dir, VerifyLevel level, std::vector<std::string>* problems) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return NotFoundError(dir, ": not a directory");
  auto m = ReadManifest(dir);
  if (!m.ok()) {
    problems->push_back(std::string(m.status().message()));
    return Status();
  }
  std::vector<ShardLayout> layouts;
  for (int g = 0; g < static_cast<int>(m->groups.size()); ++g) {
    auto l = SavedLayout(*m, g);
    if (!l.ok()) {
      problems->push_back(std::string(l.status().message()));
      return Status();
    }
    layouts.push_back(std::move(*l));
  }
  // Only full verification reads data: the engine (a ring and a thread) is made for that alone, and
  // a failure to make it is an error, not a silently skipped check.
  std::unique_ptr<IoEngine> io;
  if (level == VerifyLevel::kFull) {
    ASSIGN_OR_RETURN(io, IoEngine::Create(IoOptions{}), "verifying ", dir);
  }
  for (int r = 0; r < m->shards; ++r) {
    auto idx = ReadIndex(dir, r);
    if (!idx.ok()) {
      problems->push_back(idx.status().code() == StatusCode::kNotFound
                              ? IndexFileName(r) + ": missing (rank " + std::to_string(r) + " did not finish)"
                              : std::string(idx.status().message()));
      continue;
    }
    if (idx->nonce != m->nonce || idx->step != m->step || idx->shards != m->shards) {
      problems->push_back(IndexFileName(r) + ": belongs to another save (nonce/step/shards disagree with the manifest)");
      continue;
    }
    const std::string data = dir + "/" + idx->data_file;
    const auto size = fs::file_size(data, ec);
    if (ec) {
      problems->push_back(idx->data_file + ": missing");
      continue;
    }
    if (static_cast<int64_t>(size) != idx->data_bytes) {
      problems->push_back(::zrt::internal::StrCat(idx->data_file, ": ", size, " bytes, the index says ", idx->data_bytes, " (truncated?)"));
      continue;
    }
    // Every (group, kind) shard is covered exactly once by its chunks.
    std::map<std::pair<int, int>, std::vector<std::pair<int64_t, int64_t>>> cover;
    for (const ChunkEntry& c : idx->chunks) cover[{c.group, c.kind}].push_back({c.elem_offset, c.elements});
    for (int g = 0; g < static_cast<int>(m->groups.size()); ++g) {
      for (int k = 0; k < static_cast<int>(m->groups[static_cast<size_t>(g)].kinds.size()); ++k) {
        auto& v = cover[{g, k}];
        std::sort(v.begin(), v.end());
        int64_t at = 0;
        for (const auto& [off, n] : v) {
          if (off != at) break;
          at += n;
        }
        if (at != layouts[static_cast<size_t>(g)].shard_size()) {
          problems->push_back(::zrt::internal::StrCat(IndexFileName(r), ": group '", m->groups[static_cast<size_t>(g)].name, "' ",
                                               m->groups[static_cast<size_t>(g)].kinds[static_cast<size_t>(k)],
                                               " is not covered by its chunks"));
        }
      }
    }
    if (io) {
      auto f = IoFile::Open(data, IoFile::Mode::kRead);
      if (!f.ok()) {
        problems->push_back(std::string(f.status().message()));
        continue;
      }
      std::vector<float> chunk;
      std::vector<char> scratch;
      int64_t bytes = 0;
      // The alignment padding between chunks is covered too: it must read as zeros.
      std::vector<std::pair<int64_t, int64_t>> spans;
      for (const ChunkEntry& c : idx->chunks) spans.push_back({c.file_offset, c.file_offset + c.stored_bytes});
      std::sort(spans.begin(), spans.end());
      int64_t at = 0;
      for (const auto& [b, e] : spans) {
        if (b > at) {
          std::vector<char> gap(static_cast<size_t>(b - at));
          Status rs = io->ReadSync(*f, gap.data(), gap.size(), at);
          if (!rs.ok() || std::any_of(gap.begin(), gap.end(), [](char c) { return c != 0; })) {
            problems->push_back(::zrt::internal::StrCat(idx->data_file, ": padding bytes ", at, "..", b,
                                                 " between chunks are not zero (corrupt)"));
          }
        }
        at = std::max(at, e);
      }
      for (size_t k = 0; k < idx->chunks.size(); ++k) {
        const int g = idx->chunks[k].group;
        if (g < 0 || g >= static_cast<int>(layouts.size())) {
          problems->push_back(::zrt::internal::StrCat(idx->data_file, " chunk ", k, ": unknown group ", g));
          continue;
        }
        Status s = ReadChunk(*io, *f, *m, layouts[static_cast<size_t>(g)], *idx, k, &chunk, &scratch, &bytes);
        if (!s.ok()) problems->push_back(std::string(s.message()));
      }
    }
  }
  return Status();
}

Result<std::vector<CheckpointInfo>> ListCheckpoints(const std::string& root, VerifyLevel level) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return NotFoundError(root, ": no such checkpoint root directory");
  std::vector<CheckpointInfo> out;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    if (!e.is_directory()) continue;
    const std::string name = e.path().filename().string();
    const size_t tmp = name.find(".tmp-");
    auto step = ParseStepDirName(tmp == std::string::npos ? name : name.substr(0, tmp));
    if (!step.ok()) continue;
    CheckpointInfo info;
    info.dir = e.path().string();
    info.step = *step;
    for (const auto& f : fs::directory_iterator(e.path(), ec)) {
      if (f.is_regular_file()) info.bytes += static_cast<int64_t>(f.file_size());
    }
    if (auto m = ReadManifest(info.dir); m.ok()) {
      info.world_size = m->world_size;
      info.stage = m->stage;
      info.created_unix = m->created_unix;
    }
    if (tmp != std::string::npos) {
      info.in_progress = true;
      info.problem = "being written, or a save that died (removed at the next start)";
    } else {
      std::vector<std::string> problems;
      Status s = CheckComplete(info.dir, level, &problems);
      info.complete = s.ok() && problems.empty();
      if (!s.ok()) info.problem = std::string(s.message());
      if (!problems.empty()) info.problem = problems.front() + (problems.size() > 1 ? ::zrt::internal::StrCat(" (+", problems.size() - 1, " more)") : "");
    }
    out.push_back(std::move(info));
  }
  if (ec) return ErrnoStatus(ec.value(), "listing " + root);
  std::sort(out.begin(), out.end(), [](const CheckpointInfo& a, const CheckpointInfo& b) {
    return a.step != b.step ? a.step > b.step : a.complete > b.complete;
  });
  return out;
}

Result<std::string> FindLatestComplete(const std::string& root, VerifyLevel level) {
  ASSIGN_OR_RETURN(auto list, ListCheckpoints(root, level));
  std::string skipped;
  for (const CheckpointInfo& c : list) {
    if (c.complete) {
      if (!skipped.empty()) ZRT_LOG(kWarn) << "checkpoint: skipped newer incomplete ones:" << skipped;
      return c.dir;
    }
    skipped += " " + fs::path(c.dir).filename().string() + " (" + c.problem + ")";
  }
  return NotFoundError("no complete checkpoint under ", root, skipped.empty() ? "" : ":" + skipped);
}

Status PlanReshard(const Manifest& m, int new_shards, const std::function<void(const ReshardRead&)>& visit) {
  if (new_shards < 1) return InvalidArgumentError("reshard plan: new shard count must be >= 1, got ", new_shards);
  for (int g = 0; g < static_cast<int>(m.groups.size()); ++g) {
    ASSIGN_OR_RETURN(ShardLayout old_l, SavedLayout(m, g));
    std::vector<int64_t> numels;
    for (const TensorEntry& t : m.groups[static_cast<size_t>(g)].tensors) numels.push_back(t.numel);
    ASSIGN_OR_RETURN(ShardLayout new_l, ShardLayout::Create(numels, new_shards, old_l.alignment()));
    // Only real elements need reading: [0, end of the last tensor) in flat coordinates.
    const int64_t end = numels.empty() ? 0 : new_l.tensor_offset(new_l.num_tensors() - 1) + numels.back();
    int old_r = 0;
    for (int r = 0; r < new_shards; ++r) {
      const int64_t b = new_l.shard_begin(r), e = std::min(new_l.shard_end(r), end);
      if (b >= e) break;
      while (old_l.shard_end(old_r) <= b) ++old_r;
      for (int o = old_r; o < old_l.world_size() && old_l.shard_begin(o) < e; ++o) {
        const int64_t lo = std::max(b, old_l.shard_begin(o)), hi = std::min(e, old_l.shard_end(o));
        visit(ReshardRead{r, o, g, lo - b, lo - old_l.shard_begin(o), hi - lo});
      }
    }
  }
  return Status();
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

// ---- Load ------------------------------------------------------------------------------------------
namespace {

class ShardSource {
 public:
  ShardSource(std::string dir, const Manifest& m, IoEngine& io) : dir_(std::move(dir)), m_(m), io_(io) {
    for (int g = 0; g < static_cast<int>(m.groups.size()); ++g) layouts_.push_back(*SavedLayout(m, g));
  }
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
      ASSIGN_OR_RETURN(const std::vector<float>* data, Decoded(*r, k));
      const int64_t lo = std::max(at, c.elem_offset), hi = std::min(begin + count, c.elem_offset + c.elements);
      if (lo != at) return DataLossError(r->index.data_file, ": chunks leave a gap at element ", at);
      std::memcpy(dst + (lo - begin), data->data() + (lo - c.elem_offset), static_cast<size_t>(hi - lo) * 4);
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
    ASSIGN_OR_RETURN(r->index, ReadIndex(dir_, rank));
    if (r->index.nonce != m_.nonce) return DataLossError(dir_, "/", IndexFileName(rank), ": belongs to another save than the manifest");
    ASSIGN_OR_RETURN(r->file, IoFile::Open(dir_ + "/" + r->index.data_file, IoFile::Mode::kRead));
    for (size_t k = 0; k < r->index.chunks.size(); ++k) r->by_kind[{r->index.chunks[k].group, r->index.chunks[k].kind}].push_back(k);
    for (auto& [key, v] : r->by_kind) {
      std::sort(v.begin(), v.end(), [&](size_t a, size_t b) { return r->index.chunks[a].elem_offset < r->index.chunks[b].elem_offset; });
    }
    return (ranks_[rank] = std::move(r)).get();
  }
  // A few decoded chunks stay cached: consecutive pieces usually fall in the same chunk.
  Result<const std::vector<float>*> Decoded(Rank& r, size_t k) {
    for (auto it = cache_.begin(); it != cache_.end(); ++it) {
      if (it->rank == r.index.rank && it->chunk == k) {
        cache_.splice(cache_.begin(), cache_, it);
        return &cache_.front().data;
      }
    }
    Cached c{r.index.rank, k, {}};
    const int g = r.index.chunks[k].group;
    if (g < 0 || g >= static_cast<int>(layouts_.size())) return DataLossError(r.index.data_file, ": chunk ", k, " names unknown group ", g);
    RETURN_IF_ERROR(ReadChunk(io_, r.file, m_, layouts_[static_cast<size_t>(g)], r.index, k, &c.data, &scratch_, &bytes_read_));
    cache_.push_front(std::move(c));
    if (cache_.size() > 4) cache_.pop_back();
    return &cache_.front().data;
  }
  struct Cached {
    int rank;
    size_t chunk;
    std::vector<float> data;
  };
  std::string dir_;
  const Manifest& m_;
  IoEngine& io_;
  std::vector<ShardLayout> layouts_;
  std::map<int, std::unique_ptr<Rank>> ranks_;
  std::list<Cached> cache_;
  std::vector<char> scratch_;
  int64_t bytes_read_ = 0;
};

}  // namespace

Result<LoadResult> Load(const std::string& dir, const StateView& target, const LoadOptions& options) {
  ASSIGN_OR_RETURN(Manifest m, ReadManifest(dir), "loading checkpoint");
  ASSIGN_OR_RETURN(auto io, IoEngine::Create(options.io), "loading checkpoint");
  std::map<std::string, std::pair<int, int>> where;  // tensor name -> (group, tensor)
  for (int g = 0; g < static_cast<int>(m.groups.size()); ++g) {
    for (int t = 0; t < static_cast<int>(m.groups[static_cast<size_t>(g)].tensors.size()); ++t) {
      where[m.groups[static_cast<size_t>(g)].tensors[static_cast<size_t>(t)].name] = {g, t};
    }
  }
  std::vector<ShardLayout> saved;
  for (int g = 0; g < static_cast<int>(m.groups.size()); ++g) {
    ASSIGN_OR_RETURN(ShardLayout l, SavedLayout(m, g), dir);
    saved.push_back(std::move(l));
  }
  ShardSource src(dir, m, *io);
  for (const StateGroup& tg : target.groups) {
    const int rank = tg.layout.world_size() == 1 ? 0 : target.rank;
    for (const StateBuffer& b : tg.buffers) {
      if (b.dtype != DType::kF32) return InvalidArgumentError("load: state '", b.kind, "' must be f32");
      if (!b.resident() && !b.write) return InvalidArgumentError("load: state '", b.kind, "' of group '", tg.name, "' is not resident and has no write");
      // Resolve this buffer's pieces first (one check and one warning per tensor).
      struct Source {
        ShardPiece piece;  // in the target shard
        int group, tensor, kind;
      };
      std::vector<Source> sources;
      if (!options.params_only || b.kind == "master") {
        for (const ShardPiece& p : tg.layout.RankPieces(rank)) {
          const TensorSpec& spec = tg.tensors[static_cast<size_t>(p.tensor)];
          auto w = where.find(spec.name);
          if (w == where.end()) return NotFoundError("load: tensor '", spec.name, "' is not in checkpoint ", dir);
          const auto [g, t] = w->second;
          const GroupEntry& ge = m.groups[static_cast<size_t>(g)];
          const TensorEntry& te = ge.tensors[static_cast<size_t>(t)];
          if (te.numel != spec.numel()) {
            return InvalidArgumentError("load: tensor '", spec.name, "' has ", te.numel, " elements in ", dir, ", the model has ",
                                        spec.numel(), " (", spec.ToString(), ")");
          }
          const auto kind = std::find(ge.kinds.begin(), ge.kinds.end(), b.kind);
          if (kind == ge.kinds.end()) {
            if (b.kind == "master") return DataLossError("load: checkpoint ", dir, " has no master weights for group '", ge.name, "'");
            ZRT_LOG(kWarn) << "load: checkpoint has no " << b.kind << " for tensor " << spec.name << "; it starts at zero";
            continue;
          }
          sources.push_back({p, g, t, static_cast<int>(kind - ge.kinds.begin())});
        }
      }
      // Resident state is filled in place (one window); other state through a bounded bounce buffer
      // written back window by window. Padding and missing kinds end up zero.
      constexpr int64_t kWindow = int64_t{1} << 22;
      const int64_t window = b.resident() ? std::max<int64_t>(b.count, 1) : kWindow;
      std::vector<float> bounce(b.resident() ? 0 : static_cast<size_t>(std::min(window, b.count)));
      for (int64_t w0 = 0; w0 < b.count; w0 += window) {
        const int64_t w1 = std::min(b.count, w0 + window);
        float* base = b.resident() ? static_cast<float*>(b.data) + w0 : bounce.data();  // element w0
        std::memset(base, 0, static_cast<size_t>(w1 - w0) * 4);
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
        if (!b.resident()) RETURN_IF_ERROR(b.write(w0, w1 - w0, base), "loading ", b.kind, " of group '", tg.name, "'");
      }
    }
  }
  LoadResult r;
  r.step = m.step;
  r.trainer_state = m.trainer_state;
  r.loss_scale = m.loss_scale;
  r.scaler_good_steps = m.scaler_good_steps;
  r.scaler_hysteresis_left = m.scaler_hysteresis_left;
  r.saved_world_size = m.world_size;
  r.saved_stage = m.stage;
  r.bytes_read = src.bytes_read();
  return r;
}

Result<WholeGroup> LoadWholeGroup(const std::string& dir, const Manifest& m, int group, const std::vector<std::string>& kinds) {
  WholeGroup w;
  ASSIGN_OR_RETURN(StateGroup sg, GroupForShards(m, group, 1));
  w.data.resize(kinds.size());
  for (size_t k = 0; k < kinds.size(); ++k) {
    w.data[k].resize(static_cast<size_t>(sg.layout.shard_size()));
    sg.buffers.push_back({kinds[k], DType::kF32, w.data[k].data(), sg.layout.shard_size()});
  }
  w.view.groups.push_back(std::move(sg));
  RETURN_IF_ERROR(Load(dir, w.view).status());
  return w;
}

}  // namespace zrt::ckpt
