// The memory tier's side of a resume (memory_tier.h TierCandidates, LoadFromTier):
//   candidates   every rank lists the generations it holds (own copy, and the replica it keeps for
//                its source); the steps every rank can restore, one way or the other, are agreed.
//   restore      every rank loads its own copy (a mapped tmpfs file: chunk_source.h); the ranks agree
//                who needs its replica; each holder offers the replica it keeps (manifest, index, the
//                data file mapped) to its source; two shifts move the manifest and the index, checked
//                by the receiver (bounded sizes, the format's rules, the step); then one shift per piece
//                of the data file (a (group, kind) of PlanFile's layout) moves the data:
//                  direct   where every target buffer is host f32 memory laid out as its piece (the
//                           same engine restarted: the usual case), each piece lands in its buffer
//                           and each chunk is checked there against the index: the restore costs the
//                           transfer and one hash pass, and allocates nothing;
//                  file     else (compact or device state, a load that is not strict) into a file
//                           of the size the target's shard must be (checked before it is allocated),
//                           placed as the rank's own copy again and loaded, checked like any.
//                A rank that cannot take what its holder offers says why (agreed) before the data
//                moves, and every rank drops the candidate with that reason.
#include <algorithm>
#include <set>

#include "zrt/checkpoint/codec.h"
#include "zrt/checkpoint/files.h"
#include "zrt/checkpoint/fs_util.h"
#include "zrt/checkpoint/tier/memory_tier.h"
#include "zrt/checkpoint/tier/tier_dir.h"
#include "zrt/checkpoint/tier/tier_file.h"
#include "zrt/core/logging.h"
#include "zrt/offload/io_engine.h"

