// The shard writer of the imports and the offline reshard (interchange.h): one new shard pulled
// piece by piece from its source. Internal to zrt_interchange.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "zrt/checkpoint/format.h"
#include "zrt/checkpoint/interchange/interchange.h"
#include "zrt/core/shard_layout.h"
#include "zrt/offload/io_engine.h"

namespace zrt::ckpt {

// Reads elements [offset, offset + count) of tensor `tensor` (its index in group `group`), state kind
// `kind` (its index in the group's kinds), as fp32 into `out`.
using PieceRead = std::function<Status(size_t group, size_t kind, int64_t tensor, int64_t offset, int64_t count, float* out)>;
// Writes shard `shard` of the checkpoint `m` describes (laid out by `layouts`) into `dir`, each chunk
// pulled piece by piece through `read` (padding between tensors is zero): O(chunk) memory.
Status WritePulledShard(IoEngine& io, const std::string& dir, const Manifest& m, const std::vector<ShardLayout>& layouts, int shard,
                        const PieceRead& read);

}  // namespace zrt::ckpt
