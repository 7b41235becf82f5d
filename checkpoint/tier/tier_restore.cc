// The memory tier's side of a resume (memory_tier.h TierCandidates, LoadFromTier):
//   candidates   every rank lists the generations it holds (own copy, and the replica it keeps for
//                its source); the steps every rank can restore, one way or the other, are agreed.
//   restore      every rank loads its own copy; the ranks agree who needs its replica; each holder
//                offers the replica it keeps (manifest, index, the data file mapped) to its source;
//                a rank takes only what its own shard's file must be (sizes checked before anything
//                is allocated); three shifts move the files; the receiver places them as its own copy
//                again (temp directory, durable files, rename) and loads it, checked like any.
#include <algorithm>
#include <set>

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
// data file mapped, with their sizes; all zero when it cannot (said in the log).
struct Offer {
  std::string files[2];
  Mapping data;
  int64_t sizes[3] = {0, 0, 0};
};
Offer OfferReplica(const std::string& rep, int source, int64_t step) {
  Offer o;
  Status s = [&]() -> Status {
    ASSIGN_OR_RETURN(CheckpointDir cd, CheckpointDir::Open(rep));
    ASSIGN_OR_RETURN(o.files[0], cd.ReadFile(kManifestFile));
    ASSIGN_OR_RETURN(Manifest m, DecodeManifest(o.files[0], cd.PathOf(kManifestFile)));
    const int shard = m.shards == 1 ? 0 : source;
    ASSIGN_OR_RETURN(o.files[1], cd.ReadFile(IndexFileName(shard)));
    ASSIGN_OR_RETURN(o.data, Mapping::Map(cd.PathOf(DataFileName(shard)), -1, false));
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

// Where a replica is received: the files' buffers and the data file's mapping in `tmp`, taken only
// when the offered sizes are what this rank's shard must be (PlanFile's layout): a bad file on the
// holder cannot make this rank allocate what it likes.
struct Receipt {
  std::string got[2];
  Mapping into;
  bool receiving = false;  // the offer fits
  Status prepared;
  bool take() const { return receiving && prepared.ok(); }
};
Receipt PrepareReceipt(const StateView& target, const int64_t in[3], const std::string& tmp, int rank) {
  int64_t expected = 0;
  for (const StateGroup& g : target.groups) {
    for (const StateBuffer& b : g.buffers) expected = AlignUp(expected) + StoredBytes(b.stored, b.count, b.block);  // PlanFile's layout
  }
  Receipt rc;
  rc.receiving = in[2] == expected && expected > 0 && in[0] > 0 && in[0] <= kMaxJsonBytes && in[1] > 0 && in[1] <= kMaxJsonBytes;
  if (!rc.receiving) return rc;
  rc.got[0].resize(static_cast<size_t>(in[0]));
  rc.got[1].resize(static_cast<size_t>(in[1]));
  rc.prepared = [&]() -> Status {
    RETURN_IF_ERROR(RemoveTree(tmp));
    RETURN_IF_ERROR(MakeTierDir(tmp));
    const int shard = target.groups.empty() || target.groups[0].layout.world_size() == 1 ? 0 : rank;
    ASSIGN_OR_RETURN(rc.into, Mapping::Map(tmp + "/" + DataFileName(shard), in[2], true));
    return Status();
  }();
  return rc;
}

// The received files become this rank's own copy of the generation: durable files, then the rename.
Status PlaceReplica(Receipt& rc, const std::string& tmp, const std::string& own, int rank) {
  ASSIGN_OR_RETURN(std::unique_ptr<IoEngine> io, IoEngine::Create(IoOptions{}));
  RETURN_IF_ERROR(WriteFileDurably(*io, tmp, std::string(kManifestFile), rc.got[0], kPrivateFileMode));
  ASSIGN_OR_RETURN(Manifest m, DecodeManifest(rc.got[0], tmp + "/" + std::string(kManifestFile)));
  RETURN_IF_ERROR(WriteFileDurably(*io, tmp, IndexFileName(m.shards == 1 ? 0 : rank), rc.got[1], kPrivateFileMode));
  rc.into.Reset();
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
  Offer offer = needs[static_cast<size_t>(p.source)] != 0 && Exists(rep) ? OfferReplica(rep, p.source, step) : Offer{};
  int64_t in[3] = {0, 0, 0};
  RETURN_IF_ERROR(comm->Shift(offer.sizes, sizeof(offer.sizes), in, sizeof(in), -p.d), "memory tier: restoring step ", step);
  const std::string tmp = own + ".tmp";
  Receipt rc = need != 0 ? PrepareReceipt(target, in, tmp, p.rank) : Receipt{};
  // Three shifts toward the rank each holder serves. A rank that cannot take what its holder offers
  // posts nothing: the sizes disagree, the shift fails on every rank and so does this candidate.
  const bool take = rc.take();
  for (int i = 0; i < 2; ++i) {
    RETURN_IF_ERROR(comm->Shift(offer.files[i].data(), static_cast<size_t>(offer.sizes[i]), take ? rc.got[i].data() : nullptr,
                                take ? rc.got[i].size() : 0, -p.d),
                    "memory tier: restoring step ", step);
  }
  RETURN_IF_ERROR(comm->Shift(offer.data.data(), static_cast<size_t>(offer.sizes[2]), take ? rc.into.data() : nullptr, take ? rc.into.size() : 0, -p.d),
                  "memory tier: restoring step ", step);
  if (need == 0) return res;
  const std::string why = std::string(res.status().message());
  if (!take) {
    return DataLossError("memory tier: rank ", p.rank, "'s copy of step ", step, " is unusable (", why, ") and its replica on rank ", holder,
                         rc.receiving ? " could not be received: " + std::string(rc.prepared.message()) : std::string(" is not there"));
  }
  RETURN_IF_ERROR(PlaceReplica(rc, tmp, own, p.rank), "memory tier: rank ", p.rank, " placing its replica of step ", step);
  ZRT_LOG(kInfo) << "memory tier: rank " << p.rank << "'s copy of step " << step << " unusable (" << why
                 << "); restoring from its replica on rank " << holder;
  *from_peer = true;
  auto again = Load(own, target, load);
  if (!again.ok()) return again.status().WithContext("memory tier: the replica of rank " + std::to_string(p.rank) + " from rank " + std::to_string(holder));
  return again;
}

}  // namespace zrt::ckpt
