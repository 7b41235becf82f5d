// The memory tier (memory_tier.h): its generations. One generation's protocol:
//   Save (collective)   snapshot.h StartSnapshot (the agreed skip, nonce and manifest); the budget
//                       checked at the first; the view's capture handed a TierSink (tier_file.h), which
//                       copies the state into own/step-N.tmp/rank-S.data (a mapping of a tmpfs file,
//                       pages recycled) chunk by chunk, checksumming each chunk while it is in cache,
//                       on the owner's capture thread (NVMe state: as the owner's next step streams it).
//                       Once the copy is whole, its checksums go to its replica's holder (a small
//                       shift), then the data (from that mapping straight into the holder's mapped
//                       replica-q/step-N.tmp/rank-Sq.data):
//                         with `wire` (MPI_THREAD_MULTIPLE): on a thread of the tier's, over a
//                         communicator of its own, then both seals there; training never waits for it;
//                         else: posted on the Checkpointer's communicator at the first Poll that finds
//                         every rank's copy whole (or at Save, when every copy was whole at once).
//   seals               own: index (from the checksums), manifest, rename to step-N. Replica (once
//                       the transfer completed): the same on its holder, indexed with the sender's
//                       checksums (never re-hashed there).
//   Poll/Wait           one all-reduce: whole on every rank? Then AgreeOnStatus and every generation
//                       but N is removed (older ones, and newer ones a resume from an older state left).
// The files are an ordinary checkpoint directory holding one rank's files, so Load reads and checks
// them like any checkpoint; how one is laid out, mapped, filled and sealed is tier_file.h; the
// directories and their housekeeping are tier_dir.h; the restore side is tier_restore.cc.
#include "zrt/checkpoint/tier/memory_tier.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <thread>

#include "zrt/checkpoint/commit.h"
#include "zrt/checkpoint/format.h"
#include "zrt/checkpoint/fs_util.h"
#include "zrt/checkpoint/snapshot.h"
#include "zrt/checkpoint/tier/tier_dir.h"
#include "zrt/checkpoint/tier/tier_file.h"
#include "zrt/core/thread_pool.h"
#include "zrt/core/base.h"
#include "zrt/core/logging.h"
#include "zrt/offload/io_engine.h"

namespace zrt::ckpt {

using internal::AlignUp;
using internal::TierSink;
using internal::Mapping;
using internal::Piece;

using namespace internal;  // the tier's directories (tier_dir.h) and file (tier_file.h)

namespace {

// Waits for a transfer on the tier's own thread without spinning. MPI's waits poll a core for as long
// as the other side is not there yet, and the core is the training thread's: on CPU ranks that use
// every core (2 ranks on 2 cores), a snapshot every step cost 2.4x the tier's own work that way.
// Each Test progresses the transfer, and so do the training thread's MPI calls meanwhile.
Status WaitGently(CommHandle& h) {
  for (int us = 20;; us = std::min(2 * us, 500)) {
    ASSIGN_OR_RETURN(const bool done, h.Test());
    if (done) return Status();
    std::this_thread::sleep_for(std::chrono::microseconds(us));
  }
}

}  // namespace

struct MemoryTier::Impl {
  Communicator* comm;
  MemoryTierOptions o;
  std::string root, rank_dir, own_dir, replica_dir;  // replica_dir: where this rank keeps its source's replica
  int n = 1, d = 1, source = -1;                      // source: the rank whose replica this rank holds
  std::unique_ptr<IoEngine> io;
  // The replicas' own communicator (split from comm where MPI allows another thread to use one at
  // the same time): the thread that copies a snapshot then moves its replica too, while training
  // runs. Null: the transfer is posted on comm at Poll and moves while the owner is in MPI.
  std::unique_ptr<Communicator> wire;
  MemoryTierStats stats;
  int64_t superseded = -1;  // the newest complete disk checkpoint seen
  bool budget_checked = false;

