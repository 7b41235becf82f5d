// Loading this rank's state from a checkpoint saved by any number of ranks at any stage (reshard on
// load). Load reads only the chunks that overlap this rank's new shard, verifies each chunk's
// checksum, decompresses, and copies the overlapping elements; no collective communication (every
// rank loads independently). Tensors are matched by name, so the grouping and alignment may differ.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

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

}  // namespace zrt::ckpt
