// EngineConfig: everything that configures a ZeroEngine (docs/configuration.md is the reference).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "zrt/core/dtype.h"
#include "zrt/core/status.h"
#include "zrt/kernels/adam_config.h"
#include "zrt/offload/io_options.h"
#include "zrt/runtime/stats.h"

namespace zrt {

// Loss scaling for fp16 (runtime/loss_scaler.h applies it): static, or dynamic with growth, backoff,
// hysteresis and a minimum (torch.cuda.amp.GradScaler semantics when hysteresis = 1).
enum class LossScaleMode : uint8_t { kNone, kStatic, kDynamic };

struct LossScaleConfig {
  LossScaleMode mode = LossScaleMode::kNone;
  double init_scale = 65536.0;  // also the static scale
  double growth = 2.0;
  double backoff = 0.5;
  int64_t growth_interval = 2000;
  int hysteresis = 1;
  double min_scale = 1.0;
};

Result<LossScaleMode> ParseLossScaleMode(std::string_view s);


// LrSchedule: the learning-rate multiplier at each optimizer step, as the usual schedules define it
// (transformers' get_*_schedule_with_warmup, which torch runs as LambdaLR; without warmup, torch's
// CosineAnnealingLR and LinearLR; values checked against PyTorch in schedule_test.cc):
//
//   kind              factor(t), t = optimizer steps taken before this one (0 at the first step)
//   constant          1
//   warmup_constant   t < W ? t / W : 1
//   linear            t < W ? t / W : max(0, (T - t) / (T - W))                      (HF "linear")
//   cosine            t < W ? t / W : f + (1 - f) * (1 + cos(pi * p)) / 2,  p = (t - W) / (T - W)
//                       (HF "cosine" with f = min_lr_ratio = 0; "cosine_with_min_lr" otherwise)
//
// W = warmup_steps, T = total_steps. With W = 0 the warmup is absent (factor(0) = 1, as HF's max(1, W)
// denominators give). Past T, linear stays 0 and cosine stays at f (HF's cosine would climb back up:
// training past the schedule's end holds its last value instead). The engine applies it at Step:
// lr = adam.lr * factor(steps()) * the tensor's lr_scale. Skipped steps (fp16 overflow) do not advance
// t, as in DeepSpeed.
struct LrSchedule {
  enum class Kind { kConstant, kWarmupConstant, kLinear, kCosine };
  Kind kind = Kind::kConstant;
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;    // linear and cosine: the step at which the decay ends (> warmup_steps)
  double min_lr_ratio = 0;    // cosine: the floor, as a fraction of the peak lr (0..1)

  static LrSchedule Constant() { return {}; }
  static LrSchedule WarmupConstant(int64_t warmup) { return {Kind::kWarmupConstant, warmup, 0, 0}; }
  static LrSchedule Linear(int64_t warmup, int64_t total) { return {Kind::kLinear, warmup, total, 0}; }
  static LrSchedule Cosine(int64_t warmup, int64_t total, double min_lr_ratio = 0) {
    return {Kind::kCosine, warmup, total, min_lr_ratio};
  }

  Status Validate() const;
  double Factor(int64_t step) const;  // precondition: Validate() is OK, step >= 0

