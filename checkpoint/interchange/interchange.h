// Checkpoints to and from other programs' files, and offline: what the formats share (the options of
// an import, the renaming of tensors between zrt's names and another program's), the import from full
// tensors, HDF5 export and import, and the offline reshard. Safetensors is safetensors.h.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "zrt/checkpoint/catalog.h"
#include "zrt/checkpoint/format.h"
#include "zrt/core/dtype.h"
#include "zrt/core/status.h"

namespace zrt::ckpt {

struct ImportOptions {
  int world_size = 1;
  int stage = 3;  // recorded in the manifest; stage 0 gives one shard file
  int64_t alignment = 64;
};

// Renames tensors between two programs' conventions: exact names first (to "" drops the tensor),
// then the first prefix rule whose prefix the name starts with; other names stay as they are.
struct NameMap {
  std::map<std::string, std::string> exact;
  std::vector<std::pair<std::string, std::string>> prefixes;

  std::optional<std::string> Apply(const std::string& name) const;  // nullopt: dropped
  bool empty() const { return exact.empty() && prefixes.empty(); }
  // A JSON file: {"name": "new name" | null, ...}, or {"exact": {...}, "prefix": {"from": "to", ...}}.
  static Result<NameMap> FromJsonFile(const std::string& path);
  // A prefix rule written FROM=TO (the CLI's --rename).
  Status AddRule(const std::string& from_eq_to);
};


// ---- import: a checkpoint from full (unsharded) tensors held elsewhere (HDF5, safetensors, the
// Python module). Shards are streamed chunk by chunk from the source.
// A tensor to import: where it goes (group, registration order given by its position) and what it is.
struct FullTensor {
  std::string name;
  std::vector<int64_t> shape;
  DType model_dtype = DType::kF32;
  std::string group = "default";
  double lr = 0, weight_decay = 0;  // the group's (the first tensor of a group decides)
};

// Reads elements [offset, offset + count) of tensors[t]'s state `kind` ("master", "exp_avg", ...) as
// fp32 into `out`.
using FullTensorRead = std::function<Status(size_t t, const std::string& kind, int64_t offset, int64_t count, float* out)>;

// Writes a complete checkpoint under `out_root` (its step directory named by base.step) laid out for
// options.world_size ranks; each group holds the state kinds `kinds` gives it (master first; a group
// it does not name holds master only). `base` carries the counters
// and trainer/engine state (its groups, layout fields and nonce are filled here). Progress in bytes.
Status WriteCheckpointFromFull(const std::string& out_root, const std::vector<FullTensor>& tensors,
                               const std::map<std::string, std::vector<std::string>>& kinds, Manifest base, const FullTensorRead& read,
                               const ImportOptions& options, const ProgressFn& progress);

// ---- HDF5 ----
// HDF5 interchange: a checkpoint as one HDF5 file of full (unsharded) tensors, readable by h5py or
// any HDF5 tool, and back.
//
// File layout (written by ExportHdf5, read by ImportHdf5):
//   /params/<tensor>                    fp32 master weights, the tensor's shape (or uint16 bf16 bit
//                                       patterns with attribute zrt_dtype = "bf16" when exported so)
//   /optimizer/<kind>/<tensor>          with all states: exp_avg, exp_avg_sq[, max_exp_avg_sq]
//   dataset attributes                  group, order (registration index), lr, weight_decay, model_dtype
//   root attributes                     zrt_format = "zrt-hdf5", version = 1, step, world_size, stage,
//                                       loss_scale, trainer_state (JSON text)
// Import accepts files from elsewhere too: /params/* float32 (or float64/float16) datasets, any
// shapes; missing attributes default (group "default", registration order = name order, step 0).
struct ExportOptions {
  bool all_states = false;   // params only, or also the optimizer state
  DType dtype = DType::kF32;  // f32, or bf16 (stored as uint16 bit patterns)
};
// Streams: one parameter group in memory at a time.
Status ExportHdf5(const std::string& dir, const std::string& out_path, const ExportOptions& options,
                  const ProgressFn& progress = nullptr);

// Writes a complete checkpoint under `out_root` (step from the file, else 0). One new shard and one
// tensor in memory at a time. Errors name the file and dataset when the layout is unexpected.
Status ImportHdf5(const std::string& in_path, const std::string& out_root, const ImportOptions& options,
                  const ProgressFn& progress = nullptr);

// ---- offline reshard ----
// Resharding: the plan of reads that turns a checkpoint saved by N ranks into M shards, and the offline
// reshard that writes such a checkpoint (the `zrt ckpt reshard` command).
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
