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
