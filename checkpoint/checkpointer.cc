// Save protocol (crash-safe; the commit steps are commit.h's, the format docs/checkpoint-format.md):
//   SaveAsync (collective)  rank 0 draws a nonce and broadcasts it; every rank snapshots its shards into
//                           reusable staging memory (4 KiB-aligned per buffer) and hands the job over;
//                           state on NVMe is deferred: the owner's next step hands it to the writer
//                           (ArrivingState) before changing it, or Commit has it delivered at once.
//   writer thread (per rank) into ROOT/step-N.tmp-<nonce>/: WriteShard (shard_writer.h): chunks
//                           encoded (optional byte-grouping + zstd), xxh3-64 each, written through the
//                           IoEngine to rank-r.data.tmp, fsync, rename, then the rank's index;
//                           rank 0 publishes manifest.json; fsync the directory. No collective here.
//   Commit (collective, at the first Poll after every rank's write finished, or Wait, or the next SaveAsync)
//                           commit.h: agree, check complete, rename to ROOT/step-N, fsync, `latest`,
//                           retention.
// A crash anywhere before the rename leaves only the .tmp directory: never taken for complete,
// removed by the next Create. The previous complete checkpoint is never touched by a save.
#include "zrt/checkpoint/checkpointer.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <chrono>
#include <filesystem>
#include <ctime>
#include <future>

#include "zrt/checkpoint/commit.h"
#include "zrt/checkpoint/format.h"
#include "zrt/checkpoint/fs_util.h"
#include "zrt/checkpoint/shard_writer.h"
#include "zrt/offload/io_engine.h"
#include "zrt/core/logging.h"
#include "zrt/core/version.h"

namespace zrt::ckpt {

namespace fs = std::filesystem;

namespace {

constexpr int64_t kAlign = static_cast<int64_t>(kIoAlignment);
int64_t AlignUp(int64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }
double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// The calling thread's nice value, raised by `nice` (Linux: per thread).
void AddNice(int nice) {
  if (nice == 0) return;
  const int now = getpriority(PRIO_PROCESS, static_cast<id_t>(gettid()));
  if (setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), std::clamp(now + nice, -20, 19)) != 0) {
    ZRT_LOG(kWarn) << "checkpoint writer: cannot change its priority by " << nice << ": " << std::strerror(errno);
  }
}

std::atomic<int> g_preempted{0};
void OnPreemptSignal(int) { g_preempted.store(1, std::memory_order_relaxed); }

}  // namespace

struct Checkpointer::Job {
  Manifest manifest;
  SaveDir save;
  int shard_rank = -1;  // -1: this rank holds no distinct shard (stage 0, rank > 0)
  // The shard as the writer sees it: resident buffers point into staging_, others keep their `read`
  // or arrive (deferred by the state's owner until its next step).
  ShardState state;
  std::shared_ptr<ArrivingState> arriving;  // null: nothing deferred
  std::function<Status()> deliver;          // the owner's StateView::deliver
  // The snapshot's copies into staging_ the writer makes before writing, when the owner holds its
  // next change until then (StateView::hold); empty: SaveAsync made them. `copied` is what the hold
  // waits for (if the job goes without setting it, the hold returns too).
  struct Copy {
    char* dst;
    StateBuffer from;
    std::string group;  // the error's context
  };
  std::vector<Copy> copies;
  std::promise<void> copied;
  // The writer's figures (SaveStats), kept here until the commit hands them to stats_: the training
  // thread may read stats_ (last_stats) while the writer works.
  double write_seconds = 0;
  int64_t stored_bytes = 0;
};

Checkpointer::Checkpointer(Communicator* comm, Device* device, const CheckpointOptions& o)
    : comm_(comm), device_(device), o_(o) {}

Result<std::unique_ptr<Checkpointer>> Checkpointer::Create(Communicator* comm, Device* device, const CheckpointOptions& o) {
  return Create(comm, device, o, nullptr);
}

