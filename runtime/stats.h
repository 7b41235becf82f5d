// Figures the engine reports: what moved (ZeroEngine::comm_stats, swap_stats) and where each step's
// time went (StepResult::times).
#pragma once

#include <cstdint>
#include <string>

#include "zrt/offload/io_options.h"

namespace zrt {

// Bytes each rank moves, by the usual ring-algorithm volumes: all-reduce 2(N-1)/N, reduce-scatter and
// all-gather (N-1)/N of the full buffer.
struct CommStats {
  int64_t reduce_bytes = 0;
  // Of reduce_bytes, the all-reduce of reduced shards across replica groups (hybrid sharding): what
  // crosses nodes when the shard groups are nodes.
  int64_t replica_bytes = 0;
  // Of reduce_bytes, two-level qgZ's second level: the node sums' codes sent across nodes.
  int64_t across_nodes_bytes = 0;
  int64_t gather_bytes = 0;
  // Of gather_bytes, the stage-3 gathers inside the secondary group (hpZ, EngineConfig::
  // secondary_shard_group): what stays inside a node when that group is one.
  int64_t secondary_gather_bytes = 0;
  int64_t collectives = 0;
  // Gradient reductions, host clock: each collective's time from launch to the completion the engine
  // saw (it polls on every GradsReady), and the part of that the caller spent in them (blocked in a
  // wait, or in the polls themselves, where CPU MPI does the collective's work).
  // 1 - reduce_wait_seconds / reduce_seconds is the fraction hidden behind compute (on NCCL the host
  // never blocks: the device-side overlap needs a profiler).
  double reduce_seconds = 0;
  double reduce_wait_seconds = 0;
};

// The trainer's phases, marked with ZeroEngine::Mark.
enum class Phase : uint8_t { kForward, kBackward };

// One step's wall time, from the previous Step's return to this one's, in seconds. Engine time is
// taken out of the phase it happened in, so the parts add up to `total`.
struct StepTimes {
  double total = 0;
  double forward = 0;           // from Mark(kForward) to the next mark or Step, less the engine's time
  double backward = 0;          // from Mark(kBackward) ...
  double comm_wait = 0;         // in gathers, gradient reductions, the norm's all-reduce and the post-step all-gather
  double optimizer = 0;         // the optimizer step (Adam and its casts), less offload I/O waits
  double offload_io = 0;        // blocked on NVMe swap reads and writes during the step
  double checkpoint_stall = 0;  // checkpoint snapshots (SaveAsync) that happened in this interval
  double other = 0;             // the rest: unmarked trainer time, engine bookkeeping
};

// Throughput figures and the JSON-lines log (EngineConfig::metrics; docs/configuration.md).
struct MetricsConfig {
  double tokens_per_step = 0;  // tokens this rank processes per optimizer step (0: no tokens/s)
  double flops_per_step = 0;   // model FLOPs this rank does per step, e.g. 6 * params * tokens (0: no MFU)
  double peak_flops = 0;       // this rank's device peak, FLOP/s (0: no MFU)
  // One JSON object per step appended to this file by rank 0 ("{rank}" in the path: by every rank,
  // each to its own file); flushed per line. Empty: no log.
  std::string jsonl_path;
};

}  // namespace zrt
