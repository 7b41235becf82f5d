// The memory tier's side of a resume (memory_tier.h TierCandidates, LoadFromTier):
//   candidates   every rank lists the generations it holds (own copy with its shards, and the replica
//                it keeps for its source); the steps every rank can restore, one way or the other
//                (with live replicas: from another rank's copy of its shard), are agreed.
//   restore      every rank loads its own copy (a mapped tmpfs file: chunk_source.h); the ranks agree
//                who needs a copy and who serves it: the holder of its replica, or with live replicas
//                the first rank holding the same shard whose own copy loaded (one round of shifts per
//                distance). Each server offers the replica it keeps, or its own copy (manifest, index,
//                the data file mapped) to its source; one vectored shift moves the manifest and the
//                index, checked by the receiver (bounded sizes, the format's rules, the step); then one
//                vectored shift moves the data file's pieces (a (group, kind) of PlanFile's layout):
//                  direct   where every target buffer is host memory laid out as its piece (the
//                           same engine restarted: the usual case), f32 values or a compact form
//                           kept as it is stored (StateView::StoredMemory: bf16 values, q8 codes and
//                           their scales, which a q8 chunk's two spans reach apart), each piece
//                           lands in its buffer and each chunk is checked there against the index
//                           (and a compact form as a load checks it): the restore costs the transfer
//                           and one hash pass, and allocates nothing;
//                  file     else (device or NVMe state, a load that is not strict) into a file of the
//                           size the target's shard must be (checked before it is allocated), placed
//                           as the rank's own copy again and loaded, checked like any.
//                A rank that cannot take what its holder offers says why (agreed) before the data
//                moves, and every rank drops the candidate with that reason.
#include <algorithm>
#include <set>

