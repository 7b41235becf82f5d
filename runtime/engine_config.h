// EngineConfig: everything that configures a ZeroEngine (docs/configuration.md is the reference).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "zrt/core/dtype.h"
#include "zrt/core/status.h"
#include "zrt/kernels/adam_math.h"
#include "zrt/offload/io_options.h"
#include "zrt/runtime/loss_scaler.h"
#include "zrt/runtime/schedule.h"
#include "zrt/runtime/stats.h"

namespace zrt {

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

struct EngineConfig {
  int stage = 2;                          // 0..3
  DType reduce_dtype = DType::kF32;       // gradient reductions: f32, or the model dtype (f32 accumulation)
  int64_t bucket_bytes = 32 << 20;        // per gradient bucket; two are allocated
  int64_t alignment = 64;                 // elements; each tensor and shard starts at a multiple
  int64_t max_live_gathered_bytes = int64_t{1} << 30;  // stage 3: bound for prefetching
  int prefetch_depth = 2;                 // stage 3: groups gathered ahead of use
  double max_grad_norm = 0;               // global-norm clipping; 0 = off
  int grad_accum_steps = 1;               // gradients are divided by this at the step
  // 16-bit models: gradient buffers, accumulation over micro-steps, reductions' results and the
  // shard Adam reads in f32 (Megatron's main_grads), at 4 instead of 2 bytes per gradient element.
  bool fp32_grads = false;
  LossScaleConfig loss_scale;             // fp16: dynamic; bf16/f32: none
  kernels::AdamConfig adam;               // lr = the peak; weight_decay = the default (ParamOptions overrides)
  LrSchedule lr_schedule;                 // lr at step t = adam.lr * lr_schedule.Factor(t)
  MetricsConfig metrics;                  // tokens/s, MFU and the JSON-lines log of StepResult
  int optimizer_threads = 0;              // CPU Adam threads (caller included); <= 0: all hardware threads
  OffloadConfig offload;
};

}  // namespace zrt
