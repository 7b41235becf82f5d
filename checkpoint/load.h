// Loading this rank's state from a checkpoint saved by any number of ranks at any stage (reshard on
// load). Load reads only the chunks that overlap this rank's new shard, verifies each chunk's
// checksum, decompresses, and copies the overlapping elements; no collective communication (every
// rank loads independently). Tensors are matched by name, so the grouping and alignment may differ.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "zrt/checkpoint/options.h"
#include "zrt/core/communicator.h"
#include "zrt/core/state_view.h"
#include "zrt/offload/io_options.h"

namespace zrt::ckpt {

struct LoadOptions {
  bool params_only = false;  // load fp32 master weights only; moments start at zero (fine-tuning)
  // Strict (the default, like torch's load_state_dict(strict=True)): every target tensor and state kind
  // must be in the checkpoint with the same dtype, and every checkpoint tensor in the target. Not
  // strict: what is missing starts at zero and what is extra is ignored, each listed in LoadResult.
  // A shape that differs is an error either way.
  bool strict = true;
  IoOptions io;
  // Chunks read asynchronously ahead of the fill, at most this many bytes (0: one at a time). A restart
  // at the same layout reads straight into the state instead (16 reads in flight) and needs none.
  int64_t read_ahead_bytes = int64_t{32} << 20;
};

struct LoadResult {
  StateCounters counters;  // the saved step and loss scaler state (StateView::restore takes them)
  nlohmann::json trainer_state;
  int saved_world_size = 1;
  int saved_stage = 0;
  int64_t bytes_read = 0;
  // Not strict: what did not match ("tensor 'w' (exp_avg)", "tensor 'b': bf16 in the checkpoint, f32 here").
  std::vector<std::string> missing;     // in the target, not in the checkpoint: zero
  std::vector<std::string> unexpected;  // in the checkpoint, not in the target: ignored
  std::vector<std::string> mismatched;  // a dtype that differs: loaded (the state is fp32 either way)
};

// Fills `target`'s buffers (this rank's shards) from the checkpoint in `dir`, reading only the
// chunks that overlap this rank's new shard, each checked. Local: no communication (ckpt::Resume is
// the collective, agreed form). Errors name the file, chunk and tensor; on error the target buffers
// may be partly written (the engine must not step).
Result<LoadResult> Load(const std::string& dir, const StateView& target, const LoadOptions& options = {});


// Resuming a job in one collective call, the one way in: the newest state any tier holds (the memory
// tier, when CheckpointOptions::memory is set, then the disk checkpoints under the root) that every
// rank can load, with fallback to older ones (../shared/DESIGN.md "Checkpoints" 8).
// Checkpointer::Resume is this call with the checkpointer's options.
//
//   auto r = ckpt::Resume(comm, checkpoint_options, engine->state_view());
//   if (r.ok()) { ... r->loaded.trainer_state ... }           // the engine is restored
//   else if (r.status().code() == StatusCode::kNotFound) ... // nothing to resume: a fresh start
//   else return r.status();                                  // every rank gets the same error
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
