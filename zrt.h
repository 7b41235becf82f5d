// zrt: the public API in one include (docs/getting-started.md lists what is installed).
//
//   #include <zrt/zrt.h>        everything a trainer needs on CPU ranks and on GPUs' host side
//   #include <zrt/gpu.h>        CUDA builds: the CUDA device and the NCCL communicator (CUDA headers)
//
// Namespaces: `zrt` holds what a trainer names to train (Status/Result, DType, devices,
// communicators, the engine and its configuration, host memory for offload); `zrt::ckpt` the
// checkpoint component (save, load, find, verify); `zrt::kernels` the Adam hyperparameters of the engine's
// optimizer settings. Names in an `internal` namespace are never API. This header pulls in no CUDA
// header, in any build.
#pragma once

#include "zrt/checkpoint/catalog.h"
#include "zrt/checkpoint/checkpointer.h"
#include "zrt/checkpoint/options.h"
#include "zrt/checkpoint/load.h"
#include "zrt/checkpoint/interchange/safetensors.h"
#include "zrt/core/communicator.h"
#include "zrt/core/device.h"
#include "zrt/core/dtype.h"
#include "zrt/core/json_reader.h"
#include "zrt/core/logging.h"
#include "zrt/core/mpi_communicator.h"
#include "zrt/core/shard_layout.h"
#include "zrt/core/state_view.h"
#include "zrt/core/status.h"
#include "zrt/core/tensor_spec.h"
#include "zrt/offload/host_memory.h"
#include "zrt/offload/io_options.h"
#include "zrt/runtime/config_json.h"
#include "zrt/runtime/engine.h"
#include "zrt/runtime/engine_config.h"
#include "zrt/runtime/full_state.h"
#include "zrt/runtime/stats.h"
