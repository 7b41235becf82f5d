// Save protocol (crash-safe; the commit steps are commit.h's, the format docs/checkpoint-format.md):
//   SaveAsync (collective)  snapshot.h StartSnapshot: the agreed nonce and skip, the manifest; then the
//                           view's capture is handed a ChunkQueue (shard_writer.h) and the writer
//                           thread is woken. The owner streams its state into the queue from then on
//                           (core/state_view.h; NVMe state with its next step).
//   writer thread (per rank) into ROOT/step-N.tmp-<nonce>/: a ShardWriter takes each chunk as it
//                           fills (encoded: optional byte-grouping + zstd; xxh3-64 each; written
//                           through the IoEngine to rank-r.data.tmp), then fsync, rename, the rank's
//                           index; rank 0 publishes manifest.json; fsync the directory. No collective.
//   Commit (collective, at the first Poll after every rank's write finished, or Wait, or the next SaveAsync)
//                           NVMe state still owed is streamed now (the owner's Settle); commit.h:
//                           agree, check complete, rename to ROOT/step-N, fsync, `latest`, retention.
// A crash anywhere before the rename leaves only the .tmp directory: never taken for complete,
// removed by the next Create. The previous complete checkpoint is never touched by a save.
#include "zrt/checkpoint/checkpointer.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>

#include "zrt/checkpoint/commit.h"
#include "zrt/checkpoint/format.h"
#include "zrt/checkpoint/fs_util.h"
#include "zrt/checkpoint/shard_writer.h"
#include "zrt/checkpoint/snapshot.h"
#include "zrt/checkpoint/tier/memory_tier.h"
#include "zrt/core/base.h"
#include "zrt/core/logging.h"
#include "zrt/core/thread_pool.h"
#include "zrt/offload/io_engine.h"

namespace zrt::ckpt {

namespace fs = std::filesystem;

namespace {

// The calling thread: background work (ThreadPool::MakeBackground), its nice value raised by `nice`
// (Linux: per thread).
void AddNice(int nice) {
  ThreadPool::MakeBackground();
  if (nice == 0) return;
  const int now = getpriority(PRIO_PROCESS, static_cast<id_t>(gettid()));
  if (setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), std::clamp(now + nice, -20, 19)) != 0) {
    ZRT_LOG(kWarn) << "checkpoint writer: cannot change its priority by " << nice << ": " << std::strerror(errno);
  }
}

std::atomic<int> g_preempted{0};
void OnPreemptSignal(int) { g_preempted.store(1, std::memory_order_relaxed); }

}  // namespace

struct Checkpointer::Impl {
  // One save: what the writer thread writes and the commit needs.
  struct Job {
    Manifest manifest;
    SaveDir save;
    int shard_rank = -1;  // -1: this rank writes nothing (a replica beyond the manifest's parts)
    int part = 0;         // the part of its shard it writes (format.h PartPlan)
    std::shared_ptr<ChunkQueue> queue;  // the capture's sink; null without a shard
    std::vector<int> groups;            // the queue's (the view's) groups in the manifest (snapshot.h SnapshotStart::groups)
    StateOwner* owner = nullptr;        // asked to settle a capture still owed at the commit (alive while the queue is open)
    // The writer's figures, kept here until the commit hands them to the stats: the training thread may
    // read those (last_stats) while the writer works.
    double write_seconds = 0;
    int64_t stored_bytes = 0;
  };

  Communicator* comm;
  Device* device;
  CheckpointOptions o;
  std::unique_ptr<IoEngine> io;
  std::unique_ptr<ThreadPool> encoders;  // writer_threads of them; null for 1
  std::unique_ptr<MemoryTier> tier;
  std::vector<DeviceBuffer> staging;  // chunk buffers, from save to save
  std::unique_ptr<Job> job;
  bool pending = false;  // a save awaits commit
  SaveStats stats;

  std::mutex mu;
  std::condition_variable cv;
  bool has_work = false, work_done = false, stop = false;
  Status work_status;
  std::thread writer;

