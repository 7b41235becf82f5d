// Save protocol (crash-safe; see checkpointer.h and docs/checkpoint-format.md):
//   SaveAsync (collective)  rank 0 draws a nonce and broadcasts it; every rank snapshots its shards into
//                           reusable staging memory (4 KiB-aligned per buffer) and hands the job over.
//   writer thread (per rank) into ROOT/step-N.tmp-<nonce>/: WriteShard (shard_writer.h): chunks
//                           encoded (optional byte-grouping + zstd), xxh3-64 each, written through the
//                           IoEngine to rank-r.data.tmp, fsync, rename, then the rank's index;
//                           rank 0 writes manifest.json; fsync the directory. No collective here.
//   Commit (collective, at the next Wait/SaveAsync)
//                           ranks agree on success (one all-reduce); rank 0 re-reads the manifest and
//                           every index (they must exist and agree), renames the directory to
//                           ROOT/step-N (atomic), fsyncs ROOT, rewrites ROOT/latest, applies retention.
// A crash anywhere before the rename leaves only the .tmp directory: never taken for complete,
// removed by the next Create. The previous complete checkpoint is never touched by a save.
#include "zrt/checkpoint/checkpointer.h"

#include <csignal>
#include <cstring>
#include <chrono>
#include <filesystem>
#include <random>

#include "zrt/checkpoint/fs_util.h"
#include "zrt/checkpoint/reader.h"
#include "zrt/checkpoint/shard_writer.h"
#include "zrt/core/logging.h"
#include "zrt/core/version.h"

namespace zrt::ckpt {

namespace fs = std::filesystem;

namespace {

constexpr int64_t kAlign = static_cast<int64_t>(kIoAlignment);
int64_t AlignUp(int64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }
double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }


std::atomic<int> g_preempted{0};
void OnPreemptSignal(int) { g_preempted.store(1, std::memory_order_relaxed); }

}  // namespace

struct Checkpointer::Job {
  Manifest manifest;
  std::string tmp_dir, final_dir;
  int shard_rank = -1;  // -1: this rank holds no distinct shard (stage 0, rank > 0)
  struct Piece {
    int group, kind;
    const char* data;  // in staging_, or null: read through `read` (state not resident)
    int64_t elements;
    std::function<Status(int64_t offset, int64_t count, void* out)> read;
  };
  std::vector<Piece> pieces;
};

Checkpointer::Checkpointer(Communicator* comm, Device* device, const CheckpointOptions& o)
    : comm_(comm), device_(device), o_(o) {}

Result<std::unique_ptr<Checkpointer>> Checkpointer::Create(Communicator* comm, Device* device, const CheckpointOptions& o) {
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
  std::unique_ptr<Checkpointer> c(new Checkpointer(comm, device, o));
  ASSIGN_OR_RETURN(c->io_, IoEngine::Create(o.io), "checkpointer");
  Status s;
  if (comm->rank() == 0) {
    s = MakeDirs(o.root);
    // Leftovers of saves that died: .tmp directories and half-written pointer files.
    std::error_code ec;
    if (s.ok()) {
      for (const auto& e : fs::directory_iterator(o.root, ec)) {
        const std::string name = e.path().filename().string();
        if (name.find(".tmp") != std::string::npos) {
          ZRT_LOG(kInfo) << "checkpoint: removing leftover of an interrupted save: " << e.path().string();
          s = RemoveTree(e.path().string());
          if (!s.ok()) break;
        }
      }
      if (ec) s = ErrnoStatus(ec.value(), "listing " + o.root);
    }
  }
  RETURN_IF_ERROR(BroadcastStatus(comm, s, 0), "checkpointer start-up in ", o.root);
  c->writer_ = std::thread([p = c.get()] { p->WriterLoop(); });
  pthread_setname_np(c->writer_.native_handle(), "zrt-ckpt-write");
  return c;
}

Checkpointer::~Checkpointer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (writer_.joinable()) writer_.join();  // the loop finishes a job in progress first
  if (pending_) ZRT_LOG(kWarn) << "checkpoint of step " << stats_.step << " was written but never committed (no Wait())";
}

Status Checkpointer::Fault(std::string_view op, const std::string& path) const {
#if defined(ZRT_FAULT_INJECTION)
  if (o_.fault) {
    if (const int err = o_.fault(op, path); err != 0) return ErrnoStatus(err, std::string(op) + " " + path);
  }
#else
  (void)op;
  (void)path;
#endif
  return Status();
}