Result<std::unique_ptr<Checkpointer>> Checkpointer::Create(Communicator* comm, Device* device, const CheckpointOptions& o,
                                                           IoHooks* hooks) {
  if (comm == nullptr || device == nullptr) return InvalidArgumentError("checkpointer: null communicator or device");
  if (o.root.empty()) return InvalidArgumentError("checkpointer: empty root directory");
  if (!device->host_accessible()) {
    return InvalidArgumentError("checkpointer: staging device ", device->name(), " is not host memory (pass a CpuDevice, or a "
                                "HostMemory, which is pinned in CUDA builds, and the engine's state view copies device state)");
  }
  if (o.chunk_elements < 1024 || o.chunk_elements % 1024 != 0) {
    return InvalidArgumentError("checkpointer: chunk_elements must be a positive multiple of 1024, got ", o.chunk_elements);
  }
  if (o.keep_last < 0 || o.keep_every < 0) return InvalidArgumentError("checkpointer: negative retention setting");
  if (o.writer_nice < -40 || o.writer_nice > 40) return InvalidArgumentError("checkpointer: writer_nice must be in [-40, 40], got ", o.writer_nice);
  if (o.writer_threads < 1 || o.writer_threads > 256) {
    return InvalidArgumentError("checkpointer: writer_threads must be in [1, 256], got ", o.writer_threads);
  }
  std::unique_ptr<Checkpointer> c(new Checkpointer(comm, device, o));
  ASSIGN_OR_RETURN(c->io_, IoEngine::Create(o.io, hooks), "checkpointer");
  if (o.writer_threads > 1) {
    c->encoders_ = std::make_unique<ThreadPool>(o.writer_threads, "zrt-ckpt-enc", [nice = o.writer_nice] { AddNice(nice); });
  }
  Status s;
  if (comm->rank() == 0) s = RepairRoot(o.root, Retention{o.keep_last, o.keep_every}, *c->io_);
  RETURN_IF_ERROR(BroadcastStatus(comm, s, 0), "checkpointer start-up in ", o.root);
  if (o.memory) {
    ASSIGN_OR_RETURN(c->tier_, MemoryTier::Create(comm, o.root, *o.memory), "checkpointer");
  }
  c->writer_ = std::thread([p = c.get()] { p->WriterLoop(); });
  pthread_setname_np(c->writer_.native_handle(), "zrt-ckpt-write");
  return c;
}

Checkpointer::~Checkpointer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    // A save still waiting for the owner's next step is abandoned (the owner drops it unread).
    if (job_ && job_->arriving) job_->arriving->Stop(FailedPreconditionError("the checkpointer was destroyed before the save got its state"));
  }
  cv_.notify_all();
  if (writer_.joinable()) writer_.join();  // the loop finishes a job in progress first
  if (pending_) ZRT_LOG(kWarn) << "checkpoint of step " << stats_.step << " was written but never committed (no Wait())";
}

void Checkpointer::WriterLoop() {
  AddNice(o_.writer_nice);
  for (;;) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return has_work_ || stop_; });
    if (!has_work_) return;
    lock.unlock();
    const double t0 = Now();
    Status s = CopySnapshot(*job_);
    if (s.ok()) s = WriteFiles(*job_);
    lock.lock();
    job_->write_seconds = Now() - t0;
    work_status_ = std::move(s);
    has_work_ = false;
    work_done_ = true;
    cv_.notify_all();
  }
}