#include "zrt/checkpoint/codec.h"
#include "zrt/checkpoint/files.h"
#include "zrt/checkpoint/fs_util.h"
#include "zrt/checkpoint/load_plan.h"
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
  int64_t chunk = 0;  // the manifest's chunk_elements
  int64_t sizes[3] = {0, 0, 0};
};
Offer OfferReplica(const std::string& rep, int source, int64_t step) {
  Offer o;
  Status s = [&]() -> Status {
    ASSIGN_OR_RETURN(CheckpointDir cd, CheckpointDir::Open(rep));
    ASSIGN_OR_RETURN(o.files[0], cd.ReadFile(kManifestFile));
    ASSIGN_OR_RETURN(Manifest m, DecodeManifest(o.files[0], cd.PathOf(kManifestFile)));
    o.chunk = m.chunk_elements;
    const int shard = source % m.shards;  // core/state_view.h's numbering
    ASSIGN_OR_RETURN(o.files[1], cd.ReadFile(IndexFileName(shard)));
    int64_t total = 0;
    ASSIGN_OR_RETURN(o.plan, PlanFile(m, shard, &total));
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

// The spans a piece of the data file moves in, the same on both sides of the shift: its bytes whole,
// or for q8 and q4 each chunk's codes and then its blocks' scales (PlanFile's layout), so that a receiver
// can place the two apart.
struct Span {
  int64_t at, bytes;  // within the piece's bytes in the file
  int64_t element;    // the chunk's first element
  bool scales;        // q8, q4: the chunk's scales (else its codes, or the values)
};
std::vector<Span> Spans(const Piece& p, int64_t chunk) {
  if (!p.blockwise()) return {Span{0, p.Bytes(p.count), 0, false}};
  std::vector<Span> out;
  for (int64_t c0 = 0; c0 < p.count; c0 += chunk) {
    const int64_t cn = std::min(chunk, p.count - c0), at = p.Bytes(c0), codes = p.format.ValuesBytes(cn);
    out.push_back({at, codes, c0, false});
    out.push_back({at + codes, p.Bytes(cn) - codes, c0, true});
  }
  return out;
}

// Where a piece lands: its buffer's values (f32, bf16, q8 or q4 codes) and, kept apart, the blocks'
// scales (direct); or its place in the received file (`scales` null: the piece's bytes as laid out).
struct Target {
  char* values = nullptr;
  char* scales = nullptr;
  char* Of(const Piece& p, const Span& s) const {
    if (scales == nullptr) return values + s.at;
    return s.scales ? scales + 4 * (s.element / p.format.block) : values + p.format.ValuesBytes(s.element);
  }
};

// What a rank receives from its holder: the manifest and index (taken when their sizes are within the
// format's bounds), then, once they are checked, where each piece of the data goes.
struct Receipt {
  std::string got[2];
  bool receiving = false;  // the manifest and index are taken
  Manifest m;
  RankIndex index;
  std::vector<Piece> plan;
  std::vector<Target> into;  // per piece: its target buffer (direct) or its place in `file`
  Mapping file;              // not direct: the data file in the temp directory
  Status prepared = InternalError("memory tier: nothing offered");
  bool direct() const { return prepared.ok() && !file.data(); }
  bool take() const { return receiving && prepared.ok(); }
};

// The target's group holding each manifest group's tensors (found by its first tensor's name: names
// are unique in a save; a group over a mesh of its own is "<name>@<k>" there), -1 for none.
std::vector<int> TargetGroups(const Manifest& m, const StateView& target) {
  std::vector<int> out(m.groups.size(), -1);
  for (size_t g = 0; g < m.groups.size(); ++g) {
    if (m.groups[g].tensors.empty()) continue;
    for (size_t t = 0; t < target.groups.size(); ++t) {
      const auto& tt = target.groups[t].tensors;
      if (!tt.empty() && tt.front().name == m.groups[g].tensors.front().name) out[g] = static_cast<int>(t);
    }
  }
  return out;
}

// Where piece p lands in buffer b of the target's group tg: host f32 memory, or the compact form p
// stores kept so in host memory; null values when it cannot land there.
Target DirectTarget(const Piece& p, int tg, const StateBuffer& b, const StateView& target) {
  if (!p.format.compact()) return Target{b.dtype == DType::kF32 && !b.format.compact() ? static_cast<char*>(b.data) : nullptr};
  if (b.format != p.format) return Target{};
  auto kept = target.StoredMemory(tg, p.kind);
  if (!kept.ok() || !kept->has_value()) return Target{};
  const StoredPart& sp = **kept;
  if (sp.format != p.format || (p.blockwise() && sp.scales == nullptr)) return Target{};
  return Target{static_cast<char*>(sp.values), p.blockwise() ? reinterpret_cast<char*>(sp.scales) : nullptr};
}

// Each piece's target when every one is host memory laid out as the replica's (the file's groups
// are the target's, each with the same tensors, offsets, shard size and kinds, in order, each kept as
// the replica stores it), else empty.
std::vector<Target> DirectTargets(const Manifest& m, const std::vector<Piece>& plan, const StateView& target, const LoadOptions& load) {
  auto layouts = SavedLayouts(m);
  if (!load.strict || load.params_only || !layouts.ok()) return {};
  const std::vector<int> to = TargetGroups(m, target);
  std::set<int> covered;
  for (const Piece& p : plan) covered.insert(to[static_cast<size_t>(p.group)]);
  if (covered.contains(-1) || covered.size() != target.groups.size()) return {};
  std::vector<Target> into;
  for (const Piece& p : plan) {
    const GroupEntry& ge = m.groups[static_cast<size_t>(p.group)];
    const int tgi = to[static_cast<size_t>(p.group)];
    const StateGroup& tg = target.groups[static_cast<size_t>(tgi)];
    const auto k = static_cast<size_t>(p.kind);
    if (ge.tensors.size() != tg.tensors.size() || k >= tg.buffers.size() || ge.kinds.size() != tg.buffers.size()) return {};
    const ShardLayout& l = (*layouts)[static_cast<size_t>(p.group)];
    if (l.shard_size() != tg.layout.shard_size() || l.world_size() != tg.layout.world_size()) return {};
    for (size_t t = 0; t < tg.tensors.size(); ++t) {
      const TensorEntry& te = ge.tensors[t];
      const TensorSpec& spec = tg.tensors[t];
      if (te.name != spec.name || te.shape != spec.shape || te.dtype != spec.dtype || te.offset != tg.layout.tensor_offset(static_cast<int64_t>(t))) return {};
    }
    const StateBuffer& b = tg.buffers[k];
    if (b.kind != ge.kinds[k] || b.count != p.count || (p.count > 0 && p.blockwise() && m.chunk_elements % p.format.block != 0)) return {};
    const Target t = DirectTarget(p, tgi, b, target);
    if (t.values == nullptr && p.count > 0) return {};
    into.push_back(t);
  }
  return into;
}

// This rank's copy in `dir`, loaded. With groups over meshes of their own the copy's manifest holds
// every rank's tensors, which LoadFromTier judged over the world first (JudgedOverTheWorld).
Result<LoadResult> LoadCopy(const std::string& dir, const StateView& target, const LoadOptions& load) {
  ASSIGN_OR_RETURN(std::unique_ptr<PreparedLoad> p, PreparedLoad::Prepare(dir, target, load, nullptr, target.has_own_groups()));
  return p->Fill();
}

// Collective, for a target with groups over meshes of their own and a strict load: the generation's
// tensors (its manifest, as every rank's copy has it) that no rank's model has are refused, on every
// rank (a rank without a readable copy leaves the verdict to the others: the manifests are the same).
Status JudgedOverTheWorld(Communicator* comm, const std::string& own, const StateView& target) {
  ASSIGN_OR_RETURN(const std::set<std::string> world, WorldTensorNames(comm, target));
  Status local;
  if (auto m = ReadManifest(own); m.ok()) {
    for (const GroupEntry& ge : m->groups) {
      for (const TensorEntry& te : ge.tensors) {
        if (local.ok() && !world.contains(te.name)) {
          local = InvalidArgumentError("memory tier: ", own, " has tensor '", te.name, "', which no rank's model has (LoadOptions::strict = false ignores it)");
        }
      }
    }
  }
  return AgreeOnStatus(comm, local);
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
  ASSIGN_OR_RETURN(rc.plan, PlanFile(rc.m, shard, &total), what);
  if (total != in[2] || rc.index.data_bytes != total) {
    return DataLossError(what, ": ", in[2], " bytes of data offered, its manifest lays out ", total, " and its index says ", rc.index.data_bytes);
  }
  rc.into = DirectTargets(rc.m, rc.plan, target, load);
  if (!rc.into.empty()) return target.Settle();  // a capture still reading the buffers ends before they change
  // PlanFile's layout of the target's buffers, in the file's order of its groups.
  const std::vector<int> to = TargetGroups(rc.m, target);
  std::set<int> covered;
  int64_t expected = 0;
  for (const Piece& p : rc.plan) {
    const int tg = to[static_cast<size_t>(p.group)];
    const auto k = static_cast<size_t>(p.kind);
    if (tg < 0 || k >= target.groups[static_cast<size_t>(tg)].buffers.size()) {
      return DataLossError(what, ": group '", rc.m.groups[static_cast<size_t>(p.group)].name, "' (", rc.m.groups[static_cast<size_t>(p.group)].kinds[k],
                           ") is none of this rank's");
    }
    covered.insert(tg);
    const StateBuffer& b = target.groups[static_cast<size_t>(tg)].buffers[k];
    expected = AlignUp(expected) + b.format.Bytes(b.count);
  }
  if (covered.size() != target.groups.size()) return DataLossError(what, ": it holds ", covered.size(), " of this rank's ", target.groups.size(), " groups");
  if (expected != total) return DataLossError(what, ": ", total, " bytes of data, this rank's shard is ", expected);
  RETURN_IF_ERROR(RemoveTree(tmp));
  RETURN_IF_ERROR(MakeTierDir(tmp));
  ASSIGN_OR_RETURN(rc.file, Mapping::Map(tmp + "/" + DataFileName(shard), total, true));
  for (const Piece& p : rc.plan) rc.into.push_back(Target{rc.file.data() + p.offset});
  return Status();
}

// Direct: every chunk of the index checked where it landed (raw, at its piece's place: anything else
// in the index is refused; a compact form also as a load checks it), and the outcome a load would give.
Result<LoadResult> CheckDirect(const Receipt& rc, const std::string& what) {
  std::vector<size_t> piece_of(rc.m.groups.size(), rc.plan.size());  // group g's kind k is piece piece_of[g] + k (the file's groups)
  for (size_t i = rc.plan.size(); i-- > 0;) piece_of[static_cast<size_t>(rc.plan[i].group)] = i;
  for (size_t k = 0; k < rc.index.chunks.size(); ++k) {
    const ChunkEntry& c = rc.index.chunks[k];
    const size_t i = piece_of[static_cast<size_t>(c.group)] + static_cast<size_t>(c.kind);
    if (i >= rc.plan.size() || rc.plan[i].group != c.group || rc.plan[i].kind != c.kind) {
      return DataLossError(what, ": chunk ", k, " is of a group the replica's file does not hold");
    }
    const Piece& p = rc.plan[i];
    const bool q8 = p.blockwise();  // codes, then scales
    if (c.codec != Codec::kRaw || c.stored_bytes != p.Bytes(c.elements) || c.file_offset != p.offset + p.Bytes(c.elem_offset) ||
        (q8 && c.elem_offset % p.format.block != 0)) {
      return DataLossError(what, ": chunk ", k, " is not where the replica's layout puts it");
    }
    const Target& t = rc.into[i];
    const int64_t codes = p.format.ValuesBytes(c.elements);
    const Span values{p.Bytes(c.elem_offset), q8 ? codes : c.stored_bytes, c.elem_offset, false};
    const char* at = t.Of(p, values);
    const char* scales = q8 ? t.Of(p, Span{values.at + codes, c.stored_bytes - codes, c.elem_offset, true}) : nullptr;
    const uint64_t sum = q8 ? Checksum(at, static_cast<size_t>(codes), scales, static_cast<size_t>(c.stored_bytes - codes))
                            : Checksum(at, static_cast<size_t>(c.stored_bytes));
    const GroupEntry& ge = rc.m.groups[static_cast<size_t>(c.group)];
    const std::string chunk = "chunk " + std::to_string(k) + " (group '" + ge.name + "', " + ge.kinds[static_cast<size_t>(c.kind)] + ", elements " +
                              std::to_string(c.elem_offset) + ".." + std::to_string(c.elem_offset + c.elements) + ")";
    if (sum != c.xxh3) return DataLossError(what, ": ", chunk, ": checksum mismatch (the data is corrupt)");
    RETURN_IF_ERROR(p.format.Check(at, reinterpret_cast<const float*>(scales), c.elements), what, ": ", chunk);
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

// The shards of the generation in `dir` (its manifest's), 0 when it cannot be read.
int64_t ShardsOf(const std::string& dir) {
  auto m = ReadManifest(dir);
  return m.ok() ? m->shards : 0;
}

// One round of a restore's transfers, every rank taking part: a rank that `sends` offers the generation
// in `offer_dir` (its replica of rank r - distance, or, with live replicas, its own copy of the same
// shard) to rank r - distance; a rank that `receives` takes what rank r + distance offers (`why`: what
// was wrong with its own copy) and gets its outcome in *res, *dir (where the data came from).
Status Round(Communicator* comm, const TierPlace& p, int64_t step, int distance, const std::string& offer_dir, const std::string& holder_dir,
             bool sends, bool receives, const StateView& target, const LoadOptions& load, const std::string& why, Result<LoadResult>* res,
             std::string* dir) {
  const int source = ((p.rank - distance) % p.n + p.n) % p.n, holder = (p.rank + distance) % p.n;
  const std::string own = StepPath(p.own_dir, step);
  const std::string what = "memory tier: rank " + std::to_string(p.rank) + "'s replica of step " + std::to_string(step) + " from rank " +
                           std::to_string(holder);
  Offer offer = sends && Exists(offer_dir) ? OfferReplica(offer_dir, source, step) : Offer{};
  int64_t in[3] = {0, 0, 0};
  RETURN_IF_ERROR(comm->Shift(offer.sizes, sizeof(offer.sizes), in, sizeof(in), -distance), "memory tier: restoring step ", step);
  Receipt rc;
  rc.receiving = receives && in[2] > 0 && in[0] > 0 && in[0] <= kMaxJsonBytes && in[1] > 0 && in[1] <= kMaxJsonBytes;
  // A rank that cannot take its replica says why before anything (more) moves, and every rank drops
  // this candidate with that reason.
  auto unusable = [&](const std::string& detail) {
    return DataLossError("memory tier: rank ", p.rank, "'s copy of step ", step, " is unusable (", why, ") and its replica on rank ", holder, detail);
  };
  RETURN_IF_ERROR(AgreeOnStatus(comm, receives && !rc.receiving ? unusable(in[2] > 0 ? " is offered with sizes out of bounds" : " is not there")
                                                                : Status()));
  std::vector<Communicator::ShiftSend> send;
  std::vector<Communicator::ShiftRecv> recv;
  for (int i = 0; i < 2; ++i) {
    if (offer.sizes[2] > 0) send.push_back({offer.files[i].data(), offer.files[i].size()});
    if (!rc.receiving) continue;
    rc.got[i].resize(static_cast<size_t>(in[i]));
    recv.push_back({rc.got[i].data(), rc.got[i].size()});
  }
  RETURN_IF_ERROR(comm->ShiftV(send, recv, -distance), "memory tier: restoring step ", step);
  const std::string tmp = own + ".tmp";
  if (rc.receiving) rc.prepared = PlanReceipt(rc, target, load, in, step, tmp, what);
  RETURN_IF_ERROR(AgreeOnStatus(comm, rc.receiving && !rc.prepared.ok() ? unusable(" could not be received: " + std::string(rc.prepared.message()))
                                                                      : Status()));
  // The data: every piece in one vectored shift (one size check for all of them).
  send.clear();
  recv.clear();
  for (const Piece& piece : offer.plan) {
    for (const Span& sp : Spans(piece, offer.chunk)) send.push_back({offer.data.data() + piece.offset + sp.at, static_cast<size_t>(sp.bytes)});
  }
  for (size_t i = 0; rc.take() && i < rc.plan.size(); ++i) {
    for (const Span& sp : Spans(rc.plan[i], rc.m.chunk_elements)) recv.push_back({rc.into[i].Of(rc.plan[i], sp), static_cast<size_t>(sp.bytes)});
  }
  RETURN_IF_ERROR(comm->ShiftV(send, recv, -distance), "memory tier: restoring step ", step);
  if (!receives) return Status();
  ZRT_LOG(kInfo) << "memory tier: rank " << p.rank << "'s copy of step " << step << " unusable (" << why
                 << "); restoring from rank " << holder << (rc.direct() ? "" : " (kept as its own copy again)");
  if (rc.direct()) {
    *dir = holder_dir;
    *res = CheckDirect(rc, what);
    return Status();
  }
  Status placed = PlaceReplica(rc, tmp, own, p.rank);
  if (!placed.ok()) {
    *res = placed.WithContext("memory tier: rank " + std::to_string(p.rank) + " placing its replica of step " + std::to_string(step));
    return Status();
  }
  auto again = LoadCopy(own, target, load);
  *res = again.ok() ? std::move(again) : Result<LoadResult>(again.status().WithContext(what));
  return Status();
}

}  // namespace

// Per rank: its own generations (newest first, at most kMax), their shards, and the replica's it keeps.
// A step is a candidate when every rank q can restore it: from its own copy, from the replica its
// holder keeps, or (live replicas) from the own copy of a rank holding the same shard.
Result<std::vector<int64_t>> TierCandidates(Communicator* comm, const std::string& root, const MemoryTierOptions& o) {
  const TierPlace p = PlaceOf(root, o, comm->size(), comm->rank());
  constexpr int kMax = 8;
  std::vector<int64_t> mine(3 * kMax, -1);
  const std::vector<int64_t> own = Steps(p.own_dir), rep = p.replica_dir.empty() ? std::vector<int64_t>{} : Steps(p.replica_dir);
  for (size_t i = 0; i < own.size() && i < kMax; ++i) {
    mine[i] = own[i];
    mine[kMax + i] = ShardsOf(StepPath(p.own_dir, own[i]));
  }
  for (size_t i = 0; i < rep.size() && i < kMax; ++i) mine[2 * kMax + i] = rep[i];
  std::vector<int64_t> all(static_cast<size_t>(p.n) * 3 * kMax);
  RETURN_IF_ERROR(comm->AllGather(mine.data(), all.data(), mine.size() * 8, DType::kBytes), "memory tier: listing");
  auto row = [&](int rank) { return all.data() + static_cast<size_t>(rank) * 3 * kMax; };
  auto own_index = [&](int rank, int64_t step) {  // where rank lists `step` among its own, or -1
    const int64_t* v = row(rank);
    const int64_t* at = std::find(v, v + kMax, step);
    return at == v + kMax ? -1 : static_cast<int>(at - v);
  };
  auto holds_replica = [&](int rank, int64_t step) {
    const int64_t* v = row(rank) + 2 * kMax;
    return std::find(v, v + kMax, step) != v + kMax;
  };
  std::set<int64_t, std::greater<>> steps;
  for (int r = 0; r < p.n; ++r) {
    for (int i = 0; i < kMax; ++i) {
      if (row(r)[i] >= 0) steps.insert(row(r)[i]);
      if (row(r)[2 * kMax + i] >= 0) steps.insert(row(r)[2 * kMax + i]);
    }
  }
  std::vector<int64_t> out;
  for (int64_t s : steps) {
    // The shards its own copies record, when they all agree and give live replicas (else 0).
    int64_t shards = 0;
    for (int r = 0; r < p.n && shards >= 0; ++r) {
      const int i = own_index(r, s);
      if (i < 0) continue;
      const int64_t sh = row(r)[kMax + i];
      shards = shards == 0 || shards == sh ? sh : -1;
    }
    const bool live = shards > 0 && shards <= p.n && LiveReplicas(p.n, static_cast<int>(shards));
    bool everyone = true;
    for (int q = 0; q < p.n && everyone; ++q) {
      everyone = own_index(q, s) >= 0 || (Replicated(p.n, o) && holds_replica((q + p.d) % p.n, s));
      for (int k = 1; live && !everyone && k < p.n / shards; ++k) everyone = own_index(static_cast<int>((q + k * shards) % p.n), s) >= 0;
    }
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
  if (target.has_own_groups() && load.strict) RETURN_IF_ERROR(JudgedOverTheWorld(comm, own, target), "memory tier: restoring step ", step);
  Result<LoadResult> res = Exists(own) ? LoadCopy(own, target, load) : Result<LoadResult>(NotFoundError("no copy in ", own));
  // Per rank: whether it needs its copy from another, and the shards its own copy records.
  int64_t mine[2] = {res.ok() ? 0 : 1, res.ok() ? ShardsOf(own) : 0};
  std::vector<int64_t> all(static_cast<size_t>(p.n) * 2);
  RETURN_IF_ERROR(comm->AllGather(mine, all.data(), sizeof(mine), DType::kBytes), "memory tier: restoring step ", step);
  auto needs = [&](int r) { return all[2 * static_cast<size_t>(r)] != 0; };
  bool anyone = false;
  int64_t shards = 0;  // what every usable copy records (-1: they disagree)
  for (int r = 0; r < p.n; ++r) {
    anyone = anyone || needs(r);
    const int64_t sh = all[2 * static_cast<size_t>(r) + 1];
    if (!needs(r)) shards = shards == 0 || shards == sh ? sh : -1;
  }
  if (!anyone) return res;
  // Who serves whom, the same on every rank: with live replicas, a rank from the first rank holding
  // its shard whose own copy is usable (q + k shards); else from the holder of its replica (q + d).
  const bool live = shards > 0 && shards <= p.n && LiveReplicas(p.n, static_cast<int>(shards));
  if (!live && !Replicated(p.n, o)) return res;
  std::vector<int> from(static_cast<size_t>(p.n), 0);  // the server's distance (0: none)
  for (int q = 0; q < p.n; ++q) {
    if (!needs(q)) continue;
    if (!live) {
      from[static_cast<size_t>(q)] = p.d;
      continue;
    }
    for (int k = 1; k < p.n / shards && from[static_cast<size_t>(q)] == 0; ++k) {
      if (!needs(static_cast<int>((q + k * shards) % p.n))) from[static_cast<size_t>(q)] = static_cast<int>(k * shards);
    }
    if (from[static_cast<size_t>(q)] == 0) {  // every rank holding its shard lost it too: agreed, nothing moves
      return DataLossError("memory tier: step ", step, ": rank ", q, "'s copy is unusable and so is every other copy of its shard");
    }
  }
  std::set<int> distances(from.begin(), from.end());
  distances.erase(0);
  const std::string why = std::string(res.status().message());
  for (int distance : distances) {
    const int source = ((p.rank - distance) % p.n + p.n) % p.n, holder = (p.rank + distance) % p.n;
    const bool sends = from[static_cast<size_t>(source)] == distance, receives = from[static_cast<size_t>(p.rank)] == distance;
    const TierPlace hp = PlaceOf(root, o, p.n, holder);
    const std::string offer_dir = live ? own : StepPath(p.replica_dir, step);
    const std::string holder_dir = StepPath(live ? hp.own_dir : hp.replica_dir, step);
    RETURN_IF_ERROR(Round(comm, p, step, distance, offer_dir, holder_dir, sends, receives, target, load, why, &res, dir));
    if (receives) *from_peer = true;
  }
  return res;
}

}  // namespace zrt::ckpt
