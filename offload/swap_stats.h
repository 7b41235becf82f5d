// Figures of one pass of the NVMe swapper over the state (offload/swapper.h), reported by the engine
// (ZeroEngine::swap_stats) for its last step.
#pragma once

#include <cstdint>

namespace zrt {

struct SwapStats {
  int64_t bytes_read = 0;
  int64_t bytes_written = 0;
  double seconds = 0;          // the whole pass
  double update_seconds = 0;   // in the update (the CPU Adam)
  double wait_seconds = 0;     // blocked on I/O
};

}  // namespace zrt