  struct Gen {
    int64_t step = -1;
    Manifest m, replica_m;  // the own copy's manifest, the replica's (the same but at stage 0 with own groups: Begin)
    std::vector<Piece> plan, replica_plan;  // this rank's file's pieces, its source's (the same but with groups over meshes of their own)
    int64_t bytes = 0, replica_bytes = 0;
    int own_shard = 0, replica_shard = 0;
    bool replicates = false;  // a replica is sent (none where the state has live replicas: tier_dir.h)
    std::shared_ptr<TierSink> sink;                // the own copy: the capture's sink (null when this rank failed before it)
    StateOwner* owner = nullptr;                   // asked to settle a capture still owed at the commit (alive while the sink is open)
    Mapping replica;
    std::vector<uint64_t> replica_sums;            // the chunks' checksums, as the snapshot's rank took them
    std::shared_future<Status> copied;             // with `wire`: the own copy's end, the replica and the seals
    bool started = false;                          // the own copy is whole: its seal and the replica's transfer began
    CommHandle shift;
    bool shift_done = true;
    std::future<Status> own_sealed, replica_sealed;
    double t0 = 0, replica_done_at = 0, write_seconds = 0, stall = 0;  // stall: training's wait (Save, Commit)
    Status local;  // this rank's first failure
    ~Gen() {
      if (copied.valid() && sink && !sink->closed()) sink->Abandon();  // nothing more comes in: the thread moves on
      if (copied.valid()) copied.wait();  // it reads the sink's mapping
      if (sink) sink->Abandon();
    }
    // Whether the own copy is whole (or failed) without waiting.
    bool Whole() const { return !sink || sink->closed(); }
    const Mapping& own() const { return sink->mapping(); }
    const std::vector<uint64_t>& own_sums() const { return sink->sums(); }
  };
  std::unique_ptr<Gen> gen;