  void WriterLoop();
  Status WriteFiles(Job& job);
  void Hand(std::unique_ptr<Job> j, bool work, Status status);
  Status Commit();
  Status PollDisk();
};

Checkpointer::Checkpointer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<Checkpointer>> Checkpointer::Create(Communicator* comm, Device* device, const CheckpointOptions& o) {
  return Create(comm, device, o, nullptr);
}

Result<std::unique_ptr<Checkpointer>> Checkpointer::Create(Communicator* comm, Device* device, const CheckpointOptions& o,
                                                           IoHooks* hooks) {
  if (comm == nullptr || device == nullptr) return InvalidArgumentError("checkpointer: null communicator or device");
  if (o.root.empty()) return InvalidArgumentError("checkpointer: empty root directory");
  if (!device->host_accessible()) {
    return InvalidArgumentError("checkpointer: staging device ", device->name(), " is not host memory (pass a CpuDevice, or a "
                                "HostMemory, which is pinned in CUDA builds; the engine's captures copy device state)");
  }
  if (o.chunk_elements < 1024 || o.chunk_elements % 1024 != 0) {
    return InvalidArgumentError("checkpointer: chunk_elements must be a positive multiple of 1024, got ", o.chunk_elements);
  }
  if (o.keep_last < 0 || o.keep_every < 0) return InvalidArgumentError("checkpointer: negative retention setting");
  if (o.writer_nice < -40 || o.writer_nice > 40) return InvalidArgumentError("checkpointer: writer_nice must be in [-40, 40], got ", o.writer_nice);
  if (o.writer_threads < 1 || o.writer_threads > 256) {
    return InvalidArgumentError("checkpointer: writer_threads must be in [1, 256], got ", o.writer_threads);
  }
  if (o.staging_budget_bytes < 0) return InvalidArgumentError("checkpointer: staging_budget_bytes must be >= 0 (0 = no bound)");
  auto impl = std::make_unique<Impl>();
  impl->comm = comm;
  impl->device = device;
  impl->o = o;
  ASSIGN_OR_RETURN(impl->io, IoEngine::Create(o.io, hooks), "checkpointer");
  if (o.writer_threads > 1) {
    impl->encoders = std::make_unique<ThreadPool>(o.writer_threads, "zrt-ckpt-enc", [nice = o.writer_nice] { AddNice(nice); });
  }
  Status s;
  if (comm->rank() == 0) s = RepairRoot(o.root, Retention{o.keep_last, o.keep_every}, *impl->io);
  RETURN_IF_ERROR(BroadcastStatus(comm, s, 0), "checkpointer start-up in ", o.root);
  if (o.memory) {
    ASSIGN_OR_RETURN(impl->tier, MemoryTier::Create(comm, o.root, *o.memory), "checkpointer");
  }
  impl->writer = std::thread([p = impl.get()] { p->WriterLoop(); });
  pthread_setname_np(impl->writer.native_handle(), "zrt-ckpt-write");
  return std::unique_ptr<Checkpointer>(new Checkpointer(std::move(impl)));
}

Checkpointer::~Checkpointer() {
  Impl& c = *impl_;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    c.stop = true;
    // A save still waiting for its state is abandoned (the owner's next Put fails, and it closes it).
    if (c.job && c.job->queue) c.job->queue->Stop(FailedPreconditionError("the checkpointer was destroyed before the save got its state"));
  }
  c.cv.notify_all();
  if (c.writer.joinable()) c.writer.join();  // the loop finishes a job in progress first
  if (c.pending) ZRT_LOG(kWarn) << "checkpoint of step " << c.stats.step << " was written but never committed (no Wait())";
}

void Checkpointer::Impl::WriterLoop() {
  AddNice(o.writer_nice);
  for (;;) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [this] { return has_work || stop; });
    if (!has_work) return;
    lock.unlock();
    const double t0 = SteadySeconds();
    Status s = WriteFiles(*job);
    if (!s.ok() && job->queue) job->queue->Stop(s);  // the owner stops putting (a failure after the shard's files too)
    lock.lock();
    job->write_seconds = SteadySeconds() - t0;
    work_status = std::move(s);
    has_work = false;
    work_done = true;
    cv.notify_all();
  }
}