void Checkpointer::WriterLoop() {
  for (;;) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return has_work_ || stop_; });
    if (!has_work_) return;
    lock.unlock();
    const double t0 = Now();
    Status s = WriteFiles(*job_);
    lock.lock();
    stats_.write_seconds = Now() - t0;
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
  Manifest& m = job->manifest;
  // One broadcast from rank 0: the nonce (it ties the manifest and every index of this save together)
  // and whether a complete checkpoint of this step already exists (then it is kept as it is).
  char nonce[18] = {};
  if (comm_->rank() == 0) {
    std::random_device rd;
    std::snprintf(nonce, 17, "%08x%08x", rd(), static_cast<unsigned>(std::time(nullptr)));
    nonce[17] = fs::exists(o_.root + "/" + StepDirName(state.step)) ? 1 : 0;
  }
  RETURN_IF_ERROR(comm_->Broadcast(nonce, sizeof(nonce), DType::kBytes, 0), "checkpoint nonce");
  const bool skip = nonce[17] != 0;
  nonce[17] = 0;
  m.nonce = nonce;
  m.step = state.step;
  m.world_size = state.world_size;
  m.stage = state.stage;
  m.zrt_version = std::string(Version());
  m.created_unix = static_cast<int64_t>(std::time(nullptr));
  m.chunk_elements = o_.chunk_elements;
  m.loss_scale = state.loss_scale;
  m.scaler_good_steps = state.scaler_good_steps;
  m.scaler_hysteresis_left = state.scaler_hysteresis_left;
  m.trainer_state = trainer_state;
  m.shards = state.groups.empty() ? state.world_size : state.groups[0].layout.world_size();
  for (const StateGroup& g : state.groups) {
    if (g.layout.world_size() != m.shards) return InvalidArgumentError("checkpoint: groups sharded over different world sizes");
    GroupEntry ge;
    ge.name = g.name;
    ge.lr = g.lr;
    ge.weight_decay = g.weight_decay;
    ge.alignment = g.layout.alignment();
    for (size_t t = 0; t < g.tensors.size(); ++t) {
      ge.tensors.push_back({g.tensors[t].name, g.tensors[t].shape, g.tensors[t].dtype,
                            g.layout.tensor_offset(static_cast<int64_t>(t)), g.tensors[t].numel()});
    }
    for (const StateBuffer& b : g.buffers) ge.kinds.push_back(b.kind);
    m.groups.push_back(std::move(ge));
  }
  const std::string name = StepDirName(m.step);
  job->final_dir = o_.root + "/" + name;
  job->tmp_dir = o_.root + "/" + name + ".tmp-" + m.nonce;
  job->shard_rank = m.shards == 1 ? (comm_->rank() == 0 ? 0 : -1) : comm_->rank();
  stats_ = SaveStats{};
  stats_.step = m.step;

  if (skip) {
    ZRT_LOG(kInfo) << "checkpoint: " << job->final_dir << " exists; not saving step " << m.step << " again";
    return Status();
  }
  RETURN_IF_ERROR(MakeDirs(job->tmp_dir), "checkpoint of step ", m.step);

  // Snapshot this rank's shards (the only part of the save training waits for): host state by memcpy,
  // device state by a device-to-host copy. State on NVMe (not resident, no snapshot) is not copied: it
  // is streamed from where it lives into the files now, before SaveAsync returns (the next step would
  // change it), through O(chunk) memory.
  bool streamed = false;
  if (job->shard_rank >= 0) {
    int64_t bytes = 0;
    for (const StateGroup& g : state.groups) {
      for (const StateBuffer& b : g.buffers) {
        if (b.resident() || b.snapshot) {
          bytes += AlignUp(b.count * static_cast<int64_t>(DTypeSize(b.dtype)));
        } else {
          streamed = true;
        }
      }
    }
    if (staging_.size() < static_cast<size_t>(bytes)) {
      staging_.Reset();
      ASSIGN_OR_RETURN(staging_, device_->Allocate(static_cast<size_t>(bytes), MemCategory::kStaging, kIoAlignment),
                       "checkpoint staging");
    }
    int64_t off = 0;
    for (size_t gi = 0; gi < state.groups.size(); ++gi) {
      const StateGroup& g = state.groups[gi];
      for (size_t k = 0; k < g.buffers.size(); ++k) {
        const StateBuffer& b = g.buffers[k];
        if (b.dtype != DType::kF32) return InvalidArgumentError("checkpoint: state '", b.kind, "' must be f32");
        const size_t nbytes = static_cast<size_t>(b.count) * 4;
        stats_.raw_bytes += static_cast<int64_t>(nbytes);
        if (!b.resident() && !b.read) {
          return InvalidArgumentError("checkpoint: state '", b.kind, "' of group '", g.name, "' is not resident and has no read");
        }
        if (!b.resident() && !b.snapshot) {
          job->pieces.push_back({static_cast<int>(gi), static_cast<int>(k), nullptr, b.count, b.read});
          continue;
        }
        if (nbytes != 0 && b.resident()) {
          std::memcpy(staging_.as<char>() + off, b.data, nbytes);
        } else if (nbytes != 0) {
          RETURN_IF_ERROR(b.read(0, b.count, staging_.as<char>() + off), "checkpoint: copying state '", b.kind, "' of group '",
                          g.name, "'");
        }
        job->pieces.push_back({static_cast<int>(gi), static_cast<int>(k), staging_.as<char>() + off, b.count, {}});
        off += AlignUp(static_cast<int64_t>(nbytes));
      }
    }
  }
  if (streamed) {
    const double tw = Now();
    Status s = WriteFiles(*job);
    stats_.write_seconds = Now() - tw;
    stats_.stall_seconds = Now() - t0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = std::move(job);
      work_status_ = std::move(s);
      work_done_ = true;  // Commit (at Wait or the next SaveAsync) agrees on it and renames, as usual
    }
    pending_ = true;
    return Status();
  }
  stats_.stall_seconds = Now() - t0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = std::move(job);
    has_work_ = true;
    work_done_ = false;
  }
  cv_.notify_all();
  pending_ = true;
  return Status();
}

