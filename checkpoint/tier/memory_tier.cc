// The memory tier (memory_tier.h). One generation's protocol:
//   Save (collective)   rank 0's nonce; each rank copies its state into own/step-N.tmp/rank-S.data
//                       (a mapping of a tmpfs file, pages recycled) chunk by chunk, checksumming each
//                       chunk while it is in cache: one pass, on a thread of its own when the state is
//                       host memory or device memory read on a stream of its own, and its owner holds
//                       its next change until the copy ends (StateView::hold), else while training
//                       waits. Its checksums go to its
//                       replica's holder (a small shift), then the data (from that mapping straight
//                       into the holder's mapped replica-q/step-N.tmp/rank-Sq.data):
//                         with `wire` (MPI_THREAD_MULTIPLE): on the copy's thread, over a communicator
//                         of its own, then both seals there; training never waits for it;
//                         else: posted on the Checkpointer's communicator at Save, or at the first Poll
//                         that finds every rank's copy whole, and moved while the owner is in MPI.
//   seals               own: index (from the checksums), manifest, rename to step-N. Replica (once
//                       the transfer completed): the same on its holder, indexed with the sender's
//                       checksums (never re-hashed there).
//   Poll/Wait           one all-reduce: whole on every rank? Then AgreeOnStatus and every generation
//                       but N is removed (older ones, and newer ones a resume from an older state left).
// The files are an ordinary checkpoint directory holding one rank's files, so Load reads and checks
// them like any checkpoint; how one is laid out, mapped, filled and sealed is tier_file.h.
#include "zrt/checkpoint/tier/memory_tier.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <future>
#include <set>

#include "zrt/checkpoint/codec.h"
#include "zrt/checkpoint/commit.h"
#include "zrt/checkpoint/files.h"
#include "zrt/checkpoint/format.h"
#include "zrt/checkpoint/fs_util.h"
#include "zrt/checkpoint/shard_writer.h"
#include "zrt/checkpoint/snapshot.h"
#include "zrt/checkpoint/tier/tier_file.h"
#include "zrt/core/logging.h"
#include "zrt/offload/io_engine.h"

namespace zrt::ckpt {

namespace fs = std::filesystem;
using internal::AlignUp;
using internal::TierSink;
using internal::Mapping;
using internal::Now;
using internal::Piece;

namespace {

int RanksPerNode(const MemoryTierOptions& o) {
  if (o.ranks_per_node > 0) return o.ranks_per_node;
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"}) {
    if (const char* v = std::getenv(var)) {
      const int n = std::atoi(v);
      if (n > 0) return n;
    }
  }
  return 1;
}

// Rank q's replica is held by rank (q + d) mod n.
int Distance(int n, const MemoryTierOptions& o) {
  const int rpn = RanksPerNode(o);
  return n > rpn ? rpn : 1;
}
bool Replicated(int n, const MemoryTierOptions& o) { return o.replicate && n > 1; }

std::string StepPath(const std::string& parent, int64_t step) { return parent + "/" + StepDirName(step); }
std::string ReplicaDir(const std::string& rank_dir, int q) {
  char name[32];
  std::snprintf(name, sizeof(name), "replica-%05d", q);
  return rank_dir + "/" + name;
}

// The whole generations under `parent` (own/ or replica-q/), newest first.
std::vector<int64_t> Steps(const std::string& parent) {
  std::vector<int64_t> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(parent, ec)) {
    auto step = ParseStepDirName(e.path().filename().string());
    if (step.ok() && e.is_directory(ec) && !e.is_symlink(ec)) out.push_back(*step);
  }
  std::sort(out.rbegin(), out.rend());
  return out;
}

// A data file of a removed generation, kept to be written over by the next one: tmpfs then has the
// pages already (no page faults and zeroing while training waits for the snapshot).
constexpr const char* kSpare = "spare.data";