  void Fail(const Status& s) {
    if (gen->local.ok() && !s.ok()) gen->local = s;
  }
  // Collective: generation `m.step` begins: its manifests and file plans, the budget (checked at the
  // first one, on every rank alike), its directory and the sink its own copy is captured into
  // (`groups`: the view's group g is the manifest's groups[g], SnapshotStart::groups).
  Status Begin(Manifest m, std::vector<int> groups, double t0) {
    auto g = std::make_unique<Gen>();
    g->t0 = t0;
    g->step = m.step;
    g->m = std::move(m);
    g->own_shard = comm->rank() % g->m.shards;  // core/state_view.h's numbering
    g->replica_shard = source % g->m.shards;
    g->replicates = Replicated(n, o) && !LiveReplicas(n, g->m.shards);
    g->replica_m = g->m;
    const bool listed = std::any_of(g->m.groups.begin(), g->m.groups.end(), [](const GroupEntry& ge) { return !ge.files.empty(); });
    if (g->m.stage == 0 && listed) {
      // A save records each replicated shard in one file (its group's first member's); a tier copy
      // holds every group of its rank, so its manifest names its file for them, and a replica's is
      // its source's, which the source sends (the holder cannot tell which expert groups it has).
      for (int mg : groups) g->m.groups[static_cast<size_t>(mg)].files = {comm->rank()};
      Status got;
      if (g->replicates) {
        const std::string out = EncodeManifest(g->m);
        int64_t len = static_cast<int64_t>(out.size()), in_len = 0;
        got = comm->Shift(&len, sizeof len, &in_len, sizeof in_len, d);
        std::string in(got.ok() && in_len > 0 && in_len <= kMaxJsonBytes ? static_cast<size_t>(in_len) : 0, '\0');
        if (got.ok()) got = comm->Shift(out.data(), out.size(), in.data(), in.size(), d);  // sizes that disagree fail on both sides
        if (got.ok()) {
          auto rm = DecodeManifest(in, "memory tier: rank " + std::to_string(source) + "'s manifest");
          got = rm.ok() && rm->step != g->step ? DataLossError("memory tier: rank ", source, "'s manifest is of step ", rm->step) : rm.status();
          if (got.ok()) g->replica_m = std::move(*rm);
        }
      }
      RETURN_IF_ERROR(AgreeOnStatus(comm, got), "memory tier");
    }
    ASSIGN_OR_RETURN(g->plan, internal::PlanFile(g->m, g->own_shard, &g->bytes), "memory tier");
    ASSIGN_OR_RETURN(g->replica_plan, internal::PlanFile(g->replica_m, g->replica_shard, &g->replica_bytes), "memory tier");
    if (!budget_checked) {  // two generations of the own copy and the replica must fit
      const int64_t need = 2 * (g->bytes + (g->replicates ? g->replica_bytes : 0));
      Status fits = need <= stats.budget_bytes ? Status()
                    : OutOfMemoryError("memory tier: rank ", comm->rank(), " needs ", need, " bytes (two generations of its ", g->bytes,
                                       "-byte snapshot", g->replicates ? " and of its peer's replica" : "", ") in ", rank_dir,
                                       ", over its budget of ", stats.budget_bytes, " bytes");
      RETURN_IF_ERROR(AgreeOnStatus(comm, fits));
      budget_checked = true;
    }
    stats.snapshot_bytes = g->bytes;
    gen = std::move(g);
    const std::string own_tmp = StepPath(own_dir, gen->step) + ".tmp";
    const std::string own_data = own_tmp + "/" + DataFileName(gen->own_shard);
    Fail([&]() -> Status {
      RETURN_IF_ERROR(RemoveTree(own_tmp));
      RETURN_IF_ERROR(MakeTierDir(own_tmp));
      Recycle(own_dir, own_data);  // a removed generation's file: its pages are there already
      gen->sink = std::make_shared<TierSink>(gen->m, gen->plan, own_data, gen->bytes, std::move(groups));
      return Status();
    }());
    return Status();
  }
  // The replica's transfer on `c` from this rank's copy into its holder's: the holder's mapping, the
  // checksums (the holder indexes the replica with them: it does not hash the bytes again, and a
  // transfer that damaged them fails the replica's check when it is loaded), then the data, posted.
  // A rank that failed (`local`) still takes part, with nothing to send or receive: the sizes
  // disagree, so the shift fails on every rank (the data's is then posted nowhere) and the generation
  // is dropped at commit.
  Result<CommHandle> PostReplica(Gen& g, Communicator* c, Status* local) {
    const std::string rep_tmp = StepPath(replica_dir, g.step) + ".tmp";
    if (local->ok()) {
      *local = [&]() -> Status {
        RETURN_IF_ERROR(RemoveTree(rep_tmp));
        RETURN_IF_ERROR(MakeTierDir(rep_tmp));
        Recycle(replica_dir, rep_tmp + "/" + DataFileName(g.replica_shard));
        ASSIGN_OR_RETURN(g.replica, Mapping::Map(rep_tmp + "/" + DataFileName(g.replica_shard), g.replica_bytes, true));
        return Status();
      }();
    }
    const bool ok = local->ok();
    const size_t sums_out = ok ? g.own_sums().size() * 8 : 0, sums_in = ok ? FirstChunks(g.replica_m, g.replica_plan).back() * 8 : 0;
    if (ok) g.replica_sums.resize(sums_in / 8);
    RETURN_IF_ERROR(c->Shift(ok ? g.own_sums().data() : nullptr, sums_out, g.replica_sums.data(), sums_in, d));
    return c->ShiftAsync(ok ? g.own().data() : nullptr, ok ? static_cast<size_t>(g.bytes) : 0, ok ? g.replica.data() : nullptr,
                         ok ? static_cast<size_t>(g.replica_bytes) : 0, d);
  }
  Status SealReplica(Gen& g) {
    return internal::Seal(*io, StepPath(replica_dir, g.step) + ".tmp", StepPath(replica_dir, g.step), g.replica_m, g.replica_plan, g.replica_shard,
                          g.replica_sums, g.replica_bytes)
        .WithContext("memory tier replica of rank " + std::to_string(source));
  }
  // On the copy's thread, with `wire`: after the copy (`local`: its outcome), the replica's transfer
  // and both seals; every rank takes part in the transfer whatever its copy's outcome.
  Status Replicate(Gen& g, Status local) {
    auto keep = [&](const Status& s) {
      if (local.ok() && !s.ok()) local = s;
    };
    if (g.replicates) {
      // Every rank's thread meets first (its peer's copy may end much later than its own), then the
      // checksums and the data move.
      float here = 1;
      auto met = wire->AllReduceAsync(&here, &here, 1, DType::kF32, ReduceOp::kMin);
      keep(met.ok() ? WaitGently(*met) : met.status());
      auto h = PostReplica(g, wire.get(), &local);
      keep(h.ok() ? h->Wait() : h.status());
    }
    g.replica_done_at = SteadySeconds();
    if (!local.ok()) return local;
    const double t0 = SteadySeconds();
    keep(internal::Seal(*io, StepPath(own_dir, g.step) + ".tmp", StepPath(own_dir, g.step), g.m, g.plan, g.own_shard, g.own_sums(), g.bytes));
    g.write_seconds = SteadySeconds() - t0;
    if (local.ok() && g.replicates) keep(SealReplica(g));
    return local;
  }
  // Collective, once the own copy is whole on every rank (or failed), without `wire`: the own copy's
  // seal in the background and the replica's transfer on comm.
  void StartTransfer() {
    Gen& g = *gen;
    g.started = true;
    const std::string own_tmp = StepPath(own_dir, g.step) + ".tmp";
    if (g.local.ok()) {
      g.own_sealed = std::async(std::launch::async, [this, p = &g, own_tmp] {
        ThreadPool::MakeBackground();
        const double t0 = SteadySeconds();
        Status s = internal::Seal(*io, own_tmp, StepPath(own_dir, p->step), p->m, p->plan, p->own_shard, p->own_sums(), p->bytes);
        p->write_seconds = SteadySeconds() - t0;  // read by Commit after get()
        return s;
      });
    }
    if (!g.replicates) return;
    // The replica: this rank's mapping straight into its holder's.
    auto h = PostReplica(g, comm, &g.local);
    if (!h.ok()) return Fail(h.status());
    g.shift = std::move(*h);
    g.shift_done = false;
  }
  // The own copy is whole (delivered, failed or refused): its outcome is this rank's.
  void Arrived() {
    Gen& g = *gen;
    if (g.sink) Fail(g.sink->closed() ? g.sink->WaitClosed() : InternalError("memory tier: the state never arrived"));
  }
  void StartReplicaSeal() {
    Gen* g = gen.get();
    g->replica_done_at = SteadySeconds();
    if (!g->local.ok() || !g->replicates) return;
    g->replica_sealed = std::async(std::launch::async, [this, g] {
      ThreadPool::MakeBackground();
      return SealReplica(*g);
    });
  }
  // Whether this rank's part of the pending generation is done (no waiting).
  bool LocallyDone() {
    Gen* g = gen.get();
    if (!g->shift_done) {
      auto t = g->shift.Test();
      if (!t.ok()) {
        Fail(t.status());
        g->shift_done = true;
        StartReplicaSeal();
      } else if (*t) {
        g->shift_done = true;
        StartReplicaSeal();
      }
    }
    auto ready = [](const auto& f) { return !f.valid() || f.wait_for(std::chrono::seconds(0)) == std::future_status::ready; };
    return g->shift_done && ready(g->own_sealed) && ready(g->replica_sealed) && ready(g->copied);
  }
  Status Commit() {
    Gen* g = gen.get();
    // A capture still owed (NVMe state waiting for the next step) is streamed now, then its end waited for.
    if (g->sink && !g->sink->closed() && g->owner != nullptr) Fail(g->owner->Settle());
    if (!g->started) {
      const double w0 = SteadySeconds();
      if (g->sink) (void)g->sink->WaitClosed();
      g->stall += SteadySeconds() - w0;
      Arrived();
      StartTransfer();
    }
    if (!g->shift_done) {
      Fail(g->shift.Wait());
      g->shift_done = true;
      StartReplicaSeal();
    }
    if (g->own_sealed.valid()) Fail(g->own_sealed.get());
    if (g->replica_sealed.valid()) Fail(g->replica_sealed.get());
    if (g->copied.valid()) Fail(g->copied.get());  // the thread that moved the replica and sealed both
    g->replica.Reset();
    const int64_t step = g->step;
    Status agreed = AgreeOnStatus(comm, g->local);
    const double replica_seconds = g->replicates && g->replica_done_at > 0 ? g->replica_done_at - g->t0 : 0;
    stats.write_seconds = g->write_seconds;
    stats.stall_seconds = g->stall + (g->sink ? g->sink->waited() : 0.0);
    gen.reset();
    if (!agreed.ok()) {  // the generation is not used: the previous one stays
      (void)RemoveTree(StepPath(own_dir, step) + ".tmp");
      (void)RemoveTree(StepPath(own_dir, step));
      if (!replica_dir.empty()) {
        (void)RemoveTree(StepPath(replica_dir, step) + ".tmp");
        (void)RemoveTree(StepPath(replica_dir, step));
      }
      return agreed.WithContext("memory tier: snapshot of step " + std::to_string(step));
    }
    KeepSpare(own_dir, step);
    RemoveAllBut(own_dir, step);
    if (!replica_dir.empty()) {
      KeepSpare(replica_dir, step);
      RemoveAllBut(replica_dir, step);
    }
    stats.step = step;
    stats.replica_seconds = replica_seconds;
    if (superseded > step) Supersede(superseded);
    stats.bytes_held = TreeBytes(rank_dir);
    return Status();
  }
  void Supersede(int64_t step) {
    superseded = std::max(superseded, step);
    if (stats.step >= 0 && stats.step < superseded) {  // the committed generation; one in flight stays
      const int64_t keep = gen ? gen->step : -1;
      RemoveAllBut(own_dir, keep);
      if (!replica_dir.empty()) RemoveAllBut(replica_dir, keep);
      stats.step = -1;
      stats.bytes_held = TreeBytes(rank_dir);
    }
  }
};

MemoryTier::MemoryTier(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
const MemoryTierStats& MemoryTier::stats() const { return impl_->stats; }
void MemoryTier::Supersede(int64_t step) { impl_->Supersede(step); }

Result<std::unique_ptr<MemoryTier>> MemoryTier::Create(Communicator* comm, const std::string& root, const MemoryTierOptions& o) {
  if (comm == nullptr) return InvalidArgumentError("memory tier: null communicator");
  if (o.dir.empty()) return InvalidArgumentError("memory tier: empty directory");
  if (o.budget_bytes < 0 || o.ranks_per_node < 0) return InvalidArgumentError("memory tier: negative budget or ranks per node");
  auto impl = std::make_unique<Impl>();
  impl->comm = comm;
  impl->o = o;
  impl->root = root;
  const TierPlace p = PlaceOf(root, o, comm->size(), comm->rank());
  impl->n = p.n;
  impl->d = p.d;
  impl->source = p.source;
  impl->rank_dir = p.rank_dir;
  impl->own_dir = p.own_dir;
  impl->replica_dir = p.replica_dir;
  Status s = [&]() -> Status {
    ASSIGN_OR_RETURN(impl->io, IoEngine::Create(IoOptions{}));
    return PrepareRankDir(root, o, p, &impl->stats);
  }();
  RETURN_IF_ERROR(AgreeOnStatus(comm, s), "memory tier in ", JobDir(root, o));
  if (Replicated(impl->n, o)) {  // the replicas' own communicator, where MPI lets a thread use it beside comm
    float can = comm->concurrent_splits() ? 1.0f : 0.0f;
    RETURN_IF_ERROR(comm->AllReduce(&can, &can, 1, DType::kF32, ReduceOp::kMin), "memory tier");
    if (can > 0) {
      ASSIGN_OR_RETURN(impl->wire, comm->Split(0, comm->rank()), "memory tier: the replicas' communicator");
      // Its collectives are one fixed sequence on one thread (Replicate; the shift checks its sizes
      // itself): no argument check, whose blocking all-reduce would spin while the peer is late.
      impl->wire->set_check_args(false);
    }
  }
  return std::unique_ptr<MemoryTier>(new MemoryTier(std::move(impl)));
}

MemoryTier::~MemoryTier() {
  Impl& t = *impl_;
  if (t.gen) {  // not committed (that needs every rank): finish the transfers, keep nothing half-written
    (void)t.gen->shift.Wait();
    if (t.gen->own_sealed.valid()) (void)t.gen->own_sealed.get();
    if (t.gen->replica_sealed.valid()) (void)t.gen->replica_sealed.get();
    t.gen.reset();
  }
  // What the files hold decides (a resume may have placed a replica here since the last commit).
  int64_t newest = -1;
  for (const std::string& parent : {t.own_dir, t.replica_dir}) {
    const std::vector<int64_t> held = parent.empty() ? std::vector<int64_t>{} : Steps(parent);
    if (!held.empty()) newest = std::max(newest, held.front());
  }
  if (newest > t.superseded) {
    ZRT_LOG(kInfo) << "memory tier: keeping step " << newest << " in " << t.rank_dir << " (newer than the last disk checkpoint"
                   << (t.superseded >= 0 ? ", step " + std::to_string(t.superseded) : std::string()) << ") for a restart";
    return;
  }
  (void)RemoveTree(t.rank_dir);
  ::rmdir(JobDir(t.root, t.o).c_str());  // the last rank of the node removes the job's directory
}

Status MemoryTier::Save(const StateView& state, const nlohmann::json& trainer_state) {
  Impl& t = *impl_;
  if (t.gen) RETURN_IF_ERROR(t.Commit(), "committing the previous snapshot");
  // The step every rank already holds is kept as it is (replacing it would leave a moment with no
  // whole copy of it).
  ASSIGN_OR_RETURN(internal::SnapshotStart start, internal::StartSnapshot(t.comm, state, trainer_state, 1 << 20, t.stats.step == state.counters.step),
                   "memory tier");
  if (start.skip) return Status();
  const double t0 = SteadySeconds();  // the stall, from the agreement on (snapshot.h)
  RETURN_IF_ERROR(t.Begin(std::move(start.manifest), std::move(start.groups), t0));
  Impl::Gen& gen = *t.gen;
  gen.owner = state.owner;
  if (gen.local.ok()) {
    Result<double> stall = internal::HandOver(state, gen.sink, t0);
    if (!stall.ok()) gen.sink->Close(stall.status());  // the owner never took it
  }
  if (t.wire) {  // every rank's thread takes part in the transfer, whatever its copy's outcome
    gen.started = true;
    gen.copied = std::async(std::launch::async, [&t, &gen, local = gen.local]() mutable -> Status {
                   ThreadPool::MakeBackground();
                   if (local.ok()) local = gen.sink->WaitClosed();
                   return t.Replicate(gen, std::move(local));
                 }).share();
  }
  gen.stall = SteadySeconds() - gen.t0;
  if (gen.started) return Status();
  // A copy that ended at once everywhere (a view without an owner) moves on now; else the first Poll
  // that finds every rank's copy whole starts the rest.
  float whole = gen.Whole() ? 1.0f : 0.0f;
  RETURN_IF_ERROR(t.comm->AllReduce(&whole, &whole, 1, DType::kF32, ReduceOp::kMin), "memory tier");
  if (whole == 0) return Status();
  t.Arrived();
  t.StartTransfer();
  return Status();
}

Status MemoryTier::Poll() {
  Impl& t = *impl_;
  if (!t.gen) return Status();
  if (!t.gen->started) {  // is every rank's own copy whole (or failed)?
    float arrived = t.gen->Whole() ? 1.0f : 0.0f;
    RETURN_IF_ERROR(t.comm->AllReduce(&arrived, &arrived, 1, DType::kF32, ReduceOp::kMin), "memory tier poll");
    if (arrived == 0) return Status();
    t.Arrived();
    t.StartTransfer();
    return Status();
  }
  float done = t.LocallyDone() ? 1.0f : 0.0f;
  RETURN_IF_ERROR(t.comm->AllReduce(&done, &done, 1, DType::kF32, ReduceOp::kMin), "memory tier poll");
  return done > 0 ? t.Commit() : Status();
}

Status MemoryTier::Wait() {
  Impl& t = *impl_;
  return t.gen ? t.Commit() : Status();
}

}  // namespace zrt::ckpt
