// Figures the engine reports (ZeroEngine::comm_stats, swap_stats): what moved, in bytes.
#pragma once

#include <cstdint>

#include "zrt/offload/swap_stats.h"

namespace zrt {

// Bytes each rank moves, by the usual ring-algorithm volumes: all-reduce 2(N-1)/N, reduce-scatter and
// all-gather (N-1)/N of the full buffer.
struct CommStats {
  int64_t reduce_bytes = 0;
  int64_t gather_bytes = 0;
  int64_t collectives = 0;
};

}  // namespace zrt