// Moves the data file of a generation under `parent` other than `keep` to parent/spare.data.
void KeepSpare(const std::string& parent, int64_t keep) {
  std::error_code ec;
  if (fs::exists(parent + "/" + kSpare, ec)) return;
  for (const auto& e : fs::directory_iterator(parent, ec)) {
    auto step = ParseStepDirName(e.path().filename().string());
    if (!step.ok() || *step == keep) continue;
    for (const auto& f : fs::directory_iterator(e.path(), ec)) {
      if (f.path().extension() == ".data" && f.is_regular_file(ec) && !f.is_symlink(ec)) {
        fs::rename(f.path(), parent + "/" + kSpare, ec);
        return;
      }
    }
  }
}

// `path` (a new data file) takes the place of parent/spare.data when that is a plain file (anything
// else found there, a link say, is removed and never written through).
void Recycle(const std::string& parent, const std::string& path) {
  std::error_code ec;
  const std::string spare = parent + "/" + kSpare;
  const fs::file_status st = fs::symlink_status(spare, ec);
  if (ec || !fs::exists(st)) return;  // none: the file is created
  if (fs::is_regular_file(st)) {
    fs::rename(spare, path, ec);
  } else {
    fs::remove_all(spare, ec);
  }
}

// Removes everything under `parent` but generation `keep` (whole or being written; -1: nothing kept).
void RemoveAllBut(const std::string& parent, int64_t keep) {
  std::error_code ec;
  std::vector<fs::path> doomed;
  for (const auto& e : fs::directory_iterator(parent, ec)) {
    const std::string name = e.path().filename().string();
    if (keep >= 0 && (name == StepDirName(keep) || name == StepDirName(keep) + ".tmp" || name == kSpare)) continue;
    doomed.push_back(e.path());
  }
  for (const fs::path& p : doomed) {
    Status s = RemoveTree(p.string());
    if (!s.ok()) ZRT_LOG(kWarn) << "memory tier: " << s;
  }
}

int64_t TreeBytes(const std::string& dir) {
  int64_t n = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_regular_file(ec)) n += static_cast<int64_t>(it->file_size(ec));
  }
  return n;
}

bool Exists(const std::string& p) {
  std::error_code ec;
  return fs::exists(p, ec);
}

}  // namespace

std::string MemoryTier::JobDir(const std::string& root, const MemoryTierOptions& o) {
  std::error_code ec;
  fs::path abs = fs::weakly_canonical(fs::absolute(root, ec), ec);
  const std::string key = abs.empty() ? root : abs.string();
  char name[40];
  std::snprintf(name, sizeof(name), "zrt-tier-%016llx", static_cast<unsigned long long>(Checksum(key.data(), key.size())));
  return o.dir + "/" + name;
}

