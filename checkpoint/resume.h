// Resuming a job in one collective call: the newest checkpoint under a root that every rank can
// load, with fallback to older ones (../shared/DESIGN.md "Checkpoints" 8).
//
//   auto r = ckpt::Resume(comm, root, engine->state_view());
//   if (r.ok()) { ... r->loaded.trainer_state ... }           // the engine is restored
//   else if (r.status().code() == StatusCode::kNotFound) ... // nothing to resume: a fresh start
//   else return r.status();                                  // every rank gets the same error
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "zrt/checkpoint/load.h"
#include "zrt/checkpoint/tier/memory_tier.h"
#include "zrt/core/communicator.h"
#include "zrt/core/state_view.h"

namespace zrt::ckpt {

struct ResumeOptions {
  LoadOptions load;  // strictness, params_only, the I/O engine
  // The memory tier to look in too (the Checkpointer's CheckpointOptions::memory; Checkpointer::Resume
  // passes it). Its generations come before disk checkpoints of the same or an older step.
  std::optional<MemoryTierOptions> memory;
};

struct ResumeResult {
  std::string dir;                   // the checkpoint loaded (a memory-tier generation: this rank's copy)
  // Where this rank's state came from: "disk", "memory" (its own copy in the memory tier) or "peer"
  // (the replica its peer held; now its own copy again).
  std::string source;
  int64_t step = -1;
  LoadResult loaded;                 // its counters, trainer state, and (not strict) what did not match
  std::vector<std::string> skipped;  // newer checkpoints that could not be loaded, each "<dir>: <why>"
};

// Collective over `comm` (the job's ranks; the same root on every rank). With options.memory, the
// memory tier's generations every rank can restore (own copy or peer's replica) are tried first,
// newest first, ahead of disk checkpoints of the same or an older step (memory_tier.h). Rank 0 lists the complete
// checkpoints under `root` (metadata level) and every rank gets that list; then, newest first, every
// rank loads its shards into `target` (each chunk it reads checked) and the ranks agree on the
// outcome: on a failure on any rank (a corrupt chunk, a shape that differs, a file gone) every rank
// moves on to the next older checkpoint, and the reason is logged and listed in `skipped`. After a
// load every rank agrees on, target.restore(saved counters) runs (the engine's Restore).
// Returns, on every rank alike: the loaded checkpoint; NotFound when the root holds no complete
// checkpoint (the target is untouched: a fresh start); DataLoss when none could be loaded (the
// target's buffers may be partly overwritten: do not train from them).
Result<ResumeResult> Resume(Communicator* comm, const std::string& root, const StateView& target, const ResumeOptions& options = {});

}  // namespace zrt::ckpt
