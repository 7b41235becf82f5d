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
#pragma once

#include <string>

#include "zrt/checkpoint/interchange/import_full.h"
#include "zrt/checkpoint/progress.h"
#include "zrt/core/dtype.h"
#include "zrt/core/status.h"

namespace zrt::ckpt {

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

}  // namespace zrt::ckpt