Status Checkpointer::Impl::WriteFiles(Job& j) {
  const std::string ctx = "writing checkpoint step " + std::to_string(j.manifest.step);
  if (j.shard_rank >= 0) {
    ShardWriteStats ws;
    RETURN_IF_ERROR(WriteQueuedShard(*io, j.save.tmp, j.manifest, j.shard_rank, *j.queue, {o.compression, encoders.get(), j.part}, &ws, j.groups), ctx);
    j.stored_bytes = ws.stored_bytes;
  }
  if (comm->rank() == 0) RETURN_IF_ERROR(PublishFile(*io, j.save.tmp, kManifestFile, EncodeManifest(j.manifest)), ctx);
  return FsyncDir(j.save.tmp).WithContext(ctx);
}

// The job goes to the writer thread (`work`), or is done already with `status` (Commit agrees on it).
void Checkpointer::Impl::Hand(std::unique_ptr<Job> j, bool work, Status status) {
  {
    std::lock_guard<std::mutex> lock(mu);
    job = std::move(j);
    has_work = work;
    work_done = !work;
    work_status = std::move(status);
  }
  cv.notify_all();
  pending = true;
}

Status Checkpointer::SaveAsync(const StateView& state, const nlohmann::json& trainer_state) {
  Impl& c = *impl_;
  if (c.pending) RETURN_IF_ERROR(c.Commit(), "committing the previous checkpoint");
  // A complete checkpoint of this step is kept as it is (rank 0 looks; the others vote to skip).
  const bool exists = c.comm->rank() != 0 || fs::exists(c.o.root + "/" + StepDirName(state.counters.step));
  ASSIGN_OR_RETURN(internal::SnapshotStart start, internal::StartSnapshot(c.comm, state, trainer_state, c.o.chunk_elements, exists));
  const double t0 = SteadySeconds();  // the stall, from the agreement on (snapshot.h)
  c.stats = SaveStats{};
  c.stats.step = state.counters.step;
  if (start.skip) {
    ZRT_LOG(kInfo) << "checkpoint: step " << state.counters.step << " exists under " << c.o.root << "; not saved again";
    return Status();
  }
  auto job = std::make_unique<Impl::Job>();
  job->manifest = std::move(start.manifest);
  // Each shard is written once, spread over the ranks that hold it (its replicas: rank r holds shard
  // r % shards, core/state_view.h's numbering), each writing a part: the save's write bandwidth is
  // every rank's. Replicas hold the same bits (their gradients are reduced by collectives whose
  // result every rank shares), so which replica writes a chunk does not change the checkpoint.
  job->manifest.parts = std::min(kMaxParts, c.comm->size() / job->manifest.shards);
  const Manifest& m = job->manifest;
  job->save = SaveDirFor(c.o.root, m.step, m.nonce);
  job->part = c.comm->rank() / m.shards;
  job->shard_rank = job->part < m.parts ? c.comm->rank() % m.shards : -1;
  RETURN_IF_ERROR(BeginSave(job->save));
  if (job->shard_rank < 0) {  // nothing of this rank's is written: it takes part in the commit only
    c.Hand(std::move(job), false, Status());
    return Status();
  }
  ASSIGN_OR_RETURN(const std::vector<ShardLayout> layouts, SavedLayouts(m), "checkpoint step ", m.step);
  const PartPlan plan(m, layouts, job->shard_rank);
  c.stats.raw_bytes = plan.raw_bytes(job->part);
  // The queue takes the view's groups (in the manifest: start.groups), the file the manifest's.
  std::vector<std::vector<QueuedKind>> kinds = QueuedKinds(m, layouts), view_kinds;
  std::vector<std::vector<std::vector<char>>> keep = plan.Mask(job->part), view_keep;
  for (size_t g = 0; g < start.groups.size(); ++g) {
    view_kinds.push_back(kinds[static_cast<size_t>(start.groups[g])]);
    view_keep.push_back(keep[static_cast<size_t>(start.groups[g])]);
  }
  if (!start.groups.empty()) {
    kinds = std::move(view_kinds);
    keep = std::move(view_keep);
  }
  job->groups = start.groups;
  job->queue = std::make_shared<ChunkQueue>(std::move(kinds), m.chunk_elements, c.o.staging_budget_bytes, c.device, std::move(c.staging),
                                            std::move(keep));
  job->owner = state.owner;
  std::shared_ptr<ChunkQueue> queue = job->queue;
  c.Hand(std::move(job), true, Status());
  Result<double> stall = internal::HandOver(state, queue, t0);
  if (!stall.ok()) queue->Stop(stall.status().WithContext("checkpoint step " + std::to_string(m.step) + ": capturing the state"));
  c.stats.stall_seconds = stall.ok() ? *stall : SteadySeconds() - t0;
  return Status();  // a failed capture fails the save at its commit, on every rank
}

