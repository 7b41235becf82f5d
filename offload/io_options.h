// How file I/O is done (offload swap files, checkpoints): the backend and its queue. Part of the
// public configuration (EngineConfig::offload.io, CheckpointOptions::io); the engine is io_engine.h.
// And the figures of the NVMe swapper's passes that the engine reports (ZeroEngine::swap_stats).
#pragma once

#include <cstdint>

#include "zrt/core/status.h"

namespace zrt {

class JsonReader;

struct IoOptions {
  enum class Backend { kAuto, kUring, kThreads };
  Backend backend = Backend::kAuto;
  int queue_depth = 32;           // blocks in flight at most
  int64_t block_bytes = 1 << 20;  // requests are split into blocks of this size
  int threads = 4;                // workers of the thread backend
};

// The "io" object of a JSON configuration (docs/configuration.md): backend ("auto", "uring",
// "threads"), queue_depth, block_bytes, threads; absent keys keep *io's values.
Status ReadIoOptions(JsonReader& r, IoOptions* io);

// One pass of the NVMe swapper over the state (offload/swapper.h), reported by the engine for its last step.
struct SwapStats {
  int64_t bytes_read = 0;
  int64_t bytes_written = 0;
  double seconds = 0;          // the whole pass
  double update_seconds = 0;   // in the update (the CPU Adam)
  double wait_seconds = 0;     // blocked on I/O
};

}  // namespace zrt
