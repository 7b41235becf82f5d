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
#include "zrt/checkpoint/tier/tier_file.h"
#include "zrt/core/logging.h"
#include "zrt/offload/io_engine.h"

namespace zrt::ckpt {

namespace fs = std::filesystem;
using internal::AlignUp;
using internal::Arrival;
using internal::Mapping;
using internal::Piece;

namespace {

double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

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
  // What the owner waited at StateView::hold for background copies (shared: a hold may run after
  // its generation, or this tier, is gone).
  std::shared_ptr<std::atomic<double>> held = std::make_shared<std::atomic<double>>(0.0);
  bool budget_checked = false;

  struct Gen {
    int64_t step = -1;
    Manifest m;
    std::vector<Piece> plan;
    int64_t bytes = 0;
    int own_shard = 0, replica_shard = 0;
    Mapping own, replica;
    std::vector<uint64_t> own_sums, replica_sums;  // the chunks' checksums, as the snapshot's rank took them
    std::shared_future<Status> copied;             // the background copy (with `wire`: and the replica and seals)
    std::shared_future<void> copy_done;            // what the owner's hold waits for (StateView::hold)
    std::shared_ptr<Arrival> arrival;              // state the owner's next step hands over (null: none)
    std::function<Status()> deliver;               // the owner's StateView::deliver, for a commit that cannot wait
    bool started = false;                          // the own copy is whole: its seal and the replica's transfer began
    CommHandle shift;
    bool shift_done = true;
    std::future<Status> own_sealed, replica_sealed;
    double t0 = 0, replica_done_at = 0, write_seconds = 0, stall = 0;  // stall: training's wait (Save, the hold, Commit)
    Status local;  // this rank's first failure
    ~Gen() {
      if (arrival) arrival->Abandon();
      if (copied.valid()) copied.wait();  // it writes into `own`
    }
    // Whether the own copy is whole (or failed) without waiting: the background copy and the state
    // that arrives with the owner's step.
    bool Whole() const {
      return (!copied.valid() || copied.wait_for(std::chrono::seconds(0)) == std::future_status::ready) && (!arrival || arrival->closed());
    }
  };
  std::unique_ptr<Gen> gen;

