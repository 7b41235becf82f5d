// Writing a checkpoint from full (unsharded) tensors held elsewhere: the import paths (HDF5,
// safetensors, the Python module) and reshard. Shards are streamed chunk by chunk from the source.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "zrt/checkpoint/format.h"
#include "zrt/offload/io_engine.h"
#include "zrt/checkpoint/interchange/interchange.h"
#include "zrt/checkpoint/progress.h"
#include "zrt/core/shard_layout.h"
#include "zrt/core/state_view.h"
#include "zrt/core/status.h"

namespace zrt::ckpt {

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

// Reads elements [offset, offset + count) of tensor `tensor` (its index in group `group`), state kind
// `kind` (its index in the group's kinds), as fp32 into `out`.
using PieceRead = std::function<Status(size_t group, size_t kind, int64_t tensor, int64_t offset, int64_t count, float* out)>;
// Writes shard `shard` of the checkpoint `m` describes (laid out by `layouts`) into `dir`, each chunk
// pulled piece by piece through `read` (padding between tensors is zero): O(chunk) memory.
Status WritePulledShard(IoEngine& io, const std::string& dir, const Manifest& m, const std::vector<ShardLayout>& layouts, int shard,
                        const PieceRead& read);
// Writes a complete checkpoint under `out_root` (its step directory named by base.step) laid out for
// options.world_size ranks; each group holds the state kinds `kinds` gives it (master first; a group
// it does not name holds master only). `base` carries the counters
// and trainer/engine state (its groups, layout fields and nonce are filled here). Progress in bytes.
Status WriteCheckpointFromFull(const std::string& out_root, const std::vector<FullTensor>& tensors,
                               const std::map<std::string, std::vector<std::string>>& kinds, Manifest base, const FullTensorRead& read,
                               const ImportOptions& options, const ProgressFn& progress);

}  // namespace zrt::ckpt
