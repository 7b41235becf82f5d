// Checkpointer: asynchronous, sharded, checksummed, crash-safe saves (../shared/DESIGN.md
// "Checkpoints"; the on-disk format is docs/checkpoint-format.md).
//
//   auto ck = Checkpointer::Create(comm, host, {.root = "/ckpt"});   // collective; repairs the root
//   ck->SaveAsync(engine->state_view(), trainer_state);  // collective; stalls only for the snapshot
//   ... training continues while a background thread compresses, checksums and writes ...
//   ck->Poll();  // collective, once per step: commits as soon as every rank's write is durable
//   ck->Wait();  // collective; commits now: the checkpoint becomes complete, `latest` moves, retention runs
//
// `host` is where the snapshot is staged: host memory (a CpuDevice, or a HostMemory, pinned in CUDA
// builds so device-to-host copies run at full speed). The state is copied into it by the writer
// thread when its owner holds its next change until the copy is done (StateView::hold: the engine's
// next Step waits there only for what is left of the copy) and every buffer is host memory or may be
// read from another thread (StateBuffer::concurrent_read); otherwise by SaveAsync, while training waits.
// State on NVMe is not copied: the owner's next step hands it to the writer before changing it
// (StateView::defer; docs/resume.md "Saving NVMe-offloaded state"); a Wait() or SaveAsync before that
// step has it streamed at once.
//
// Create repairs the root (commit.h RepairRoot: dead saves and deletions removed, `latest` and
// retention brought up to date after a kill). Policy for a SaveAsync while a save is in flight: it first waits for and commits that save (never
// two in flight, never a skipped request). A save of a step that already has a complete checkpoint
// is dropped (the existing one is kept: it cannot be replaced without a window where neither is whole).
//
// Errors: a failed background write is returned by the Wait()/SaveAsync() that commits it, on every
// rank (the same message: the failing rank's, or "failed on rank r"). The previous complete
// checkpoint is untouched. Thread-safety: one thread at a time (the trainer's); the writer thread
// does no collective communication.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "zrt/checkpoint/compression.h"
#include "zrt/checkpoint/tier/memory_tier.h"
#include "zrt/checkpoint/resume.h"
#include "zrt/core/communicator.h"
#include "zrt/core/device.h"
#include "zrt/core/state_view.h"
#include "zrt/offload/io_options.h"

namespace zrt {
class IoEngine;
class IoHooks;
class ThreadPool;
}  // namespace zrt

namespace zrt::ckpt {

namespace internal {
struct CheckpointerTesting;  // tests/support/checkpointer_testing.h: fault injection through IoHooks
}  // namespace internal

struct CheckpointOptions {
  std::string root;
  CompressOptions compression;
  int64_t chunk_elements = 1 << 20;  // elements per chunk (the unit of checksums and partial reads)
  int keep_last = 0;                 // retention: keep the newest K complete checkpoints (0: keep all)
  int64_t keep_every = 0;            // ... and also every step that is a multiple of this (0: none)
  IoOptions io;
  // Added to the nice value of the background writer thread (Linux per-thread priority): 10 lets
  // training's threads run first when cores are short, at the cost of a longer write. 0: unchanged.
  int writer_nice = 0;
  // Threads per rank that encode (compress) and checksum chunks: 1, the writer thread itself; N > 1, N
  // encoder threads beside it (the writer then only issues the I/O). More than 1 pays with
  // compression on (zstd runs at a few hundred MB/s per core); the files are the same either way.
  int writer_threads = 1;
  // The memory tier (memory_tier.h): when set, SaveToMemory snapshots into node-local memory with a
  // replica on a peer, and Resume looks there first.
  std::optional<MemoryTierOptions> memory;
};

struct SaveStats {
  int64_t step = -1;
  double stall_seconds = 0;       // what training waited for: SaveAsync (its snapshot when copied there)
                                  // and the owner's hold for a copy in the background, which happens at
                                  // the next step (the engine's step metric checkpoint_stall has both)
  double write_seconds = 0;       // background: encode + write + fsync of this rank's files (a save of
                                  // NVMe state: from SaveAsync, waiting for the step that hands it over);
                                  // known at the commit, as stored_bytes
  int64_t raw_bytes = 0;          // this rank's state bytes
  int64_t stored_bytes = 0;       // after compression
  std::string dir;                // the committed directory (empty if not committed)
};

class Checkpointer {
 public:
  static Result<std::unique_ptr<Checkpointer>> Create(Communicator* comm, Device* device, const CheckpointOptions& o);
  // Waits for a write in flight (without committing: that needs all ranks; the save stays a .tmp
  // directory, removed by the next Create).
  ~Checkpointer();