  void Fail(const Status& s) {
    if (gen->local.ok() && !s.ok()) gen->local = s;
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
    const size_t sums_bytes = ok ? g.own_sums.size() * 8 : 0;
    if (ok) g.replica_sums.resize(g.own_sums.size());
    RETURN_IF_ERROR(c->Shift(g.own_sums.data(), sums_bytes, g.replica_sums.data(), sums_bytes, d));
    return c->ShiftAsync(ok ? g.own.data() : nullptr, ok ? static_cast<size_t>(g.bytes) : 0, ok ? g.replica.data() : nullptr,
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
    keep(internal::Seal(*io, StepPath(own_dir, g.step) + ".tmp", StepPath(own_dir, g.step), g.m, g.plan, g.own_shard, g.own_sums, g.bytes));
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
        Status s = internal::Seal(*io, own_tmp, StepPath(own_dir, p->step), p->m, p->plan, p->own_shard, p->own_sums, p->bytes);
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
  // The own copy is whole: the background copy's and the arrival's (delivered, failed or refused)
  // outcomes are this rank's.
  void Arrived() {
    Gen& g = *gen;
    if (g.copied.valid()) {
      Fail(g.copied.get());
      g.copied = {};
    }
    if (!g.arrival) return;
    Fail(g.arrival->closed() ? g.arrival->status() : InternalError("memory tier: the state never arrived"));
    g.arrival.reset();
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
    if (!g->started) {  // the copy ends and the state still to arrive is delivered now (not collective), then the rest
      if (g->copied.valid()) {  // the arrival's checksums go where the copy sized them
        const double w0 = Now();
        g->copied.wait();
        g->stall += Now() - w0;
      }
      if (g->arrival && !g->arrival->closed()) Fail(g->deliver().WithContext("memory tier: taking the offloaded state"));
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
    if (g->copied.valid()) Fail(g->copied.get());  // the copy's thread, which moved the replica too
    g->own.Reset();
    g->replica.Reset();
    const int64_t step = g->step;
    Status agreed = AgreeOnStatus(comm, g->local);
    const double replica_seconds = g->replica_done_at > 0 ? g->replica_done_at - g->t0 : 0;
    stats.write_seconds = g->write_seconds;
    stats.stall_seconds = g->stall + held->exchange(0.0);
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
  // How the own copy is taken: one pass over the state not on NVMe, in the background when its owner
  // can hold its next change until the copy is done (StateView::hold) and every such buffer is host
  // memory or may be read from another thread (device memory: StateBuffer::concurrent_read; then,
  // with `wire`, that thread moves the replica too), else while training waits; state on NVMe arrives
  // with the next step.
  bool arrives = false, copyable = true;  // copyable: every buffer not arriving may be copied on another thread
  for (const StateGroup& sg : state.groups) {
    for (const StateBuffer& b : sg.buffers) {
      arrives = arrives || internal::Arrives(state, b);
      copyable = copyable && (internal::Arrives(state, b) || b.copyable_anywhere());
    }
  }
  const bool background = copyable && state.hold && state.settle;
  // [held, worker], agreed, since what a previous run left (and in principle the views) may differ.
  // held: the step every rank already holds is kept as it is (replacing it would leave a moment with
  // no whole copy of it). worker: the copy's thread moves the replica too.
  float agree[2] = {t.stats.step == state.counters.step ? 1.0f : 0.0f, background && !arrives && t.wire ? 1.0f : 0.0f};
  RETURN_IF_ERROR(t.comm->AllReduce(agree, agree, 2, DType::kF32, ReduceOp::kMin), "memory tier");
  if (agree[0] > 0) return Status();
  const bool worker = agree[1] > 0;
  char nonce[17] = {};
  if (t.comm->rank() == 0) std::snprintf(nonce, sizeof(nonce), "%s", NewNonce().c_str());
  RETURN_IF_ERROR(t.comm->Broadcast(nonce, sizeof(nonce), DType::kBytes, 0), "memory tier nonce");
  auto g = std::make_unique<Impl::Gen>();
  g->t0 = Now();
  g->step = state.counters.step;
  ASSIGN_OR_RETURN(g->m, ManifestFor(state, trainer_state, 1 << 20, nonce), "memory tier");
  ASSIGN_OR_RETURN(g->plan, internal::PlanFile(g->m, &g->bytes), "memory tier");
  g->own_shard = g->m.shards == 1 ? 0 : t.comm->rank();
  g->replica_shard = g->m.shards == 1 ? 0 : t.source;
  if (!t.budget_checked) {  // two generations of the own copy and the replica must fit
    const int64_t need = 2 * g->bytes * (Replicated(t.n, t.o) ? 2 : 1);
    Status fits = need <= t.stats.budget_bytes ? Status()
                  : OutOfMemoryError("memory tier: rank ", t.comm->rank(), " needs ", need, " bytes (two generations of its ", g->bytes,
                                     "-byte snapshot", Replicated(t.n, t.o) ? " and of its peer's replica" : "", ") in ", t.rank_dir,
                                     ", over its budget of ", t.stats.budget_bytes, " bytes");
    RETURN_IF_ERROR(AgreeOnStatus(t.comm, fits));
    t.budget_checked = true;
  }
  t.stats.snapshot_bytes = g->bytes;
  t.gen = std::move(g);
  Impl::Gen& gen = *t.gen;
  const std::string own_tmp = StepPath(t.own_dir, gen.step) + ".tmp";
  const std::string own_data = own_tmp + "/" + DataFileName(gen.own_shard);
  t.Fail([&]() -> Status {
    RETURN_IF_ERROR(RemoveTree(own_tmp));
    RETURN_IF_ERROR(MakeDirs(own_tmp));
    Recycle(t.own_dir, own_data);
    // Mapped here when a step's state arrives into it (not populated: cheap), else by the copy.
    if (arrives || !background) {
      ASSIGN_OR_RETURN(gen.own, Mapping::Map(own_data, gen.bytes, true, !arrives));
    }
    return Status();
  }());
  if (background) {  // launched whatever the outcome so far: with `wire`, every rank's thread takes part in the transfer
    std::promise<void> done;
    gen.copy_done = done.get_future().share();
    gen.started = worker;
    gen.copied = std::async(std::launch::async, [&t, &gen, view = state, own_data, map = !arrives, worker, local = gen.local,
                                                 done = std::move(done)]() mutable -> Status {
                   if (local.ok() && map) {
                     auto m = Mapping::Map(own_data, gen.bytes, true);
                     if (m.ok()) {
                       gen.own = std::move(*m);
                     } else {
                       local = m.status();
                     }
                   }
                   if (local.ok()) local = internal::Snapshot(view, gen.m, gen.plan, gen.own, &gen.own_sums);
                   done.set_value();
                   return worker ? t.Replicate(gen, std::move(local)) : local;
                 }).share();
    state.hold([done = gen.copy_done, held = t.held, stalled = state.stalled] {
      const double t0 = Now();
      done.wait();
      const double waited = Now() - t0;
      held->fetch_add(waited);
      if (stalled) stalled(waited);
    });
  } else if (gen.local.ok()) {
    t.Fail(internal::Snapshot(state, gen.m, gen.plan, gen.own, &gen.own_sums));
  }
  if (gen.local.ok() && arrives) {
    t.Fail([&]() -> Status {
      auto arrival = std::make_shared<Arrival>(state, gen.m, gen.plan, gen.own, &gen.own_sums);
      if (!arrival->expected()) return Status();
      RETURN_IF_ERROR(state.defer(arrival), "memory tier: handing the offloaded state over");
      gen.arrival = std::move(arrival);
      gen.deliver = state.deliver;
      return Status();
    }());
  }
  gen.stall = Now() - gen.t0;
  if (state.stalled) state.stalled(gen.stall);
  if (gen.started) return Status();  // the copy's thread does the rest (agreed: every rank's does)
  // Whether any rank's copy goes on (then every rank waits, and Poll or Commit goes on).
  float waits = (gen.arrival || gen.copied.valid()) && gen.local.ok() ? 1.0f : 0.0f;
  RETURN_IF_ERROR(t.comm->AllReduce(&waits, &waits, 1, DType::kF32, ReduceOp::kMax), "memory tier");
  if (waits > 0) return Status();  // some rank's copy goes on: the first Poll that finds every rank's whole starts the rest
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
