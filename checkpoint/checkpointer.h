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
// builds so device-to-host copies run at full speed); it must outlive the checkpointer. A save is a
// capture of the view (core/state_view.h): the owner streams its state into chunk buffers on a
// thread of its own (state on NVMe: as its next step streams it through host memory), a writer thread
// writes each chunk as it fills, and the owner's next change of a part waits only for that part to be
// copied. CheckpointOptions::staging_budget_bytes bounds the chunk buffers (by default the whole state
// may be staged, so the copy runs at memory speed); with a budget the owner's next change runs at the
// writer's pace at worst. A Wait() or SaveAsync before that step has NVMe state streamed at once.
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

#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "zrt/checkpoint/options.h"
#include "zrt/checkpoint/load.h"
#include "zrt/core/communicator.h"
#include "zrt/core/device.h"
#include "zrt/core/state_view.h"

namespace zrt {
class IoHooks;
}  // namespace zrt

namespace zrt::ckpt {
class MemoryTier;
}  // namespace zrt::ckpt

namespace zrt::ckpt {

namespace internal {
struct CheckpointerTesting;  // tests/support/checkpointer_testing.h: fault injection through IoHooks
}  // namespace internal


struct SaveStats {
  int64_t step = -1;
  double stall_seconds = 0;       // what training waited for: SaveAsync (its snapshot when copied there)
                                  // and the owner's hold for a copy in the background, which happens at
                                  // the next step (the engine's step metric checkpoint_stall has both)
  double write_seconds = 0;       // background: encode + write + fsync of this rank's files (a save of
                                  // NVMe state: from SaveAsync, waiting for the step that hands it over);
                                  // known at the commit, as stored_bytes
  int64_t raw_bytes = 0;          // the state bytes this rank wrote (its part of its shard)
  int64_t stored_bytes = 0;       // after compression
  int64_t staging_bytes = 0;      // the most host memory the save staged the state in at once (at the commit),
                                  // in the form the checkpoint stores it (a q8 kind: ~1 byte per element)
  int64_t encoded_elements = 0;   // compact state the save received as f32 values and encoded itself (0
                                  // when the owner handed every compact part over as it keeps it)
  std::string dir;                // the committed directory (empty if not committed)
};

class Checkpointer {
 public:
  static Result<std::unique_ptr<Checkpointer>> Create(Communicator* comm, Device* device, const CheckpointOptions& o);
  // Waits for a write in flight (without committing: that needs all ranks; the save stays a .tmp
  // directory, removed by the next Create).
  ~Checkpointer();

  // Collective: a disk checkpoint of `state` (its counters and trainer_state); training waits only for
  // the capture to start and, later, for parts still being copied (see above). Commits the previous
  // save first.
  Status SaveAsync(const StateView& state, const nlohmann::json& trainer_state = nlohmann::json::object());
  // Collective: a memory-tier snapshot of `state` (CheckpointOptions::memory must be set), typically
  // every step or few; the disk saves keep their own cadence. Training waits for the copy into the
  // tier; Poll commits it.
  Status SaveToMemory(const StateView& state, const nlohmann::json& trainer_state = nlohmann::json::object());
  // Collective: ckpt::Resume with this checkpointer's options (its root and, when set, its memory tier).
  Result<ResumeResult> Resume(const StateView& target, const ResumeOptions& options = {});
  // Collective. While a save is pending: one small all-reduce, and the commit once every rank's write
  // finished (so a job killed after that loses nothing); otherwise nothing. The same for a memory-tier
  // snapshot. Call it once per step.
  Status Poll();
  // Collective: waits for the pending save's writes (disk and memory tier) and commits them.
  Status Wait();
  bool in_flight() const;
  // The last save's figures; while it is pending, stall_seconds includes what the owner has waited for
  // its capture so far (read it before the next SaveAsync, or after Wait, for the whole of it).
  SaveStats last_stats() const;
  // The memory tier's figures; null without one.
  const MemoryTierStats* memory_stats() const;
  const CheckpointOptions& options() const;

 private:
  friend struct internal::CheckpointerTesting;
  struct Impl;
  explicit Checkpointer(std::unique_ptr<Impl> impl);
  // `hooks` (tests only) inject I/O and durability failures.
  static Result<std::unique_ptr<Checkpointer>> Create(Communicator* comm, Device* device, const CheckpointOptions& o,
                                                      IoHooks* hooks);
  std::unique_ptr<Impl> impl_;
};

// Preemption: after InstallPreemptionHandler(), SIGTERM or SIGUSR1 sets a process-wide flag (the one
// piece of global state a signal handler needs). PreemptionRequested is collective: true on every
// rank if any rank got the signal, so all take the final checkpoint at the same step boundary.
void InstallPreemptionHandler();
Result<bool> PreemptionRequested(Communicator* comm);

}  // namespace zrt::ckpt