Status Checkpointer::SaveAsync(const StateView& state, const nlohmann::json& trainer_state) {
  if (pending_) RETURN_IF_ERROR(Commit(), "committing the previous checkpoint");
  const double t0 = Now();
  auto job = std::make_unique<Job>();
  // One broadcast from rank 0: the nonce (it ties the manifest and every index of this save together)
  // and whether a complete checkpoint of this step already exists (then it is kept as it is).
  char nonce[18] = {};
  if (comm_->rank() == 0) {
    std::snprintf(nonce, 17, "%s", NewNonce().c_str());
    nonce[17] = fs::exists(o_.root + "/" + StepDirName(state.counters.step)) ? 1 : 0;
  }
  RETURN_IF_ERROR(comm_->Broadcast(nonce, sizeof(nonce), DType::kBytes, 0), "checkpoint nonce");
  const bool skip = nonce[17] != 0;
  nonce[17] = 0;
  ASSIGN_OR_RETURN(job->manifest, ManifestFor(state, trainer_state, o_.chunk_elements, nonce));
  const Manifest& m = job->manifest;
  job->save = SaveDirFor(o_.root, m.step, m.nonce);
  job->shard_rank = m.shards == 1 ? (comm_->rank() == 0 ? 0 : -1) : comm_->rank();
  stats_ = SaveStats{};
  stats_.step = m.step;

  if (skip) {
    ZRT_LOG(kInfo) << "checkpoint: " << job->save.final << " exists; not saving step " << m.step << " again";
    return Status();
  }
  RETURN_IF_ERROR(BeginSave(job->save));

  // Snapshot this rank's shards (the only part of the save training may wait for): host state by
  // memcpy, device state by a device-to-host copy, on the writer thread before it writes when the
  // owner holds its next change until then (StateView::hold) and every buffer may be copied there,
  // else here. State on NVMe (not resident, no snapshot) is not copied:
  // when its owner can defer it, the owner's next step hands it to the writer sub-group by sub-group
  // before updating it (the step reads it into host memory anyway); otherwise it is streamed from
  // where it lives into the files now, before SaveAsync returns, through O(chunk) memory.
  const bool defer = state.defer && state.deliver;
  std::vector<std::vector<int64_t>> deferred;  // per group and buffer: elements that arrive
  bool streamed = false, arrives = false, copyable = true;  // copyable: on another thread
  if (job->shard_rank >= 0) {
    int64_t bytes = 0;
    for (const StateGroup& g : state.groups) {
      for (const StateBuffer& b : g.buffers) {
        if (b.resident() || b.snapshot) {
          bytes += AlignUp(b.count * static_cast<int64_t>(DTypeSize(b.dtype)));
          copyable = copyable && b.copyable_anywhere();
        } else {
          streamed = !defer;
          arrives = defer;
        }
      }
    }
    const bool background = copyable && !streamed && !arrives && state.hold && state.settle;
    if (staging_.size() < static_cast<size_t>(bytes)) {
      staging_.Reset();
      ASSIGN_OR_RETURN(staging_, device_->Allocate(static_cast<size_t>(bytes), MemCategory::kStaging, kIoAlignment),
                       "checkpoint staging");
    }
    int64_t off = 0;
    for (const StateGroup& g : state.groups) {
      std::vector<StateBuffer>& staged = job->state.emplace_back();
      std::vector<int64_t>& arrive = deferred.emplace_back();
      for (const StateBuffer& b : g.buffers) {
        const size_t nbytes = static_cast<size_t>(b.count) * 4;
        stats_.raw_bytes += static_cast<int64_t>(nbytes);
        arrive.push_back(0);
        if (!b.resident() && !b.read && !defer) {
          return InvalidArgumentError("checkpoint: state '", b.kind, "' of group '", g.name, "' is not resident and has no read");
        }
        if (!b.resident() && !b.snapshot) {  // deferred (arrives), or streamed from where it lives
          if (defer) arrive.back() = b.count;
          staged.push_back({b.kind, DType::kF32, nullptr, b.count, defer ? nullptr : b.read, {}});
          continue;
        }
        char* dst = staging_.as<char>() + off;
        if (background) {
          if (nbytes != 0) job->copies.push_back({dst, b, g.name});
        } else if (nbytes != 0 && b.resident()) {
          std::memcpy(dst, b.data, nbytes);
        } else if (nbytes != 0) {
          RETURN_IF_ERROR(b.read(0, b.count, dst), "checkpoint: copying state '", b.kind, "' of group '", g.name, "'");
        }
        staged.push_back({b.kind, DType::kF32, dst, b.count});
        off += AlignUp(static_cast<int64_t>(nbytes));
      }
    }
    if (!job->copies.empty()) {
      state.hold([done = job->copied.get_future().share(), held = held_, stalled = state.stalled] {
        const double w0 = Now();
        done.wait();
        const double waited = Now() - w0;
        held->fetch_add(waited);
        if (stalled) stalled(waited);
      });
    }
  }
  if (streamed) {
    const double tw = Now();
    Status s = WriteFiles(*job);
    job->write_seconds = Now() - tw;
    stats_.stall_seconds = Now() - t0;
    if (state.stalled) state.stalled(stats_.stall_seconds);
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = std::move(job);
      work_status_ = std::move(s);
      work_done_ = true;  // Commit (at Wait or the next SaveAsync) agrees on it and renames, as usual
    }
    pending_ = true;
    return Status();
  }
  Status deferring;
  if (arrives) {
    job->arriving = std::make_shared<ArrivingState>(deferred, o_.chunk_elements);
    job->deliver = state.deliver;
    deferring = state.defer(job->arriving);
    if (!deferring.ok()) job->arriving.reset();  // nothing will arrive: Commit has nothing to deliver
  }
  stats_.stall_seconds = Now() - t0;
  if (state.stalled) state.stalled(stats_.stall_seconds);
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = std::move(job);
    has_work_ = deferring.ok();
    work_done_ = !deferring.ok();  // a refused deferral fails the save when it is committed
    work_status_ = deferring.WithContext("checkpoint step " + std::to_string(stats_.step) + ": handing the state over");
  }
  cv_.notify_all();
  pending_ = true;
  return Status();
}