Status Checkpointer::SaveToMemory(const StateView& state, const nlohmann::json& trainer_state) {
  if (!impl_->tier) return FailedPreconditionError("checkpointer: no memory tier (set CheckpointOptions::memory)");
  return impl_->tier->Save(state, trainer_state);
}

Result<ResumeResult> Checkpointer::Resume(const StateView& target, const ResumeOptions& options) {
  return ckpt::Resume(impl_->comm, impl_->o, target, options);
}

// A failed memory-tier snapshot (agreed on every rank) never keeps a disk save from being committed.
Status Checkpointer::Wait() {
  const Status tier = impl_->tier ? impl_->tier->Wait() : Status();
  const Status disk = impl_->pending ? impl_->Commit() : Status();
  return disk.ok() ? tier : disk;
}

Status Checkpointer::Poll() {
  const Status tier = impl_->tier ? impl_->tier->Poll() : Status();
  const Status disk = impl_->PollDisk();
  return disk.ok() ? tier : disk;
}

Status Checkpointer::Impl::PollDisk() {
  if (!pending) return Status();  // the same on every rank: saves are collective
  float done = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    done = work_done ? 1.0f : 0.0f;
  }
  RETURN_IF_ERROR(comm->AllReduce(&done, &done, 1, DType::kF32, ReduceOp::kMin), "checkpoint poll");
  return done > 0 ? Commit() : Status();
}

Status Checkpointer::Impl::Commit() {
  pending = false;
  // A capture still owed (NVMe state waiting for the next step) is streamed now; its errors reach the writer.
  if (job->queue && !job->queue->closed() && job->owner != nullptr) (void)job->owner->Settle();
  Status local;
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [this] { return work_done; });
    local = work_status;
  }
  if (job->queue) {
    stats.stall_seconds += job->queue->waited();
    stats.staging_bytes = job->queue->peak_bytes();
    stats.encoded_elements = job->queue->encoded_elements();
    staging = job->queue->TakeBuffers();
  }
  stats.write_seconds = job->write_seconds;
  stats.stored_bytes = job->stored_bytes;
  RETURN_IF_ERROR(ckpt::Commit(comm, local, job->save, Retention{o.keep_last, o.keep_every}, *io));
  stats.dir = job->save.final;
  if (tier) tier->Supersede(job->manifest.step);
  return Status();
}

bool Checkpointer::in_flight() const { return impl_->pending; }

SaveStats Checkpointer::last_stats() const {
  SaveStats s = impl_->stats;
  if (impl_->pending && impl_->job && impl_->job->queue) s.stall_seconds += impl_->job->queue->waited();
  return s;
}

const MemoryTierStats* Checkpointer::memory_stats() const { return impl_->tier ? &impl_->tier->stats() : nullptr; }
const CheckpointOptions& Checkpointer::options() const { return impl_->o; }

void InstallPreemptionHandler() {
  struct sigaction sa {};
  sa.sa_handler = OnPreemptSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);
}

Result<bool> PreemptionRequested(Communicator* comm) {
  float f = static_cast<float>(g_preempted.load(std::memory_order_relaxed));
  RETURN_IF_ERROR(comm->AllReduce(&f, &f, 1, DType::kF32, ReduceOp::kMax), "preemption check");
  return f > 0;
}

}  // namespace zrt::ckpt