std::string MemoryTier::RankDir(const std::string& root, const MemoryTierOptions& o, int rank) {
  char name[32];
  std::snprintf(name, sizeof(name), "rank-%05d", rank);
  return JobDir(root, o) + "/" + name;
}

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
    Manifest m;
    std::vector<Piece> plan;
    int64_t bytes = 0;
    int own_shard = 0, replica_shard = 0;
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
  // Collective: generation `m.step` begins: its file plan, the budget (checked at the first one, on
  // every rank alike), its directory and the sink its own copy is captured into.
  Status Begin(Manifest m, double t0) {
    auto g = std::make_unique<Gen>();
    g->t0 = t0;
    g->step = m.step;
    g->m = std::move(m);
    ASSIGN_OR_RETURN(g->plan, internal::PlanFile(g->m, &g->bytes), "memory tier");
    g->own_shard = g->m.shards == 1 ? 0 : comm->rank();
    g->replica_shard = g->m.shards == 1 ? 0 : source;
    if (!budget_checked) {  // two generations of the own copy and the replica must fit
      const int64_t need = 2 * g->bytes * (Replicated(n, o) ? 2 : 1);
      Status fits = need <= stats.budget_bytes ? Status()
                    : OutOfMemoryError("memory tier: rank ", comm->rank(), " needs ", need, " bytes (two generations of its ", g->bytes,
                                       "-byte snapshot", Replicated(n, o) ? " and of its peer's replica" : "", ") in ", rank_dir,
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
      RETURN_IF_ERROR(MakeDirs(own_tmp));
      Recycle(own_dir, own_data);  // a removed generation's file: its pages are there already
      gen->sink = std::make_shared<TierSink>(gen->m, gen->plan, own_data, gen->bytes);
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
        RETURN_IF_ERROR(MakeDirs(rep_tmp));
        Recycle(replica_dir, rep_tmp + "/" + DataFileName(g.replica_shard));
        ASSIGN_OR_RETURN(g.replica, Mapping::Map(rep_tmp + "/" + DataFileName(g.replica_shard), g.bytes, true));
        return Status();
      }();
    }
    const bool ok = local->ok();
    const size_t sums_bytes = ok ? g.own_sums().size() * 8 : 0;
    if (ok) g.replica_sums.resize(g.own_sums().size());
    RETURN_IF_ERROR(c->Shift(ok ? g.own_sums().data() : nullptr, sums_bytes, g.replica_sums.data(), sums_bytes, d));
    return c->ShiftAsync(ok ? g.own().data() : nullptr, ok ? static_cast<size_t>(g.bytes) : 0, ok ? g.replica.data() : nullptr,
                         ok ? static_cast<size_t>(g.bytes) : 0, d);
  }
  Status SealReplica(Gen& g) {
    return internal::Seal(*io, StepPath(replica_dir, g.step) + ".tmp", StepPath(replica_dir, g.step), g.m, g.plan, g.replica_shard,
                          g.replica_sums, g.bytes)
        .WithContext("memory tier replica of rank " + std::to_string(source));
  }
  // On the copy's thread, with `wire`: after the copy (`local`: its outcome), the replica's transfer
  // and both seals; every rank takes part in the transfer whatever its copy's outcome.
  Status Replicate(Gen& g, Status local) {
    auto keep = [&](const Status& s) {
      if (local.ok() && !s.ok()) local = s;
    };
    if (Replicated(n, o)) {
      auto h = PostReplica(g, wire.get(), &local);
      keep(h.ok() ? h->Wait() : h.status());
    }
    g.replica_done_at = Now();
    if (!local.ok()) return local;
    const double t0 = Now();
    keep(internal::Seal(*io, StepPath(own_dir, g.step) + ".tmp", StepPath(own_dir, g.step), g.m, g.plan, g.own_shard, g.own_sums(), g.bytes));
    g.write_seconds = Now() - t0;
    if (local.ok() && Replicated(n, o)) keep(SealReplica(g));
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
        const double t0 = Now();
        Status s = internal::Seal(*io, own_tmp, StepPath(own_dir, p->step), p->m, p->plan, p->own_shard, p->own_sums(), p->bytes);
        p->write_seconds = Now() - t0;  // read by Commit after get()
        return s;
      });
    }
    if (!Replicated(n, o)) return;
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
    g->replica_done_at = Now();
    if (!g->local.ok() || !Replicated(n, o)) return;
    g->replica_sealed = std::async(std::launch::async, [this, g] { return SealReplica(*g); });
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
      const double w0 = Now();
      if (g->sink) (void)g->sink->WaitClosed();
      g->stall += Now() - w0;
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
    const double replica_seconds = g->replica_done_at > 0 ? g->replica_done_at - g->t0 : 0;
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
  impl->n = comm->size();
  impl->d = Distance(impl->n, o);
  impl->rank_dir = RankDir(root, o, comm->rank());
  impl->own_dir = impl->rank_dir + "/own";
  if (Replicated(impl->n, o)) {
    impl->source = ((comm->rank() - impl->d) % impl->n + impl->n) % impl->n;
    impl->replica_dir = ReplicaDir(impl->rank_dir, impl->source);
  }
  Status s = [&]() -> Status {
    ASSIGN_OR_RETURN(impl->io, IoEngine::Create(IoOptions{}));
    RETURN_IF_ERROR(MakeDirs(impl->own_dir));
    if (!impl->replica_dir.empty()) RETURN_IF_ERROR(MakeDirs(impl->replica_dir));
    // What a killed run left: half-written generations, replicas this rank no longer holds, ranks the
    // job no longer has (every rank of a node may try; a loser of that race finds nothing).
    std::error_code ec;
    for (const std::string& parent : {impl->own_dir, impl->replica_dir}) {
      if (parent.empty()) continue;
      std::vector<fs::path> doomed;
      for (const auto& e : fs::directory_iterator(parent, ec)) {
        if (!ParseStepDirName(e.path().filename().string()).ok()) doomed.push_back(e.path());
      }
      for (const fs::path& p : doomed) (void)RemoveTree(p.string());
    }
    std::vector<fs::path> doomed;
    for (const auto& e : fs::directory_iterator(impl->rank_dir, ec)) {
      if (e.path().filename() != "own" && e.path().string() != impl->replica_dir) doomed.push_back(e.path());
    }
    for (const auto& e : fs::directory_iterator(JobDir(root, o), ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind("rank-", 0) == 0 && std::atoi(name.c_str() + 5) >= impl->n) doomed.push_back(e.path());
    }
    for (const fs::path& p : doomed) (void)RemoveTree(p.string());
    struct statvfs vfs {};
    if (::statvfs(impl->rank_dir.c_str(), &vfs) != 0) return ErrnoStatus(errno, "memory tier: " + impl->rank_dir);
    impl->stats.budget_bytes = o.budget_bytes > 0 ? o.budget_bytes : static_cast<int64_t>(vfs.f_bavail) * static_cast<int64_t>(vfs.f_frsize);
    impl->stats.bytes_held = TreeBytes(impl->rank_dir);
    // What a previous run left is this run's until it is superseded: never removed at a normal exit
    // before a disk checkpoint holds something as new (a run that resumed from it and stopped early).
    const std::vector<int64_t> held = Steps(impl->own_dir);
    impl->stats.step = held.empty() ? -1 : held.front();
    if (o.budget_bytes == 0) impl->stats.budget_bytes += impl->stats.bytes_held;
    return Status();
  }();
  RETURN_IF_ERROR(AgreeOnStatus(comm, s), "memory tier in ", JobDir(root, o));
  if (Replicated(impl->n, o)) {  // the replicas' own communicator, where MPI lets a thread use it beside comm
    float can = comm->concurrent_splits() ? 1.0f : 0.0f;
    RETURN_IF_ERROR(comm->AllReduce(&can, &can, 1, DType::kF32, ReduceOp::kMin), "memory tier");
    if (can > 0) {
      ASSIGN_OR_RETURN(impl->wire, comm->Split(0, comm->rank()), "memory tier: the replicas' communicator");
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
  const double t0 = Now();
  // The step every rank already holds is kept as it is (replacing it would leave a moment with no
  // whole copy of it).
  ASSIGN_OR_RETURN(internal::SnapshotStart start, internal::StartSnapshot(t.comm, state, trainer_state, 1 << 20, t.stats.step == state.counters.step),
                   "memory tier");
  if (start.skip) return Status();
  RETURN_IF_ERROR(t.Begin(std::move(start.manifest), t0));
  Impl::Gen& gen = *t.gen;
  gen.owner = state.owner;
  if (gen.local.ok()) {
    Result<double> stall = internal::HandOver(state, gen.sink, t0);
    if (!stall.ok()) gen.sink->Close(stall.status());  // the owner never took it
  }
  if (t.wire) {  // every rank's thread takes part in the transfer, whatever its copy's outcome
    gen.started = true;
    gen.copied = std::async(std::launch::async, [&t, &gen, local = gen.local]() mutable -> Status {
                   if (local.ok()) local = gen.sink->WaitClosed();
                   return t.Replicate(gen, std::move(local));
                 }).share();
  }
  gen.stall = Now() - gen.t0;
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

// ---- Resume's side -----------------------------------------------------------------------------------

Result<std::vector<int64_t>> TierCandidates(Communicator* comm, const std::string& root, const MemoryTierOptions& o) {
  const int n = comm->size(), r = comm->rank(), d = Distance(n, o);
  constexpr int kMax = 8;
  const std::string rank_dir = MemoryTier::RankDir(root, o, r);
  std::vector<int64_t> mine(2 * kMax, -1);
  std::vector<int64_t> own = Steps(rank_dir + "/own"), rep;
  if (Replicated(n, o)) rep = Steps(ReplicaDir(rank_dir, ((r - d) % n + n) % n));
  for (size_t i = 0; i < own.size() && i < kMax; ++i) mine[i] = own[i];
  for (size_t i = 0; i < rep.size() && i < kMax; ++i) mine[kMax + i] = rep[i];
  std::vector<int64_t> all(static_cast<size_t>(n) * 2 * kMax);
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
    for (int q = 0; q < n && everyone; ++q) everyone = holds(q, 0, s) || (Replicated(n, o) && holds((q + d) % n, 1, s));
    if (everyone) out.push_back(s);
  }
  return out;
}

Result<LoadResult> LoadFromTier(Communicator* comm, const std::string& root, const MemoryTierOptions& o, int64_t step,
                                const StateView& target, const LoadOptions& load, std::string* dir, bool* from_peer) {
  const int n = comm->size(), r = comm->rank(), d = Distance(n, o);
  const std::string rank_dir = MemoryTier::RankDir(root, o, r);
  const std::string own = StepPath(rank_dir + "/own", step);
  *dir = own;
  *from_peer = false;
  Result<LoadResult> res = Exists(own) ? Load(own, target, load) : Result<LoadResult>(NotFoundError("no copy in ", own));
  int64_t need = res.ok() ? 0 : 1;
  std::vector<int64_t> needs(static_cast<size_t>(n));
  RETURN_IF_ERROR(comm->AllGather(&need, needs.data(), 8, DType::kBytes), "memory tier: restoring step ", step);
  if (std::none_of(needs.begin(), needs.end(), [](int64_t x) { return x != 0; }) || !Replicated(n, o)) return res;
  // Some rank's own copy is gone or bad: its holder sends the replica (manifest, index, data file), which
  // becomes that rank's own copy again and is loaded (and checked) like any.
  const int source = ((r - d) % n + n) % n, holder = (r + d) % n;
  const std::string rep = StepPath(ReplicaDir(rank_dir, source), step);
  std::string files[2];
  Mapping data;
  int64_t sizes[3] = {0, 0, 0};
  if (needs[static_cast<size_t>(source)] != 0 && Exists(rep)) {
    Status s = [&]() -> Status {
      ASSIGN_OR_RETURN(CheckpointDir cd, CheckpointDir::Open(rep));
      ASSIGN_OR_RETURN(files[0], cd.ReadFile(kManifestFile));
      ASSIGN_OR_RETURN(Manifest m, DecodeManifest(files[0], cd.PathOf(kManifestFile)));
      const int shard = m.shards == 1 ? 0 : source;
      ASSIGN_OR_RETURN(files[1], cd.ReadFile(IndexFileName(shard)));
      ASSIGN_OR_RETURN(data, Mapping::Map(cd.PathOf(DataFileName(shard)), -1, false));
      return Status();
    }();
    if (s.ok()) {
      sizes[0] = static_cast<int64_t>(files[0].size());
      sizes[1] = static_cast<int64_t>(files[1].size());
      sizes[2] = static_cast<int64_t>(data.size());
    } else {
      ZRT_LOG(kWarn) << "memory tier: cannot send rank " << source << " its replica of step " << step << ": " << s;
      data.Reset();
    }
  }
  int64_t in[3] = {0, 0, 0};
  RETURN_IF_ERROR(comm->Shift(sizes, sizeof(sizes), in, sizeof(in), -d), "memory tier: restoring step ", step);
  // What this rank's data file must be (PlanFile's layout of its shard): nothing else is taken, so a
  // bad file on the holder cannot make this rank allocate what it likes.
  int64_t expected = 0;
  for (const StateGroup& g : target.groups) {
    for (const StateBuffer& b : g.buffers) expected = AlignUp(expected) + b.count * 4;
  }
  const bool receiving = needs[static_cast<size_t>(r)] != 0 && in[2] == expected && expected > 0 && in[0] > 0 &&
                         in[0] <= kMaxJsonBytes && in[1] > 0 && in[1] <= kMaxJsonBytes;
  const std::string tmp = own + ".tmp";
  std::string got[2];
  Mapping into;
  Status prepared;
  if (receiving) {
    got[0].resize(static_cast<size_t>(in[0]));
    got[1].resize(static_cast<size_t>(in[1]));
    prepared = [&]() -> Status {
      RETURN_IF_ERROR(RemoveTree(tmp));
      RETURN_IF_ERROR(MakeDirs(tmp));
      const int shard = target.groups.empty() || target.groups[0].layout.world_size() == 1 ? 0 : r;
      ASSIGN_OR_RETURN(into, Mapping::Map(tmp + "/" + DataFileName(shard), in[2], true));
      return Status();
    }();
  }
  const bool take = receiving && prepared.ok();
  // Three shifts toward the rank each holder serves. A rank that cannot take what its holder offers
  // posts nothing: the sizes disagree, the shift fails on every rank and so does this candidate.
  for (int i = 0; i < 2; ++i) {
    RETURN_IF_ERROR(comm->Shift(files[i].data(), static_cast<size_t>(sizes[i]), take ? got[i].data() : nullptr,
                                take ? got[i].size() : 0, -d),
                    "memory tier: restoring step ", step);
  }
  RETURN_IF_ERROR(comm->Shift(data.data(), static_cast<size_t>(sizes[2]), take ? into.data() : nullptr, take ? into.size() : 0, -d),
                  "memory tier: restoring step ", step);
  if (needs[static_cast<size_t>(r)] == 0) return res;
  const std::string why = std::string(res.status().message());
  if (!take) {
    return DataLossError("memory tier: rank ", r, "'s copy of step ", step, " is unusable (", why, ") and its replica on rank ", holder,
                         receiving ? " could not be received: " + std::string(prepared.message()) : std::string(" is not there"));
  }
  Status placed = [&]() -> Status {
    ASSIGN_OR_RETURN(std::unique_ptr<IoEngine> io, IoEngine::Create(IoOptions{}));
    RETURN_IF_ERROR(WriteFileDurably(*io, tmp, std::string(kManifestFile), got[0]));
    ASSIGN_OR_RETURN(Manifest m, DecodeManifest(got[0], tmp + "/" + std::string(kManifestFile)));
    RETURN_IF_ERROR(WriteFileDurably(*io, tmp, IndexFileName(m.shards == 1 ? 0 : r), got[1]));
    into.Reset();
    RETURN_IF_ERROR(RemoveTree(own));
    return RenamePath(tmp, own);
  }();
  if (!placed.ok()) return placed.WithContext("memory tier: rank " + std::to_string(r) + " placing its replica of step " + std::to_string(step));
  ZRT_LOG(kInfo) << "memory tier: rank " << r << "'s copy of step " << step << " unusable (" << why << "); restoring from its replica on rank "
                 << holder;
  *from_peer = true;
  auto again = Load(own, target, load);
  if (!again.ok()) return again.status().WithContext("memory tier: the replica of rank " + std::to_string(r) + " from rank " + std::to_string(holder));
  return again;
}

}  // namespace zrt::ckpt
