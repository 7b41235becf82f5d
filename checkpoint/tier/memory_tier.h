// The memory tier: every K steps each rank snapshots its state into node-local memory that outlives
// the process (tmpfs: /dev/shm) and sends a replica to a peer rank on another node, so a restart after
// a process kill or the loss of one node resumes from seconds-old state at memory speed instead of
// the last disk checkpoint (the idea of Gemini, SOSP'23, and of NVIDIA's local checkpoints). The disk
// tier (Checkpointer::SaveAsync) keeps its own cadence; Checkpointer::Resume takes the newest state
// any tier holds. docs/resume.md "Tiers" is the user's description.
//
// Layout (each snapshot is a checkpoint directory of the ordinary format holding one rank's files):
//   <dir>/zrt-tier-<hash of the checkpoint root>/rank-<r>/own/step-N/           rank r's snapshot
//                                                /replica-<q>/step-N/           rank q's, held by r
// A snapshot is written as step-N.tmp and renamed when whole. Generation N is committed (a collective
// at Poll/Wait/the next save) once every rank's own copy and replica are whole; only then are older
// generations deleted, so a kill at any instant leaves one generation every rank has.
//
// Placement: rank q's replica lives on rank (q + d) mod N, d = ranks_per_node when the job spans
// more than one node (so on another node), else d = 1 (the next rank: survives a process kill, not the
// node's loss). Where the state has live replicas (hybrid sharding, stage 0: each shard held by the
// R = N / S ranks with the same q % S) no replica is sent: the copies of the ranks holding a shard
// serve each other, rank q by the first rank q + k S (k = 1 .. R-1) whose copy is usable. A restart
// with another number of ranks or placement cannot use the tier (it is removed at start-up) and
// resumes from disk.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "zrt/checkpoint/load.h"
#include "zrt/checkpoint/options.h"
#include "zrt/core/communicator.h"
#include "zrt/core/state_view.h"

namespace zrt::ckpt {


// Used through the Checkpointer (CheckpointOptions::memory); internal (tests name its directories).
class MemoryTier {
 public:
  // Collective. Cleans what a killed run left: half-written snapshots, ranks the job no longer has,
  // replicas of ranks this rank no longer holds for. Keeps every whole generation (Resume needs them).
  static Result<std::unique_ptr<MemoryTier>> Create(Communicator* comm, const std::string& root, const MemoryTierOptions& o);
  // Removes this rank's files when no newer state than the last disk checkpoint is in them (the end of
  // a run); otherwise keeps them for the restart and says so.
  ~MemoryTier();

  // Collective: snapshot `state` (its counters and trainer_state as a disk checkpoint would) as
  // generation `state.counters.step`. Waits for the previous generation first (never two in flight).
  // A step every rank already holds is not snapshotted again.
  // One pass copies this rank's state into the tier, checksumming it chunk by chunk: in the
  // background when the state is host memory or device memory that may be read from another thread
  // (StateBuffer::concurrent_read: the engine's optimizer state on a GPU) and its owner can hold its
  // next change until the copy is done (StateView::hold: the engine's next Step waits there only for
  // what is left of it), else while training waits (frozen groups on a GPU, a view without hold). Where MPI allows a second thread
  // (MPI_THREAD_MULTIPLE, Communicator::concurrent_splits) that copy's thread then moves the replica
  // over a communicator of its own and seals both copies; else the replica's transfer starts at the
  // first Poll that finds every rank's copy whole (call Poll between the backward pass and Step at
  // K = 1: the transfer then overlaps the step) and the seals run in the background. Poll/Wait
  // commit the generation. State offloaded to NVMe (StateView::defer) is not read here: the owner's next step
  // hands it over as it streams it (or Wait/the next Save has it delivered at once), and the
  // replica's transfer starts at the first Poll after that step.
  Status Save(const StateView& state, const nlohmann::json& trainer_state = nlohmann::json::object());
  // Collective, once per step: progresses the replica transfer; commits a generation whose files are
  // whole on every rank (one small all-reduce while one is pending).
  Status Poll();
  // Collective: finishes and commits the pending generation.
  Status Wait();
  // A disk checkpoint of `step` is complete: generations older than it are removed (local; called by
  // the Checkpointer at every commit, on every rank alike).
  void Supersede(int64_t step);

  const MemoryTierStats& stats() const;
  // This rank's directory, and the job's: where the files are (tests emulate a node's loss by removing
  // a rank directory).
  static std::string JobDir(const std::string& root, const MemoryTierOptions& o);
  static std::string RankDir(const std::string& root, const MemoryTierOptions& o, int rank);

  MemoryTier(const MemoryTier&) = delete;
  MemoryTier& operator=(const MemoryTier&) = delete;

 private:
  struct Impl;
  explicit MemoryTier(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Resume's use of the tier (resume.cc). Collective: the generations every rank can restore (its own
// copy, or the replica its peer holds), newest first, agreed on every rank.
Result<std::vector<int64_t>> TierCandidates(Communicator* comm, const std::string& root, const MemoryTierOptions& o);
// Collective: loads generation `step` into `target` on every rank: its own copy, or (when that is gone
// or fails a check) the replica its peer holds, sent over `comm` and kept as the rank's own copy
// again. Returns this rank's outcome (the caller agrees on it); `dir` is the directory loaded,
// `from_peer` whether the replica served.
Result<LoadResult> LoadFromTier(Communicator* comm, const std::string& root, const MemoryTierOptions& o, int64_t step,
                                const StateView& target, const LoadOptions& load, std::string* dir, bool* from_peer);

}  // namespace zrt::ckpt
