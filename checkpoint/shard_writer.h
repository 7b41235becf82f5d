// Writes one shard's data file and index into a checkpoint directory (the per-rank half of a save).
// Used by the Checkpointer's background thread and by the offline tools (reshard, import). No
// communication.
#pragma once

#include <string>
#include <vector>

#include "zrt/checkpoint/compression.h"
#include "zrt/checkpoint/format.h"
#include "zrt/core/state_view.h"
#include "zrt/offload/io_engine.h"

namespace zrt::ckpt {

// This shard's state: state[g][k] holds the shard's elements of manifest group g, kind k (fp32). A
// buffer's data must stay valid until WriteShard returns; 4 KiB-aligned data lets raw chunks go
// O_DIRECT. State that is not resident (NVMe offload) has no data and a `read`, asked for one chunk at
// a time (memory stays O(chunk)).
using ShardState = std::vector<std::vector<StateBuffer>>;

struct ShardWriteStats {
  int64_t stored_bytes = 0;
};

// The manifest of a save of `state` (its counters, groups and layouts; f32 state buffers only), with
// the save's nonce and chunk size.
Result<Manifest> ManifestFor(const StateView& state, const nlohmann::json& trainer_state, int64_t chunk_elements,
                             const std::string& nonce);

// dir/rank-r.data (temp name, fsync, rename) then dir/rank-r.index.json (written last, durably: its
// presence says the rank's data is durable). Durability steps ask io's hooks.
Status WriteShard(IoEngine& io, const std::string& dir, const Manifest& m, int rank, const ShardState& state,
                  const CompressOptions& compression, ShardWriteStats* stats = nullptr);

}  // namespace zrt::ckpt
