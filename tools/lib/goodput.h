// What failures cost a training run and how often to save against them: `zrt plan`'s failure
// section (docs/cli.md "Failures and goodput"). Pure functions of their inputs, unit-tested against
// hand-computed cases and published figures (goodput_test.cc).
//
// The model, first order in 1/MTBF: failures arrive as a Poisson process in wall-clock time, one every
// `mtbf` seconds for the whole job. Each costs the stall before training resumes (relaunch + loading
// the state) and the training since the newest restorable state: half a save interval plus the time a
// save takes to become restorable (an asynchronous save is only restorable once written). A save
// stalls training for its snapshot and slows it by `slowdown` while it is written (its cost c =
// snapshot + slowdown x write). So, for one tier saved every tau seconds of training:
//   lost = tau/2 + write    cost per failure = stall + lost    saves' share = c/tau
//   ETTR = max(0, 1 - cost/mtbf) / (1 + c/tau)
// With the memory tier beside the disk a failure restarts from the node's own copy (the process died,
// the node lives), from a peer's replica (the node is lost) or, for the `tier_miss` share the tier
// cannot serve (a node and its replica's node lost together, a job-wide outage), from disk; each tier's
// interval is Daly's optimum for the failures that roll back to it (mtbf / their share). Beside it, the
// tier without replicas (own copies only: a node's loss rolls back to disk) shows what replicas save.
// Where the state has live replicas (hybrid sharding, R = N / S >= 2) the planner sets tier_write to 0:
// no replica is sent, the ranks holding a shard serve each other (memory_tier.h).
#pragma once

#include <string>
#include <string_view>

#include "zrt/core/status.h"

namespace zrt::tools {

// Per-device MTTF that gives Meta's projected job MTTF of 1.8 h at 16,384 GPUs (Kokolis et al.,
// "Revisiting Reliability in Large-Scale Machine Learning Research Clusters", arXiv 2410.21680; the
// same scaling gives 13.5 min at 131,072 GPUs, where they project about 14).
inline constexpr double kDefaultDeviceMttfHours = 1.8 * 16384;
// Llama 3 (arXiv 2407.21783, table 5): 78% of the 419 unexpected interruptions were hardware, taking
// the node out of the job: those restart from a replica, the rest from the node's own copy.
inline constexpr double kDefaultNodeLoss = 0.78;
// Failures the memory tier cannot serve: an assumption (no published figure), set it from your cluster.
inline constexpr double kDefaultTierMiss = 0.1;
// Steps run this much slower while a save is written in the background: an assumption for steps on a
// device (the write uses the host); bench/checkpoint measures it on CPU ranks (--from-bench).
inline constexpr double kDefaultSaveSlowdown = 0.05;
// Every restart: rescheduling, process start, communicator setup. FT-HSDP (arXiv 2602.00277) reports a
// 10-minute recovery stall for synchronous training at O(100K) GPUs; smaller jobs restart faster.
inline constexpr double kDefaultRelaunchSeconds = 300;

// Seconds, per device.
struct FailureCosts {
  double disk_stall = 0, disk_write = 0;  // a disk save: training waits for its snapshot; durable after `disk_write` more
  double tier_stall = 0, tier_write = 0;  // a memory-tier save: its snapshot; the replica whole after `tier_write` more (0: live replicas)
  double disk_restart = 0, own_restart = 0, replica_restart = 0;  // loading the state from disk / own copy / a replica
  double relaunch = kDefaultRelaunchSeconds;
};

struct GoodputInput {
  double mtbf_seconds = 0;  // the job's mean time between failures (> 0)
  FailureCosts costs;
  double node_loss = kDefaultNodeLoss;  // share of failures that lose the node
  double tier_miss = kDefaultTierMiss;  // share of failures the memory tier cannot serve
  double slowdown = kDefaultSaveSlowdown;  // steps slower by this fraction while a save is written
  double step_seconds = 0;              // > 0: intervals are whole steps
  double compute_seconds = 0;           // the training's time without failures (0: unknown)
};

struct Scenario {
  double disk_interval = 0;  // seconds of training between disk saves (infinite: none needed)
  double tier_interval = 0;  // between memory-tier saves (0: no tier)
  double save_share = 0;     // training time stalled by saves, as a fraction of training time
  double work_lost = 0;      // expected seconds of training lost per failure
  double stall = 0;          // expected seconds per failure before training resumes
  double ettr = 0;           // effective training time ratio
  double wall_seconds = 0;   // with compute_seconds: the training's wall-clock time (infinite when ettr is 0)
  double failures = 0;       // ... and the failures expected during it
};

struct Goodput {
  Scenario disk_only;
  Scenario own_copies;  // the memory tier without replicas: node losses (and tier misses) roll back to disk
  Scenario with_tier;   // the memory tier with replicas: only tier misses roll back to disk
};

// Daly's higher-order optimum of the training time between saves that stall `stall` seconds, for
// failures every `mtbf` seconds (J. T. Daly, "A higher order estimate of the optimum checkpoint
// interval for restart dumps", FGCS 22(3), 2006): sqrt(2 stall mtbf) [1 + sqrt(x)/3 + x/9] - stall
// with x = stall / (2 mtbf), for stall < 2 mtbf; else mtbf. Young's sqrt(2 stall mtbf) to first order.
double DalyInterval(double stall, double mtbf);

// Precondition: mtbf_seconds > 0, shares in [0, 1], costs >= 0 (the planner checks its flags).
Goodput PredictGoodput(const GoodputInput& in);

// Per-device rates in bytes/s, from the RESULT lines ./scripts/bench writes (build/bench-results.tsv):
// bench/checkpoint's save stall, background write; bench/recovery's snapshot, replica and resume rates.
// `slowdown` is the steps' with a save in flight over those without, minus 1 (0 when not slower).
// Aggregate rates are divided by the ranks of the run (the "N=k" the script puts before each case);
// where a bench ran at several sizes, the largest is used. With `live_replicas` (the plan's state has
// R >= 2 replicas) the tier's rates come from the hybrid run (bench/recovery --shard-group, the
// "recovery-hybrid" rows) where the file has one.
struct BenchRates {
  double disk_snapshot = 0, disk_write = 0, disk_read = 0;
  double tier_snapshot = 0, tier_replica = 0, own_load = 0, replica_load = 0;
  double slowdown = kDefaultSaveSlowdown;
  int checkpoint_ranks = 0, recovery_ranks = 0;
  bool recovery_hybrid = false;  // the tier's rates are the hybrid run's
};
Result<BenchRates> ParseBenchRates(std::string_view text, const std::string& name, bool live_replicas = false);
// Reads a regular file of at most 16 MiB; errors name it.
Result<BenchRates> ReadBenchRates(const std::string& path, bool live_replicas = false);

}  // namespace zrt::tools
