// Reading checkpoints: completeness, listing, finding the newest complete one, and loading this rank's
// state from a checkpoint saved by any number of ranks at any stage (reshard on load).
//
// Load reads only the chunks that overlap this rank's new shard, verifies each chunk's checksum,
// decompresses, and copies the overlapping elements; no collective communication (every rank loads
// independently). Tensors are matched by name, so the grouping and alignment may differ too.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "zrt/checkpoint/format.h"
#include "zrt/offload/io_engine.h"
#include "zrt/core/state_view.h"

namespace zrt::ckpt {

enum class VerifyLevel {
  kMetadata,  // manifest and indexes exist, parse, pass their checksums and agree; data file sizes
  kFull,      // + every chunk read back, checksummed and decoded
};

// Appends a line per problem ("rank-00002.index.json: missing", "rank-00001.data chunk 17 (group
// 'layer0', exp_avg, tensors w1..w3): checksum mismatch"). OK with problems empty = complete.
// A non-OK status means the check itself could not run (e.g. the directory is unreadable).
Status CheckComplete(const std::string& dir, VerifyLevel level, std::vector<std::string>* problems);

struct CheckpointInfo {
  std::string dir;
  int64_t step = -1;
  bool complete = false;
  bool in_progress = false;   // a .tmp directory: a save being written, or one that died
  std::string problem;        // why not complete (the first problem)
  int world_size = 0;
  int stage = -1;
  int64_t bytes = 0;          // on disk
  int64_t created_unix = 0;
};

// Every checkpoint directory under root, newest step first.
Result<std::vector<CheckpointInfo>> ListCheckpoints(const std::string& root, VerifyLevel level = VerifyLevel::kMetadata);
// The newest complete checkpoint's directory; NotFound when there is none. Incomplete or corrupt
// ones are skipped (with kFull, so are ones with a bad chunk).
Result<std::string> FindLatestComplete(const std::string& root, VerifyLevel level = VerifyLevel::kMetadata);

Result<Manifest> ReadManifest(const std::string& dir);
Result<RankIndex> ReadIndex(const std::string& dir, int rank);

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

// Group g of a checkpoint described for a layout of `shards` ranks (tensors and layout; no buffers).
Result<StateGroup> GroupForShards(const Manifest& m, int group, int shards);

// Group g loaded whole (a one-shard view), one fp32 buffer per kind: tools that stream a checkpoint
// one group at a time (inspect --stats, diff, export).
struct WholeGroup {
  StateView view;                        // one group; its layout gives each tensor's offset
  std::vector<std::vector<float>> data;  // per kind, in `kinds` order
};
Result<WholeGroup> LoadWholeGroup(const std::string& dir, const Manifest& m, int group, const std::vector<std::string>& kinds);

struct LoadOptions {
  bool params_only = false;  // load fp32 master weights only; moments start at zero (fine-tuning)
  IoOptions io;
};

struct LoadResult {
  int64_t step = 0;
  nlohmann::json trainer_state;
  double loss_scale = 1;
  int64_t scaler_good_steps = 0;
  int scaler_hysteresis_left = 1;
  int saved_world_size = 1;
  int saved_stage = 0;
  int64_t bytes_read = 0;
};

// Fills `target`'s buffers (this rank's shards) from the checkpoint in `dir`. Errors name the file,
// chunk and tensor; on error the target buffers may be partly written (the engine must not step).
Result<LoadResult> Load(const std::string& dir, const StateView& target, const LoadOptions& options = {});

}  // namespace zrt::ckpt