Status Checkpointer::WriteFiles(Job& job) {
  const Manifest& m = job.manifest;
  const std::string ctx = "writing checkpoint step " + std::to_string(m.step);
  if (job.shard_rank >= 0) {
    std::vector<ShardPiece32> pieces;
    for (const Job::Piece& p : job.pieces) pieces.push_back({p.group, p.kind, reinterpret_cast<const float*>(p.data), p.elements, p.read});
    std::function<int(std::string_view, const std::string&)> fault;
#if defined(ZRT_FAULT_INJECTION)
    fault = o_.fault;
#endif
    ShardWriteStats ws;
    RETURN_IF_ERROR(WriteShard(*io_, job.tmp_dir, m, job.shard_rank, pieces, o_.compression, fault, &ws), ctx);
    stats_.stored_bytes = ws.stored_bytes;
  }
  if (comm_->rank() == 0) RETURN_IF_ERROR(WriteFileDurably(job.tmp_dir, std::string(kManifestFile), EncodeManifest(m)), ctx);
  return FsyncDir(job.tmp_dir).WithContext(ctx);
}

Status Checkpointer::Wait() {
  if (!pending_) return Status();
  return Commit();
}

Status Checkpointer::Commit() {
  pending_ = false;
  Status local;
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return work_done_; });
    local = work_status_;
  }
  Job& job = *job_;
  if (Status agreed = AgreeOnStatus(comm_, local); !agreed.ok()) {
    if (comm_->rank() == 0) (void)RemoveTree(job.tmp_dir).ok();
    if (!local.ok()) return agreed;
    return agreed.WithContext("checkpoint of step " + std::to_string(job.manifest.step));
  }
  Status s;
  if (comm_->rank() == 0) {
    auto commit = [&]() -> Status {
      // Everything must be there and agree before the directory gets its final name.
      std::vector<std::string> problems;
      RETURN_IF_ERROR(CheckComplete(job.tmp_dir, VerifyLevel::kMetadata, &problems));
      if (!problems.empty()) return DataLossError("checkpoint ", job.tmp_dir, " is incomplete: ", problems.front());
      RETURN_IF_ERROR(Fault("commit", job.final_dir));
      RETURN_IF_ERROR(RenamePath(job.tmp_dir, job.final_dir));
      RETURN_IF_ERROR(FsyncDir(o_.root));
      // The advisory pointer moves only now that the checkpoint is complete and durable.
      RETURN_IF_ERROR(WriteFileDurably(o_.root, std::string(kLatestFile), StepDirName(job.manifest.step) + "\n"));
      RETURN_IF_ERROR(FsyncDir(o_.root));
      return RemoveOld();
    };
    s = commit().WithContext("committing checkpoint step " + std::to_string(job.manifest.step));
    if (!s.ok() && fs::exists(job.tmp_dir)) (void)RemoveTree(job.tmp_dir).ok();
  }
  RETURN_IF_ERROR(BroadcastStatus(comm_, s, 0));
  stats_.dir = job.final_dir;
  return Status();
}

Status Checkpointer::RemoveOld() {
  if (o_.keep_last <= 0) return Status();
  std::vector<std::pair<int64_t, std::string>> steps;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(o_.root, ec)) {
    auto step = ParseStepDirName(e.path().filename().string());
    if (step.ok()) steps.emplace_back(*step, e.path().string());
  }
  if (ec) return ErrnoStatus(ec.value(), "listing " + o_.root);
  std::sort(steps.rbegin(), steps.rend());
  int kept_complete = 0;
  for (const auto& [step, dir] : steps) {
    std::vector<std::string> problems;
    const bool complete = CheckComplete(dir, VerifyLevel::kMetadata, &problems).ok() && problems.empty();
    if (!complete) continue;  // never delete what we cannot vouch for (or one being repaired by hand)
    const bool keep = kept_complete < o_.keep_last || (o_.keep_every > 0 && step % o_.keep_every == 0);
    if (kept_complete < o_.keep_last) ++kept_complete;
    if (!keep) {
      ZRT_LOG(kInfo) << "checkpoint retention: removing " << dir;
      RETURN_IF_ERROR(RemoveTree(dir));
    }
  }
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
