// The memory tier's directories (tier/memory_tier.h has the layout): where each rank's files and its
// peer's replica go, the generations a directory holds, the recycling of a removed generation's data
// file (its tmpfs pages stay allocated for the next snapshot), and the clean-up at start-up.
// Housekeeping only: no protocol, no communication. Internal to zrt_checkpoint.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zrt/checkpoint/tier/memory_tier.h"

namespace zrt::ckpt::internal {

int RanksPerNode(const MemoryTierOptions& o);  // the setting, else the launcher's, else 1
// Rank q's replica is held by rank (q + d) mod n.
int Distance(int n, const MemoryTierOptions& o);
bool Replicated(int n, const MemoryTierOptions& o);
// Whether the job's state has live replicas: under hybrid sharding (and at stage 0) each of `shards`
// shards is held by the n / shards ranks r with the same r % shards. Their own copies then serve each
// other at a restart (rank r's by a rank r + k shards), and no replica is sent: the tier holds one
// copy per rank and moves nothing between snapshots.
bool LiveReplicas(int n, int shards);

// One rank's place in the tier of a job of n ranks.
struct TierPlace {
  int n = 1, rank = 0, d = 1;
  int source = -1;          // the rank whose replica this rank holds (-1: none)
  std::string rank_dir, own_dir, replica_dir;  // replica_dir empty without replicas
};
TierPlace PlaceOf(const std::string& root, const MemoryTierOptions& o, int n, int rank);

std::string StepPath(const std::string& parent, int64_t step);
std::string ReplicaDir(const std::string& rank_dir, int q);
// The whole generations under `parent` (own/ or replica-q/), newest first.
std::vector<int64_t> Steps(const std::string& parent);
// Moves the data file of a generation under `parent` other than `keep` to parent/spare.data.
void KeepSpare(const std::string& parent, int64_t keep);
// `path` (a new data file) takes the place of parent/spare.data when that is a plain file (anything
// else found there, a link say, is removed and never written through).
void Recycle(const std::string& parent, const std::string& path);
// Removes everything under `parent` but generation `keep` (whole or being written; -1: nothing kept).
void RemoveAllBut(const std::string& parent, int64_t keep);
int64_t TreeBytes(const std::string& dir);
bool Exists(const std::string& p);
// A generation's directory, private (core/private_dir.h) inside its checked parent.
Status MakeTierDir(const std::string& dir);

// Start-up: this rank's directories made, and what a killed run left removed: half-written
// generations, replicas this rank no longer holds, ranks the job no longer has (every rank of a node
// may try; a loser of that race finds nothing). Then the budget in force and what is held.
Status PrepareRankDir(const std::string& root, const MemoryTierOptions& o, const TierPlace& p, MemoryTierStats* stats);

}  // namespace zrt::ckpt::internal
