// Resuming a job in one collective call, the one way in: the newest state any tier holds (the memory
// tier, when CheckpointOptions::memory is set, then the disk checkpoints under the root) that every
// rank can load, with fallback to older ones (../shared/DESIGN.md "Checkpoints" 8).
// Checkpointer::Resume is this call with the checkpointer's options.
//
//   auto r = ckpt::Resume(comm, checkpoint_options, engine->state_view());
//   if (r.ok()) { ... r->loaded.trainer_state ... }           // the engine is restored
//   else if (r.status().code() == StatusCode::kNotFound) ... // nothing to resume: a fresh start
//   else return r.status();                                  // every rank gets the same error
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "zrt/checkpoint/load.h"
#include "zrt/checkpoint/options.h"
#include "zrt/core/communicator.h"
#include "zrt/core/state_view.h"

namespace zrt::ckpt {

struct ResumeOptions {
  LoadOptions load;  // strictness, params_only, the I/O engine
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

// Collective over `comm` (the job's ranks; the same options on every rank). The candidates, newest
// first: the memory tier's generations every rank can restore (own copy or a peer's replica;
// where.memory set), each ahead of a disk checkpoint of the same step; then the step directories under
// where.root, listed by name (rank 0's list, broadcast). Each candidate is checked only when it is
// reached (a disk one: complete, by rank 0, at metadata level; its chunks as they are read), then
// every rank loads its shards into `target` and the ranks agree on the outcome: on a failure on any
// rank (a corrupt chunk, a file gone) every rank moves on to the next older one, the reason logged
// and listed in `skipped`; the walk stops at the first one every rank loaded, and target.Restore
// (the engine's) runs with its counters. A configuration mistake (a tensor or shape the model does not
// have: InvalidArgument, NotFound) ends the walk at once on every rank with that error: no older
// checkpoint of the same run would fit either.
// Returns, on every rank alike: the loaded checkpoint; NotFound when there is nothing to resume (the
// target is untouched: a fresh start); DataLoss when none could be loaded (the target's buffers may be
// partly overwritten: do not train from them).
Result<ResumeResult> Resume(Communicator* comm, const CheckpointOptions& where, const StateView& target, const ResumeOptions& options = {});

}  // namespace zrt::ckpt
