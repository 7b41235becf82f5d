// Resharding: the plan of reads that turns a checkpoint saved by N ranks into M shards, and the offline
// reshard that writes such a checkpoint (the `zrt ckpt reshard` command).
#pragma once

#include <functional>
#include <string>

#include "zrt/checkpoint/format.h"
#include "zrt/checkpoint/progress.h"

namespace zrt::ckpt {

// One contiguous read of a reshard: elements [old_offset, old_offset + count) of saved shard
// `old_rank` of `group` land at [new_offset, ...) of new shard `new_rank`.
struct ReshardRead {
  int new_rank;
  int old_rank;
  int group;
  int64_t new_offset;
  int64_t old_offset;
  int64_t count;
};
// Visits every read an M-shard layout (same alignment as saved) needs from the checkpoint described
// by `m`, without touching data: with equal alignment every tensor keeps its flat offset, so the plan
// is the intersection of old and new shard boundaries, O(groups x (old + new shards)) in all.
Status PlanReshard(const Manifest& m, int new_shards, const std::function<void(const ReshardRead&)>& visit);

struct ReshardOptions {
  int world_size = 1;   // ranks of the job that will load it
  int stage = -1;       // recorded in the manifest (< 0: the saved stage); stage 0 gives one shard file
  int threads = 1;      // new shards built at once (memory: that many new shards)
  ProgressFn progress;  // bytes written (called from the writing threads, one at a time)
};
// Writes a new complete checkpoint of the complete checkpoint `dir` under `out_root` (a root: the
// step directory goes inside; it must not exist there yet), laid out for `world_size` ranks, through
// the commit protocol (commit.h). Returns the new directory.
Result<std::string> Reshard(const std::string& dir, const std::string& out_root, const ReshardOptions& options);

}  // namespace zrt::ckpt
