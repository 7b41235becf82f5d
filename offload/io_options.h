// How file I/O is done (offload swap files, checkpoints): the backend and its queue. Part of the
// public configuration (EngineConfig::offload.io, CheckpointOptions::io); the engine is io_engine.h.
#pragma once

#include <cstdint>

namespace zrt {

struct IoOptions {
  enum class Backend { kAuto, kUring, kThreads };
  Backend backend = Backend::kAuto;
  int queue_depth = 32;           // blocks in flight at most
  int64_t block_bytes = 1 << 20;  // requests are split into blocks of this size
  int threads = 4;                // workers of the thread backend
};

}  // namespace zrt