namespace zrt::ckpt {

using namespace internal;

namespace {

// The replica a holder keeps of its source's generation `step`, offered back: manifest, index and the
// data file mapped, with their sizes, and the data file's pieces; all empty when it cannot (said in
// the log).
struct Offer {
  std::string files[2];
  Mapping data;
  std::vector<Piece> plan;
  int64_t sizes[3] = {0, 0, 0};
};
Offer OfferReplica(const std::string& rep, int source, int64_t step) {
  Offer o;
  Status s = [&]() -> Status {
    ASSIGN_OR_RETURN(CheckpointDir cd, CheckpointDir::Open(rep));
    ASSIGN_OR_RETURN(o.files[0], cd.ReadFile(kManifestFile));
    ASSIGN_OR_RETURN(Manifest m, DecodeManifest(o.files[0], cd.PathOf(kManifestFile)));
    const int shard = source % m.shards;  // core/state_view.h's numbering
    ASSIGN_OR_RETURN(o.files[1], cd.ReadFile(IndexFileName(shard)));
    int64_t total = 0;
    ASSIGN_OR_RETURN(o.plan, PlanFile(m, &total));
    ASSIGN_OR_RETURN(o.data, Mapping::Map(cd.PathOf(DataFileName(shard)), total, false));
    return Status();
  }();
  if (s.ok()) {
    o.sizes[0] = static_cast<int64_t>(o.files[0].size());
    o.sizes[1] = static_cast<int64_t>(o.files[1].size());
    o.sizes[2] = static_cast<int64_t>(o.data.size());
    return o;
  }
  ZRT_LOG(kWarn) << "memory tier: cannot send rank " << source << " its replica of step " << step << ": " << s;
  return Offer{};
}

// What a rank receives from its holder: the manifest and index (taken when their sizes are within the
// format's bounds), then, once they are checked, where each piece of the data goes.
struct Receipt {
  std::string got[2];
  bool receiving = false;  // the manifest and index are taken
  Manifest m;
  RankIndex index;
  std::vector<Piece> plan;
  std::vector<char*> into;  // per piece: its target buffer (direct) or its place in `file`
  Mapping file;             // not direct: the data file in the temp directory
  Status prepared = InternalError("memory tier: nothing offered");
  bool direct() const { return prepared.ok() && !file.data(); }
  bool take() const { return receiving && prepared.ok(); }
};

// Each piece's target buffer when every one is host f32 memory laid out as the replica's (the same
// tensors, offsets, shard size and kinds, in order), else empty.
std::vector<char*> DirectTargets(const Manifest& m, const std::vector<Piece>& plan, const StateView& target, const LoadOptions& load) {
  auto layouts = SavedLayouts(m);
  if (!load.strict || load.params_only || !layouts.ok() || m.groups.size() != target.groups.size()) return {};
  std::vector<char*> into;
  for (const Piece& p : plan) {
    const GroupEntry& ge = m.groups[static_cast<size_t>(p.group)];
    const StateGroup& tg = target.groups[static_cast<size_t>(p.group)];
    const auto k = static_cast<size_t>(p.kind);
    if (ge.name != tg.name || ge.tensors.size() != tg.tensors.size() || k >= tg.buffers.size() || ge.kinds.size() != tg.buffers.size()) return {};
    const ShardLayout& l = (*layouts)[static_cast<size_t>(p.group)];
    if (l.shard_size() != tg.layout.shard_size() || l.world_size() != tg.layout.world_size()) return {};
    for (size_t t = 0; t < tg.tensors.size(); ++t) {
      const TensorEntry& te = ge.tensors[t];
      const TensorSpec& spec = tg.tensors[t];
      if (te.name != spec.name || te.shape != spec.shape || te.dtype != spec.dtype || te.offset != tg.layout.tensor_offset(static_cast<int64_t>(t))) return {};
    }
    const StateBuffer& b = tg.buffers[k];
    if (b.kind != ge.kinds[k] || b.dtype != DType::kF32 || b.data == nullptr || b.stored != StoredAs::kF32 || p.stored != StoredAs::kF32 ||
        b.count != p.count) {
      return {};
    }
    into.push_back(static_cast<char*>(b.data));
  }
  return into;
}

// The manifest and index received (`in`: the offered sizes), checked as a load checks them, and where
// the data's pieces go: straight into the target, else into a file in `tmp` of the size this rank's
// shard must be (PlanFile's layout of the target): a bad file on the holder cannot make this rank
// allocate what it likes.
Status PlanReceipt(Receipt& rc, const StateView& target, const LoadOptions& load, const int64_t in[3], int64_t step, const std::string& tmp,
                   const std::string& what) {
  ASSIGN_OR_RETURN(rc.m, DecodeManifest(rc.got[0], what + ": manifest"));
  if (rc.m.step != step) return DataLossError(what, ": its manifest is of step ", rc.m.step);
  ASSIGN_OR_RETURN(const std::vector<ShardLayout> layouts, SavedLayouts(rc.m), what);
  const int shard = rc.m.shards == 1 ? 0 : target.rank;
  ASSIGN_OR_RETURN(rc.index, DecodeIndex(rc.got[1], what + ": index"));
  RETURN_IF_ERROR(ValidateIndex(rc.m, layouts, rc.index, shard, what + ": index"));
  int64_t total = 0;
  ASSIGN_OR_RETURN(rc.plan, PlanFile(rc.m, &total), what);
  if (total != in[2] || rc.index.data_bytes != total) {
    return DataLossError(what, ": ", in[2], " bytes of data offered, its manifest lays out ", total, " and its index says ", rc.index.data_bytes);
  }
  rc.into = DirectTargets(rc.m, rc.plan, target, load);
  if (!rc.into.empty()) return target.Settle();  // a capture still reading the buffers ends before they change
  int64_t expected = 0;
  for (const StateGroup& g : target.groups) {
    for (const StateBuffer& b : g.buffers) expected = AlignUp(expected) + StoredBytes(b.stored, b.count, b.block);  // PlanFile's layout
  }
  if (expected != total) return DataLossError(what, ": ", total, " bytes of data, this rank's shard is ", expected);
  RETURN_IF_ERROR(RemoveTree(tmp));
  RETURN_IF_ERROR(MakeTierDir(tmp));
  ASSIGN_OR_RETURN(rc.file, Mapping::Map(tmp + "/" + DataFileName(shard), total, true));
  for (const Piece& p : rc.plan) rc.into.push_back(rc.file.data() + p.offset);
  return Status();
}

// Direct: every chunk of the index checked where it landed (raw f32 at its piece's place: anything
// else in the index is refused), and the outcome a load would give.
Result<LoadResult> CheckDirect(const Receipt& rc, const std::string& what) {
  std::vector<size_t> piece_of(rc.m.groups.size() + 1, 0);  // group g's kind k is piece piece_of[g] + k
  for (size_t g = 0; g < rc.m.groups.size(); ++g) piece_of[g + 1] = piece_of[g] + rc.m.groups[g].kinds.size();
  for (size_t k = 0; k < rc.index.chunks.size(); ++k) {
    const ChunkEntry& c = rc.index.chunks[k];
    const size_t i = piece_of[static_cast<size_t>(c.group)] + static_cast<size_t>(c.kind);
    const Piece& p = rc.plan[i];
    const char* at = rc.into[i] + c.elem_offset * 4;
    if (c.codec != Codec::kRaw || c.stored_bytes != c.elements * 4 || c.file_offset != p.offset + c.elem_offset * 4) {
      return DataLossError(what, ": chunk ", k, " is not where the replica's layout puts it");
    }
    if (Checksum(at, static_cast<size_t>(c.stored_bytes)) != c.xxh3) {
      return DataLossError(what, ": chunk ", k, " (group '", rc.m.groups[static_cast<size_t>(c.group)].name, "', ",
                           rc.m.groups[static_cast<size_t>(c.group)].kinds[static_cast<size_t>(c.kind)], ", elements ", c.elem_offset, "..",
                           c.elem_offset + c.elements, "): checksum mismatch (the data is corrupt)");
    }
  }
  LoadResult r;
  r.counters = {rc.m.step, rc.m.loss_scale, rc.m.scaler_good_steps, rc.m.scaler_hysteresis_left, rc.m.engine_state.dump()};
  r.trainer_state = rc.m.trainer_state;
  r.saved_world_size = rc.m.world_size;
  r.saved_stage = rc.m.stage;
  r.bytes_read = rc.index.data_bytes;
  return r;
}

// Not direct: the received files become this rank's own copy of the generation: durable files, then
// the rename.
Status PlaceReplica(Receipt& rc, const std::string& tmp, const std::string& own, int rank) {
  ASSIGN_OR_RETURN(std::unique_ptr<IoEngine> io, IoEngine::Create(IoOptions{}));
  RETURN_IF_ERROR(WriteFileDurably(*io, tmp, std::string(kManifestFile), rc.got[0], kPrivateFileMode));
  RETURN_IF_ERROR(WriteFileDurably(*io, tmp, IndexFileName(rank % rc.m.shards), rc.got[1], kPrivateFileMode));
  rc.file.Reset();
  RETURN_IF_ERROR(RemoveTree(own));
  return RenamePath(tmp, own);
}

}  // namespace

Result<std::vector<int64_t>> TierCandidates(Communicator* comm, const std::string& root, const MemoryTierOptions& o) {
  const TierPlace p = PlaceOf(root, o, comm->size(), comm->rank());
  constexpr int kMax = 8;
  std::vector<int64_t> mine(2 * kMax, -1);
  const std::vector<int64_t> own = Steps(p.own_dir), rep = p.replica_dir.empty() ? std::vector<int64_t>{} : Steps(p.replica_dir);
  for (size_t i = 0; i < own.size() && i < kMax; ++i) mine[i] = own[i];
  for (size_t i = 0; i < rep.size() && i < kMax; ++i) mine[kMax + i] = rep[i];
  std::vector<int64_t> all(static_cast<size_t>(p.n) * 2 * kMax);
  RETURN_IF_ERROR(comm->AllGather(mine.data(), all.data(), mine.size() * 8, DType::kBytes), "memory tier: listing");
  auto holds = [&](int rank, int part, int64_t step) {
    const int64_t* v = all.data() + static_cast<size_t>(rank) * 2 * kMax + static_cast<size_t>(part) * kMax;
    return std::find(v, v + kMax, step) != v + kMax;
  };
  std::set<int64_t, std::greater<>> steps;
  for (int64_t s : all) {
    if (s >= 0) steps.insert(s);
  }
  std::vector<int64_t> out;
  for (int64_t s : steps) {
    bool everyone = true;
    for (int q = 0; q < p.n && everyone; ++q) everyone = holds(q, 0, s) || (Replicated(p.n, o) && holds((q + p.d) % p.n, 1, s));
    if (everyone) out.push_back(s);
  }
  return out;
}

Result<LoadResult> LoadFromTier(Communicator* comm, const std::string& root, const MemoryTierOptions& o, int64_t step,
                                const StateView& target, const LoadOptions& load, std::string* dir, bool* from_peer) {
  const TierPlace p = PlaceOf(root, o, comm->size(), comm->rank());
  const std::string own = StepPath(p.own_dir, step);
  *dir = own;
  *from_peer = false;
  Result<LoadResult> res = Exists(own) ? Load(own, target, load) : Result<LoadResult>(NotFoundError("no copy in ", own));
  int64_t need = res.ok() ? 0 : 1;
  std::vector<int64_t> needs(static_cast<size_t>(p.n));
  RETURN_IF_ERROR(comm->AllGather(&need, needs.data(), 8, DType::kBytes), "memory tier: restoring step ", step);
  if (std::none_of(needs.begin(), needs.end(), [](int64_t x) { return x != 0; }) || !Replicated(p.n, o)) return res;
  // Some rank's own copy is gone or bad: its holder sends the replica.
  const int holder = (p.rank + p.d) % p.n;
  const std::string rep = StepPath(p.replica_dir, step);
  const std::string what = "memory tier: rank " + std::to_string(p.rank) + "'s replica of step " + std::to_string(step) + " from rank " +
                           std::to_string(holder);
  Offer offer = needs[static_cast<size_t>(p.source)] != 0 && Exists(rep) ? OfferReplica(rep, p.source, step) : Offer{};
  int64_t in[3] = {0, 0, 0};
  RETURN_IF_ERROR(comm->Shift(offer.sizes, sizeof(offer.sizes), in, sizeof(in), -p.d), "memory tier: restoring step ", step);
  Receipt rc;
  rc.receiving = need != 0 && in[2] > 0 && in[0] > 0 && in[0] <= kMaxJsonBytes && in[1] > 0 && in[1] <= kMaxJsonBytes;
  // A rank that cannot take its replica says why before anything (more) moves, and every rank drops
  // this candidate with that reason.
  const std::string why = std::string(res.status().message());
  auto unusable = [&](const std::string& detail) {
    return DataLossError("memory tier: rank ", p.rank, "'s copy of step ", step, " is unusable (", why, ") and its replica on rank ", holder, detail);
  };
  RETURN_IF_ERROR(AgreeOnStatus(comm, need != 0 && !rc.receiving ? unusable(in[2] > 0 ? " is offered with sizes out of bounds" : " is not there")
                                                                 : Status()));
  for (int i = 0; i < 2; ++i) {
    if (rc.receiving) rc.got[i].resize(static_cast<size_t>(in[i]));
    RETURN_IF_ERROR(comm->Shift(offer.files[i].data(), static_cast<size_t>(offer.sizes[i]), rc.receiving ? rc.got[i].data() : nullptr,
                                rc.receiving ? rc.got[i].size() : 0, -p.d),
                    "memory tier: restoring step ", step);
  }
  const std::string tmp = own + ".tmp";
  if (rc.receiving) rc.prepared = PlanReceipt(rc, target, load, in, step, tmp, what);
  RETURN_IF_ERROR(AgreeOnStatus(comm, rc.receiving && !rc.prepared.ok() ? unusable(" could not be received: " + std::string(rc.prepared.message()))
                                                                      : Status()));
  // One shift per piece (as many on every rank: the most any rank sends or takes).
  const bool take = rc.take();
  float pieces = static_cast<float>(std::max(offer.plan.size(), take ? rc.plan.size() : size_t{0}));  // exact: a few per group
  RETURN_IF_ERROR(comm->AllReduce(&pieces, &pieces, 1, DType::kF32, ReduceOp::kMax), "memory tier: restoring step ", step);
  for (size_t i = 0; i < static_cast<size_t>(pieces); ++i) {
    const bool sends = i < offer.plan.size(), takes = take && i < rc.plan.size();
    const Piece* out = sends ? &offer.plan[i] : nullptr;
    RETURN_IF_ERROR(comm->Shift(sends ? offer.data.data() + out->offset : nullptr, sends ? static_cast<size_t>(out->Bytes(out->count)) : 0,
                                takes ? rc.into[i] : nullptr, takes ? static_cast<size_t>(rc.plan[i].Bytes(rc.plan[i].count)) : 0, -p.d),
                    "memory tier: restoring step ", step);
  }
  if (need == 0) return res;
  ZRT_LOG(kInfo) << "memory tier: rank " << p.rank << "'s copy of step " << step << " unusable (" << why
                 << "); restoring from its replica on rank " << holder << (rc.direct() ? "" : " (kept as its own copy again)");
  *from_peer = true;
  if (rc.direct()) {
    *dir = StepPath(PlaceOf(root, o, p.n, holder).replica_dir, step);  // on the holder
    return CheckDirect(rc, what);
  }
  RETURN_IF_ERROR(PlaceReplica(rc, tmp, own, p.rank), "memory tier: rank ", p.rank, " placing its replica of step ", step);
  auto again = Load(own, target, load);
  if (!again.ok()) return again.status().WithContext(what);
  return again;
}

}  // namespace zrt::ckpt
