// Writes one shard's data file and index into a checkpoint directory (the per-rank half of a save).
// Used by the Checkpointer's background thread and by offline tools (reshard). No communication.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "zrt/checkpoint/format.h"
#include "zrt/offload/io_engine.h"

namespace zrt::ckpt {

// One state buffer of the shard: elements of (group, kind) in shard order, fp32. `data` must stay valid
// until WriteShard returns; 4 KiB-aligned data lets raw chunks go O_DIRECT. State that is not resident
// (NVMe offload) has data == nullptr and `read`, asked for one chunk at a time (memory stays O(chunk)).
struct ShardPiece32 {
  int group;
  int kind;
  const float* data;
  int64_t elements;
  std::function<Status(int64_t offset, int64_t count, void* out)> read = {};
};

struct ShardWriteStats {
  int64_t stored_bytes = 0;
};

// dir/rank-r.data (temp name, fsync, rename) then dir/rank-r.index.json (written last, durably).
// `fault` (may be empty) is asked before "fsync" and "rename" with the path; a nonzero errno fails.
Status WriteShard(IoEngine& io, const std::string& dir, const Manifest& m, int rank, const std::vector<ShardPiece32>& pieces,
                  const CompressOptions& compression, const std::function<int(std::string_view, const std::string&)>& fault,
                  ShardWriteStats* stats);

}  // namespace zrt::ckpt