// On the writer thread: the copies SaveAsync left to it (the owner waits for them at its hold).
Status Checkpointer::CopySnapshot(Job& job) {
  if (job.copies.empty()) return Status();
  Status s;
  for (const Job::Copy& c : job.copies) {
    if (c.from.data != nullptr) {
      std::memcpy(c.dst, c.from.data, static_cast<size_t>(c.from.count) * 4);
    } else if (!(s = c.from.read(0, c.from.count, c.dst)).ok()) {
      s = std::move(s).WithContext("checkpoint: copying state '" + c.from.kind + "' of group '" + c.group + "'");
      break;
    }
  }
  job.copies.clear();
  job.copied.set_value();
  return s;
}

Status Checkpointer::WriteFiles(Job& job) {
  const Manifest& m = job.manifest;
  const std::string ctx = "writing checkpoint step " + std::to_string(m.step);
  if (job.shard_rank >= 0) {
    ShardWriteStats ws;
    RETURN_IF_ERROR(WriteShard(*io_, job.save.tmp, m, job.shard_rank, job.state, {o_.compression, encoders_.get(), job.arriving.get()}, &ws), ctx);
    job.stored_bytes = ws.stored_bytes;
  }
  if (comm_->rank() == 0) RETURN_IF_ERROR(PublishFile(*io_, job.save.tmp, kManifestFile, EncodeManifest(m)), ctx);
  return FsyncDir(job.save.tmp).WithContext(ctx);
}

Status Checkpointer::SaveToMemory(const StateView& state, const nlohmann::json& trainer_state) {
  if (!tier_) return FailedPreconditionError("checkpointer: no memory tier (set CheckpointOptions::memory)");
  return tier_->Save(state, trainer_state);
}

Result<ResumeResult> Checkpointer::Resume(const StateView& target, ResumeOptions options) {
  options.memory = o_.memory;
  return ckpt::Resume(comm_, o_.root, target, options);
}

// A failed memory-tier snapshot (agreed on every rank) never keeps a disk save from being committed.
Status Checkpointer::Wait() {
  const Status tier = tier_ ? tier_->Wait() : Status();
  const Status disk = pending_ ? Commit() : Status();
  return disk.ok() ? tier : disk;
}

Status Checkpointer::Poll() {
  const Status tier = tier_ ? tier_->Poll() : Status();
  const Status disk = PollDisk();
  return disk.ok() ? tier : disk;
}

Status Checkpointer::PollDisk() {
  if (!pending_) return Status();  // the same on every rank: saves are collective
  float done = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    done = work_done_ ? 1.0f : 0.0f;
  }
  RETURN_IF_ERROR(comm_->AllReduce(&done, &done, 1, DType::kF32, ReduceOp::kMin), "checkpoint poll");
  return done > 0 ? Commit() : Status();
}

Status Checkpointer::Commit() {
  pending_ = false;
  // A save still waiting for the owner's next step takes the state now (its errors reach the writer).
  if (job_->arriving && !job_->arriving->closed()) (void)job_->deliver();
  Status local;
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return work_done_; });
    local = work_status_;
  }
  stats_.stall_seconds += held_->exchange(0.0);
  stats_.write_seconds = job_->write_seconds;
  stats_.stored_bytes = job_->stored_bytes;
  RETURN_IF_ERROR(ckpt::Commit(comm_, local, job_->save, Retention{o_.keep_last, o_.keep_every}, *io_));
  stats_.dir = job_->save.final;
  if (tier_) tier_->Supersede(job_->manifest.step);
  return Status();
}

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