  friend bool operator==(const LrSchedule&, const LrSchedule&) = default;
};

// "constant", "warmup_constant", "linear", "cosine".
std::string_view LrScheduleKindName(LrSchedule::Kind k);
Result<LrSchedule::Kind> ParseLrScheduleKind(std::string_view s);

// Where state lives besides the device (ZeRO-Offload / ZeRO-Infinity); docs/configuration.md.
enum class OffloadTarget { kNone, kHost, kNvme };
Result<OffloadTarget> ParseOffloadTarget(std::string_view s);  // "none", "host", "nvme"
std::string_view OffloadTargetName(OffloadTarget t);

struct OffloadConfig {
  // fp32 master weights and Adam moments: device memory (none), host memory, or files under nvme_dir
  // streamed through host memory sub-group by sub-group at each step.
  OffloadTarget optimizer = OffloadTarget::kNone;
  // Stage 3 only: this rank's parameter shards in host memory or on NVMe (nvme needs optimizer = nvme),
  // read ahead of Gather() in the recorded prefetch order.
  OffloadTarget params = OffloadTarget::kNone;
  std::string nvme_dir;             // an existing directory; swap files go to <dir>/zrt-swap.rank<r>/
  int64_t host_budget_bytes = 0;    // bound on the host memory offload allocates (0: unbounded)
  int64_t sub_group_elements = 0;   // nvme: elements per streamed sub-group (0: the largest the budget allows)
  IoOptions io;                     // nvme: the I/O engine (backend, queue depth, block size)
};

// The optimizer state's precision (docs/configuration.md "State precision"): each Adam moment in f32,
// bf16, q8 or q4 (8- or 4-bit block-wise codes with an f32 scale per block of q8_block elements; the
// rules are core/quant_math.h), and an fp32 master copy of the parameters, or none for bf16 models (their
// updates rounded stochastically, keyed by step and element so a resumed or resharded run is
// bitwise the same). A group's tensors share one; amsgrad needs the default.
struct StatePrecision {
  Precision exp_avg = Precision::kF32;
  Precision exp_avg_sq = Precision::kF32;
  bool master = true;
  int64_t q8_block = 256;  // q8 and q4: elements per block, a power of two in [8, 4096]
  bool compact() const {
    return exp_avg != Precision::kF32 || exp_avg_sq != Precision::kF32 || !master;
  }
  friend bool operator==(const StatePrecision&, const StatePrecision&) = default;
};
// "exp_avg=q8 exp_avg_sq=q8 master=no block=256" (the short form the engine's messages use).
std::string StatePrecisionName(const StatePrecision& p);

struct EngineConfig {
  int stage = 2;                          // 0..3
  // Hybrid sharding (docs/engine.md "Hybrid sharding"; MiCS, FSDP2's HSDP): stages 1-3 shard over
  // groups of this many consecutive ranks (a rank's shard is rank % S, its replica group rank / S) and
  // keep R = N / S replicas of each shard. Gradients reduce-scatter inside the shard group, then each
  // shard is all-reduced across the replicas; parameter gathers never leave the shard group. Make a
  // group the ranks of one node (S = ranks per node) so that only the replicas' all-reduce crosses
  // nodes. 0: the whole world (plain ZeRO); kShardGroupNode (-1): one node, the launcher's ranks per
  // node, checked against the ranks' host names (ranks placed node by node, as mpirun's default
  // --map-by slot does). Must divide the world size; stage 0 shards nothing.
  int shard_group_size = 0;
  static constexpr int kShardGroupNode = -1;
  DType reduce_dtype = DType::kF32;       // gradient reductions: f32, or the model dtype (f32 accumulation)
  int64_t bucket_bytes = 32 << 20;        // at most, per gradient bucket (two); capped at the model's gradient, none on one rank
  int64_t alignment = 64;                 // elements; each tensor and shard starts at a multiple
  int64_t max_live_gathered_bytes = int64_t{1} << 30;  // stage 3: bound for prefetching
  int prefetch_depth = 2;                 // stage 3: groups gathered ahead of use
  // ZeRO++'s quantized collectives (docs/engine.md "Quantized collectives"), each off by default, each
  // moving int8 codes with an f32 scale per `quantization_block` values (host memory only: CPU ranks).
  // qwZ, stage 3: parameter gathers, decoded identically on every rank into the gathered parameters
  // (the shards, master and checkpoints stay exact).
  bool quantized_weights = false;
  // qgZ, stages 1-3: gradient reduce-scatters as an all-to-all of each rank's codes, decoded and
  // summed in f32 in rank order by the shard's owner (errors do not compound over hops).
  bool quantized_gradients = false;
  // qgZ's codes: 8 bits, or 4 (ZeRO++'s width: half the bytes again, each value off by up to its
  // block's largest magnitude / 14 instead of / 254; quantization_block must be even).
  int quantized_gradient_bits = 8;
  // Values per f32 scale of both; 0: each width's own (kernels::QuantBlockFor: 256 for int8, 64 for
  // int4 qgZ).
  int64_t quantization_block = 0;
  // hpZ, stage 3: a secondary copy of the parameters, partitioned over groups of this many
  // consecutive ranks inside the shard group (make it a node: kShardGroupNode, -1, the launcher's
  // ranks per node): a group's first gather in a step keeps the rank's 1/P of it, and its later
  // gathers in the step (backward) all-gather those slices inside the group only. Costs padded model /
  // P parameter bytes per rank (memory()'s parameters). 0: off; else in [2, shard group size), dividing
  // it. Host memory only (CPU ranks).
  int secondary_shard_group = 0;
  double max_grad_norm = 0;               // global-norm clipping; 0 = off
  int grad_accum_steps = 1;               // gradients are divided by this at the step
  // 16-bit models: gradient buffers, accumulation over micro-steps, reductions' results and the
  // shard Adam reads in f32 (Megatron's main_grads), at 4 instead of 2 bytes per gradient element.
  bool fp32_grads = false;
  LossScaleConfig loss_scale;             // fp16: dynamic; bf16/f32: none
  kernels::AdamConfig adam;               // lr = the peak; weight_decay = the default (ParamOptions overrides)
  StatePrecision state;                   // the default; ParamOptions::state overrides per tensor
  LrSchedule lr_schedule;                 // lr at step t = adam.lr * lr_schedule.Factor(t)
  MetricsConfig metrics;                  // tokens/s, MFU and the JSON-lines log of StepResult
  int optimizer_threads = 0;              // CPU Adam threads (caller included); <= 0: this rank's share of its cores (its CPU affinity divided among the node's ranks that share it; getting-started.md)
  OffloadConfig offload;
};

}  // namespace zrt