  Status SaveAsync(const StateView& state, const nlohmann::json& trainer_state = nlohmann::json::object());
  // Collective: a memory-tier snapshot of `state` (CheckpointOptions::memory must be set), typically
  // every step or few; the disk saves keep their own cadence. Training waits for the copy into the
  // tier; Poll commits it.
  Status SaveToMemory(const StateView& state, const nlohmann::json& trainer_state = nlohmann::json::object());
  // Collective: ckpt::Resume over this root and, when configured, the memory tier first.
  Result<ResumeResult> Resume(const StateView& target, ResumeOptions options = {});
  // Collective. While a save is pending: one small all-reduce, and the commit once every rank's write
  // finished (so a job killed after that loses nothing); otherwise nothing. The same for a memory-tier
  // snapshot. Call it once per step.
  Status Poll();
  // Collective: waits for the pending save's writes (disk and memory tier) and commits them.
  Status Wait();
  bool in_flight() const { return pending_; }
  // The last save's figures; while it is pending, stall_seconds includes what the owner has waited at
  // its hold so far (read it before the next SaveAsync, or after Wait, for the whole of it).
  SaveStats last_stats() const {
    SaveStats s = stats_;
    if (pending_) s.stall_seconds += held_->load();
    return s;
  }
  // The memory tier's figures; null without one.
  const MemoryTierStats* memory_stats() const { return tier_ ? &tier_->stats() : nullptr; }
  const CheckpointOptions& options() const { return o_; }

 private:
  friend struct internal::CheckpointerTesting;
  struct Job;
  Checkpointer(Communicator* comm, Device* device, const CheckpointOptions& o);
  // `hooks` (tests only) inject I/O and durability failures.
  static Result<std::unique_ptr<Checkpointer>> Create(Communicator* comm, Device* device, const CheckpointOptions& o,
                                                      IoHooks* hooks);
  Status Commit();
  Status PollDisk();
  void WriterLoop();
  Status CopySnapshot(Job& job);
  Status WriteFiles(Job& job);

  Communicator* comm_;
  Device* device_;
  CheckpointOptions o_;
  std::unique_ptr<IoEngine> io_;
  std::unique_ptr<ThreadPool> encoders_;  // writer_threads of them; null for 1
  std::unique_ptr<MemoryTier> tier_;
  DeviceBuffer staging_;  // reused: this rank's shards, snapshotted
  std::unique_ptr<Job> job_;
  bool pending_ = false;  // a save awaits commit
  SaveStats stats_;
  // What owners waited at StateView::hold for the writer's copies (shared: a hold may run after this
  // checkpointer is gone).
  std::shared_ptr<std::atomic<double>> held_ = std::make_shared<std::atomic<double>>(0.0);

  std::mutex mu_;
  std::condition_variable cv_;
  bool has_work_ = false, work_done_ = false, stop_ = false;
  Status work_status_;
  std::thread writer_;
};

// Preemption: after InstallPreemptionHandler(), SIGTERM or SIGUSR1 sets a process-wide flag (the one
// piece of global state a signal handler needs). PreemptionRequested is collective: true on every
// rank if any rank got the signal, so all take the final checkpoint at the same step boundary.
void InstallPreemptionHandler();
Result<bool> PreemptionRequested(Communicator* comm);

}  // namespace zrt::ckpt
