// Load: plan every read once, then read it (chunk_source.h) and fill from the same plan.
//   1. PreparedLoad::Prepare (load_plan.h): check every target tensor against the manifest (names,
//      shapes, dtypes; strictness) before a byte of data is read;
//   2. plan each target buffer: read whole in place (the target group is laid out exactly as a saved
//      one: a restart at the same size), or a list of copies, each one contiguous range of one saved
//      shard, in the order the fill makes them;
//   3. PreparedLoad::Fill (Resume agrees on every rank's preparation first): the copies' chunks are read ahead in that order, the whole buffers in one pipeline of reads,
//      then every buffer is filled from its copies (through the owner, window by window, for state
//      that is not host memory).
#include "zrt/checkpoint/load.h"
#include "zrt/checkpoint/load_plan.h"

#include <algorithm>
#include <map>
#include <set>

#include "zrt/checkpoint/chunk_source.h"
#include "zrt/checkpoint/files.h"
#include "zrt/checkpoint/state_fill.h"
#include "zrt/core/logging.h"

namespace zrt::ckpt {

using internal::ShardSource;

namespace {

// Elements [dst, dst + count) of a target buffer come from saved shard `rank` of (group, kind) at `src`.
struct Copy {
  int64_t dst;
  int rank, group, kind;
  int64_t src, count;
};
// One target buffer: read whole from saved (group, kind) (whole_group >= 0), or through `copies`; a
// compact buffer the owner keeps in the same stored form as saved (stored_group >= 0) is handed its
// stored form, copies only where the owner takes f32 values alone.
struct BufferPlan {
  int whole_group = -1, whole_kind = -1;
  int stored_group = -1, stored_kind = -1;
  std::vector<Copy> copies;
};
using Where = std::map<std::string, std::pair<int, int>>;  // tensor name -> (saved group, tensor)

// Every target tensor against the checkpoint (names, shapes, dtypes), before any data is read; what
// does not match (not strict) goes in `r`.
Status CheckTensors(const std::string& dir, const Manifest& m, const Where& where, const StateView& target, const LoadOptions& o,
                    bool world, LoadResult* r) {
  std::set<std::string> in_target;
  for (const StateGroup& tg : target.groups) {
    for (const TensorSpec& spec : tg.tensors) {
      in_target.insert(spec.name);
      auto w = where.find(spec.name);
      if (w == where.end()) {
        if (o.strict) return NotFoundError("load: tensor '", spec.name, "' is not in checkpoint ", dir, " (LoadOptions::strict = false starts it at zero)");
        r->missing.push_back("tensor '" + spec.name + "'");
        continue;
      }
      const TensorEntry& te = m.groups[static_cast<size_t>(w->second.first)].tensors[static_cast<size_t>(w->second.second)];
      if (te.shape != spec.shape) {
        return InvalidArgumentError("load: tensor '", spec.name, "' has shape ", TensorSpec{te.name, te.shape, te.dtype}.ToString(), " in ", dir,
                                    ", the model has ", spec.ToString());
      }
      if (te.dtype != spec.dtype) {
        const std::string what = ::zrt::internal::StrCat("tensor '", spec.name, "': ", DTypeName(te.dtype), " in the checkpoint, ",
                                                         DTypeName(spec.dtype), " in the model");
        if (o.strict) return InvalidArgumentError("load: ", what, " (", dir, "; LoadOptions::strict = false loads it)");
        r->mismatched.push_back(what);
      }
    }
  }
  for (const auto& [name, gt] : where) {
    if (world || in_target.contains(name)) continue;  // world: judged over every rank (PreparedLoad::Claimed)
    if (o.strict) return InvalidArgumentError("load: checkpoint ", dir, " has tensor '", name, "', which the model does not (LoadOptions::strict = false ignores it)");
    r->unexpected.push_back("tensor '" + name + "'");
  }
  return Status();
}

// The saved group laid out exactly as target group `tg` (the same tensors at the same offsets, shard
// size and number of shards), or -1.
int SameLayout(const Manifest& m, const std::vector<ShardLayout>& saved, const Where& where, const StateGroup& tg) {
  if (tg.tensors.empty()) return -1;
  auto w = where.find(tg.tensors[0].name);
  if (w == where.end() || w->second.second != 0) return -1;
  const int g = w->second.first;
  const GroupEntry& ge = m.groups[static_cast<size_t>(g)];
  const ShardLayout& l = saved[static_cast<size_t>(g)];
  if (ge.tensors.size() != tg.tensors.size() || l.shard_size() != tg.layout.shard_size() || l.world_size() != tg.layout.world_size()) return -1;
  for (size_t t = 0; t < tg.tensors.size(); ++t) {
    if (ge.tensors[t].name != tg.tensors[t].name || ge.tensors[t].numel != tg.tensors[t].numel() ||
        ge.tensors[t].offset != tg.layout.tensor_offset(static_cast<int64_t>(t))) {
      return -1;
    }
  }
  return g;
}

// A kind saved in another precision than the target keeps it in loads converted (decoded to f32
// values, kept in the target's own precision; the same one loads as stored): said once, by shard 0.
void ReportConversion(const std::string& dir, const Manifest& m, const Where& where, const StateGroup& tg, const StateBuffer& b) {
  const auto w = tg.tensors.empty() ? where.end() : where.find(tg.tensors[0].name);
  if (w == where.end()) return;
  const GroupEntry& ge = m.groups[static_cast<size_t>(w->second.first)];
  const auto k = std::find(ge.kinds.begin(), ge.kinds.end(), b.kind);
  if (k == ge.kinds.end()) return;
  const Precision saved = ge.stored_as(static_cast<size_t>(k - ge.kinds.begin()));
  if (saved != b.format.precision) {
    ZRT_LOG(kInfo) << "load: group '" << tg.name << "' " << b.kind << " was saved as " << PrecisionName(saved) << " in " << dir
                   << "; kept here as " << PrecisionName(b.format.precision) << ": converted";
  }
}

// Where target buffer `b` of group `tg` (this rank's shard `rank`) comes from.
Result<BufferPlan> PlanBuffer(const std::string& dir, const Manifest& m, const std::vector<ShardLayout>& saved, const Where& where,
                              const StateGroup& tg, const StateBuffer& b, int rank, int same, const LoadOptions& o, LoadResult* r) {
  BufferPlan plan;
  if (o.params_only && b.kind != "master") return plan;  // stays zero
  if (rank == 0) ReportConversion(dir, m, where, tg, b);
  if (same >= 0) {
    const GroupEntry& ge = m.groups[static_cast<size_t>(same)];
    if (const auto k = std::find(ge.kinds.begin(), ge.kinds.end(), b.kind); k != ge.kinds.end()) {
      const int kind = static_cast<int>(k - ge.kinds.begin());
      if (b.data != nullptr) {
        plan.whole_group = same;
        plan.whole_kind = kind;
        return plan;
      }
      if (b.format.compact() && ge.format(static_cast<size_t>(kind)) == b.format) {
        plan.stored_group = same;
        plan.stored_kind = kind;
      }
    }
  }
  for (const ShardPiece& p : tg.layout.RankPieces(rank)) {
    const TensorSpec& spec = tg.tensors[static_cast<size_t>(p.tensor)];
    auto w = where.find(spec.name);
    if (w == where.end()) continue;  // not strict, reported by CheckTensors
    const auto [g, t] = w->second;
    const GroupEntry& ge = m.groups[static_cast<size_t>(g)];
    const auto kind = std::find(ge.kinds.begin(), ge.kinds.end(), b.kind);
    if (kind == ge.kinds.end()) {
      if (o.strict || b.kind == "master") {
        return DataLossError("load: checkpoint ", dir, " has no ", b.kind, " for tensor '", spec.name, "' (group '", ge.name, "' saved ",
                             ge.kinds.size(), " state kinds)");
      }
      if (p.tensor_offset == 0) r->missing.push_back("tensor '" + spec.name + "' (" + b.kind + ")");
      continue;
    }
    for (const ShardPiece& op : saved[static_cast<size_t>(g)].Locate(t, p.tensor_offset, p.tensor_offset + p.count)) {
      plan.copies.push_back({p.shard_offset + (op.tensor_offset - p.tensor_offset), op.rank, g, static_cast<int>(kind - ge.kinds.begin()),
                             op.shard_offset, op.count});
    }
  }
  return plan;
}

// Hands buffer (gi, bi) of `target` its stored form, chunk by chunk (each checked first); false in
// `taken` where the owner keeps it as f32 values only (nothing was written).
Status FillStored(const std::string& dir, const StateView& target, int gi, int bi, const BufferPlan& bp, ShardSource& src, bool* taken) {
  const StateGroup& tg = target.groups[static_cast<size_t>(gi)];
  const StateBuffer& b = tg.buffers[static_cast<size_t>(bi)];
  *taken = true;
  ASSIGN_OR_RETURN(const std::optional<StoredPart> kept, target.StoredMemory(gi, bi), "loading group '", tg.name, "' (", b.kind, ")");
  if (kept.has_value()) {  // straight into the owner's memory
    return src.CopyStored(target.ShardOf(tg), bp.stored_group, bp.stored_kind, b.count, *kept)
        .WithContext("loading group '" + tg.name + "' (" + b.kind + ") from " + dir);
  }
  const int64_t unit = b.format.blockwise() ? b.format.block : 1;
  Status s = src.ForEachStored(target.ShardOf(tg), bp.stored_group, bp.stored_kind, b.count,
                               [&](int64_t begin, int64_t n, const char* stored) -> Status {
                                 if (begin % unit != 0) return DataLossError("a chunk of codes starts inside a block of ", unit);
                                 const auto* scales = reinterpret_cast<const float*>(stored + b.format.ValuesBytes(n));
                                 Status w = target.WriteStored(gi, bi, begin, n, stored, scales);
                                 if (w.code() == StatusCode::kUnavailable && begin == 0) *taken = false;
                                 return w;
                               });
  if (!*taken) return Status();
  return s.WithContext("loading group '" + tg.name + "' (" + b.kind + ") from " + dir);
}

// Fills buffer (gi, bi) of `target` from its copies (sorted by dst), window by window where it is not
// host memory.
Status FillBuffer(const std::string& dir, const StateView& target, int gi, int bi, const std::vector<Copy>& copies, ShardSource& src) {
  const StateGroup& tg = target.groups[static_cast<size_t>(gi)];
  size_t first = 0;
  return FillStateBuffer(target, gi, bi, [&](int64_t w0, int64_t w1, float* base) -> Status {
    while (first < copies.size() && copies[first].dst + copies[first].count <= w0) ++first;
    for (size_t i = first; i < copies.size() && copies[i].dst < w1; ++i) {
      const Copy& c = copies[i];
      const int64_t lo = std::max(w0, c.dst), hi = std::min(w1, c.dst + c.count);
      RETURN_IF_ERROR(src.Read(c.rank, c.group, c.kind, c.src + (lo - c.dst), hi - lo, base + (lo - w0)), "loading group '", tg.name, "' (",
                      tg.buffers[static_cast<size_t>(bi)].kind, ") from ", dir);
    }
    return Status();
  });
}

}  // namespace

namespace internal {

struct PreparedLoad::Impl {
  std::string dir;
  const StateView* target;
  LoadOptions options;
  CheckpointDir cd;
  Manifest m;
  std::vector<ShardLayout> saved;
  std::unique_ptr<IoEngine> io;
  std::vector<std::vector<BufferPlan>> plan;
  LoadResult result;
};

Result<std::set<std::string>> WorldTensorNames(Communicator* comm, const StateView& target) {
  std::string mine;
  for (const StateGroup& g : target.groups) {
    for (const TensorSpec& t : g.tensors) mine += t.name + '\n';
  }
  ASSIGN_OR_RETURN(const std::vector<std::string> all, AllGatherStrings(comm, mine));
  std::set<std::string> world;
  for (const std::string& names : all) {
    for (size_t at = 0, end; (end = names.find('\n', at)) != std::string::npos; at = end + 1) world.insert(names.substr(at, end - at));
  }
  return world;
}

PreparedLoad::PreparedLoad(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PreparedLoad::~PreparedLoad() = default;

Result<std::unique_ptr<PreparedLoad>> PreparedLoad::Prepare(const std::string& dir, const StateView& target, const LoadOptions& options,
                                                           bool* mismatch, bool world) {
  if (mismatch != nullptr) *mismatch = false;
  auto p = std::make_unique<Impl>();
  p->dir = dir;
  p->target = &target;
  p->options = options;
  ASSIGN_OR_RETURN(p->cd, CheckpointDir::Open(dir), "loading checkpoint");
  ASSIGN_OR_RETURN(p->m, ReadManifest(p->cd), "loading checkpoint");
  ASSIGN_OR_RETURN(p->saved, SavedLayouts(p->m), "loading checkpoint");
  ASSIGN_OR_RETURN(p->io, IoEngine::Create(options.io), "loading checkpoint");
  Where where;  // names are unique
  for (int g = 0; g < static_cast<int>(p->m.groups.size()); ++g) {
    for (int t = 0; t < static_cast<int>(p->m.groups[static_cast<size_t>(g)].tensors.size()); ++t) {
      where[p->m.groups[static_cast<size_t>(g)].tensors[static_cast<size_t>(t)].name] = {g, t};
    }
  }
  if (Status s = CheckTensors(dir, p->m, where, target, options, world, &p->result); !s.ok()) {
    if (mismatch != nullptr) *mismatch = true;
    return s;
  }
  p->plan.resize(target.groups.size());
  for (size_t gi = 0; gi < target.groups.size(); ++gi) {
    const StateGroup& tg = target.groups[gi];
    const int same = SameLayout(p->m, p->saved, where, tg), rank = target.ShardOf(tg);
    if (rank < 0) return InvalidArgumentError("load: group '", tg.name, "': rank ", target.rank, " is not in its own data-parallel group");
    for (const StateBuffer& b : tg.buffers) {
      if (b.dtype != DType::kF32) return InvalidArgumentError("load: state '", b.kind, "' must be f32");
      if (!b.resident() && target.owner == nullptr) {
        return InvalidArgumentError("load: state '", b.kind, "' of group '", tg.name, "' is not resident and the view has no owner");
      }
      ASSIGN_OR_RETURN(BufferPlan bp, PlanBuffer(dir, p->m, p->saved, where, tg, b, rank, same, options, &p->result));
      p->plan[gi].push_back(std::move(bp));
    }
  }
  return std::unique_ptr<PreparedLoad>(new PreparedLoad(std::move(p)));
}

const Manifest& PreparedLoad::manifest() const { return impl_->m; }

std::vector<float> PreparedLoad::Claimed() const {
  std::set<std::string> mine;
  for (const StateGroup& tg : impl_->target->groups) {
    for (const TensorSpec& spec : tg.tensors) mine.insert(spec.name);
  }
  std::vector<float> out;
  for (const GroupEntry& ge : impl_->m.groups) {
    for (const TensorEntry& te : ge.tensors) out.push_back(mine.contains(te.name) ? 1.0f : 0.0f);
  }
  return out;
}

void PreparedLoad::AddUnexpected(std::vector<std::string> names) {
  for (std::string& n : names) impl_->result.unexpected.push_back("tensor '" + n + "'");
}

Result<LoadResult> PreparedLoad::Fill() {
  Impl& p = *impl_;
  const StateView& target = *p.target;
  RETURN_IF_ERROR(target.Settle(), "loading checkpoint");  // a capture still reading the buffers ends before they change
  ShardSource src(p.cd, p.m, p.saved, *p.io);
  // Compact buffers kept as saved: their stored forms first; copies planned for any the owner refuses.
  for (size_t gi = 0; gi < p.plan.size(); ++gi) {
    for (size_t bi = 0; bi < p.plan[gi].size(); ++bi) {
      BufferPlan& bp = p.plan[gi][bi];
      if (bp.stored_group < 0) continue;
      bool taken = false;
      RETURN_IF_ERROR(FillStored(p.dir, target, static_cast<int>(gi), static_cast<int>(bi), bp, src, &taken));
      if (taken) bp.copies.clear();
    }
  }
  std::vector<ShardSource::Whole> wholes;  // the buffers read in place, all in one pipeline
  for (size_t gi = 0; gi < p.plan.size(); ++gi) {
    const StateGroup& tg = target.groups[gi];
    for (size_t bi = 0; bi < p.plan[gi].size(); ++bi) {
      const BufferPlan& bp = p.plan[gi][bi];
      const StateBuffer& b = tg.buffers[bi];
      if (bp.whole_group >= 0) {
        wholes.push_back({target.ShardOf(tg), bp.whole_group, bp.whole_kind, static_cast<float*>(b.data), b.count,
                          "loading group '" + tg.name + "' (" + b.kind + ") from " + p.dir});
      }
      for (const Copy& c : bp.copies) RETURN_IF_ERROR(src.Plan(c.rank, c.group, c.kind, c.src, c.count), "loading from ", p.dir);
    }
  }
  src.Start(p.options.read_ahead_bytes);
  RETURN_IF_ERROR(src.ReadWhole(wholes));
  for (size_t gi = 0; gi < p.plan.size(); ++gi) {
    for (size_t bi = 0; bi < p.plan[gi].size(); ++bi) {
      const BufferPlan& bp = p.plan[gi][bi];
      if (bp.whole_group < 0 && !(bp.stored_group >= 0 && bp.copies.empty())) RETURN_IF_ERROR(FillBuffer(p.dir, target, static_cast<int>(gi), static_cast<int>(bi), p.plan[gi][bi].copies, src));
    }
  }
  LoadResult& r = p.result;
  const Manifest& m = p.m;
  r.counters = {m.step, m.loss_scale, m.scaler_good_steps, m.scaler_hysteresis_left, m.engine_state.dump()};
  r.trainer_state = m.trainer_state;
  r.saved_world_size = m.world_size;
  r.saved_stage = m.stage;
  r.bytes_read = src.bytes_read();
  return r;
}

}  // namespace internal

Result<LoadResult> Load(const std::string& dir, const StateView& target, const LoadOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<internal::PreparedLoad> prepared, internal::PreparedLoad::Prepare(dir, target, options));
  return prepared->Fill();
}

}  // namespace zrt::ckpt
