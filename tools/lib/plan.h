// The `zrt plan` command as a library function: the memory and time a model needs under each ZeRO
// stage and offload choice, what it leaves out, DeepSpeed's estimator for the same inputs, and the
// cheapest configuration that fits (docs/cli.md). Unit-tested without argv.
#pragma once

#include <ostream>
#include <string>

#include "tools/lib/goodput.h"
#include "zrt/core/status.h"

namespace zrt::tools {

struct PlanInput {
  // The model: a parameter count (and, for the stage-3 working set, its largest layer) ...
  double params = 0;
  double largest_layer = 0;  // parameters gathered at once at stage 3 (0: from the shape, or not counted)
  // ... or a decoder-only transformer's shape. arch "gpt": 4h GELU MLP, learned positions, tied
  // embeddings; "llama": SwiGLU MLP (3 matrices), rotary positions (no table), untied embeddings.
  std::string arch = "gpt";
  int layers = 0, hidden = 0, heads = 0, vocab = 0;
  int kv_heads = 0;  // grouped-query attention (0: = heads)
  int64_t ffn = 0;   // MLP width (0: gpt 4h; llama 8h/3 rounded up to a multiple of 256)
  int64_t seq = 0, batch = 1;  // micro-batch per device (the most `recommend` tries)
  // The setup.
  int gpus = 1;
  int gpus_per_node = 0;  // 0: min(gpus, 8)
  int stage = 3;
  // The mesh (docs/engine.md "Hybrid sharding"): stages 1-3 shard over groups of S devices and
  // replicate across the gpus / S groups (0: S = gpus, plain ZeRO); tensor and pipeline parallelism
  // as divisors of the model each device holds (gpus counts data-parallel devices).
  int shard_group = 0;
  int tp = 1, pp = 1;
  // ZeRO++'s quantized collectives (docs/engine.md "Quantized collectives"): stage-3 parameter gathers
  // (qwZ) and stage 1-3 gradient reduce-scatters (qgZ) as int8 codes (qgZ: or int4,
  // quantized_gradient_bits) with an f32 scale per block.
  bool quantized_weights = false, quantized_gradients = false;
  int quantized_gradient_bits = 8;
  int64_t quantization_block = 0;  // 0: each width's own (kernels::QuantBlockFor)
  // hpZ (EngineConfig::secondary_shard_group), stage 3: a secondary copy of the parameters over P
  // devices (a node: gpus_per_node), the backward's gathers inside it; 0: off. Applies to a shard group
  // S with 2 <= P < S dividing it.
  int secondary_shard_group = 0;
  // Link rates per device, GB/s, for the communication time per step (0: not timed).
  double intra_gbps = 0, inter_gbps = 0;
  std::string offload = "none";         // optimizer state: none | cpu | nvme (stages 1-3)
  std::string offload_params = "none";  // stage 3 parameter shards: none | cpu | nvme
  bool recompute = false;               // full activation recomputation
  bool flash_attention = false;         // attention scores never stored (the 5 a s^2 b term goes)
  int param_bytes = 2;                  // bf16/f16 = 2, f32 = 4
  std::string moments = "f32";          // EngineConfig::state: each Adam moment in f32, bf16, q8 or q4 ...
  bool master = true;                   // ... and an fp32 master (false: bf16 models only)
  int q8_block = 256;
  bool fp32_grads = false;              // EngineConfig::fp32_grads: 4-byte gradients
  int prefetch_depth = 2;               // EngineConfig::prefetch_depth
  double bucket_bytes = 32 << 20;       // EngineConfig::bucket_bytes
  double gpu_mem_gib = 80;
  double cpu_mem_gib = 0;               // host memory per node (0: not checked)
  double step_seconds = 0;              // the bandwidth that hides communication; save intervals in whole steps
  double tokens = 0, tflops = 0, power_watts = 0;
  // Failures (docs/cli.md "Failures and goodput"): the job's MTBF, from a per-device MTTF unless given ...
  double mttf_hours = kDefaultDeviceMttfHours, mtbf_hours = 0;
  double node_loss = kDefaultNodeLoss, tier_miss = kDefaultTierMiss, relaunch = kDefaultRelaunchSeconds;
  // ... and what saves and restarts cost per device: the checkpoint's bytes at these rates (GB/s per
  // device), or at the rates measured by ./scripts/bench (`from_bench`, its RESULT lines), unless the
  // seconds are given (< 0: not given).
  double snapshot_gbps = 20, disk_write_gbps = 0.12, disk_read_gbps = 0.43, peer_gbps = 12.5;
  std::string from_bench;
  double save_slowdown = -1;  // steps slower while a save is written (< 0: from the bench, else kDefaultSaveSlowdown)
  double save_stall = -1, disk_write = -1, replica_write = -1, restart_disk = -1, restart_memory = -1, restart_replica = -1;
};

// Writes the plan (text, or JSON with as_json) to `out`. FailedPrecondition (exit 1) when no
// configuration fits (the plan is still written); InvalidArgument for inputs that make no sense.
Status Plan(const PlanInput& in, bool as_json, std::ostream& out);

}  // namespace zrt::tools
