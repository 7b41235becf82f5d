// zrt plan: what a model needs, before launching (docs/cli.md "zrt plan" says the same in prose).
//
// Parameters of a decoder-only transformer, h hidden, L layers, a heads of size d = h/a, kv key/value
// heads, f MLP width, V vocabulary, s positions: per layer 2h^2 + 2h*kv*d (attention: Q and output h^2
// each, K and V h*kv*d each) + m*h*f (m = 2 matrices for GELU, 3 for SwiGLU) + 4h (norms; biases not
// counted); plus V*h (embedding; twice when untied) + s*h (learned positions, gpt only).
// Model states per device, P = parameter bytes, G = gradient bytes (P, or 4 with fp32 gradients),
// K = optimizer bytes per parameter (12 with 16-bit parameters: fp32 master + Adam moments; 8 for fp32
// models; with compact state (--moments, --master) each moment 4, 2, 1 or 1/2 + 4/block bytes and the master
// 4 or 0), Psi parameters, N devices — Rajbhandari et al., "ZeRO", SC'20, section 5:
//   stage 0: (P + G + K) Psi   stage 1: (P + G) Psi + K Psi/N   stage 2: P Psi + (G + K) Psi/N
//   stage 3: (P + G + K) Psi / N
// Offload (ZeRO-Offload / ZeRO-Infinity, stages 1-3): the optimizer's K Psi/N goes to host memory or
// NVMe, and the host keeps an fp32 copy of the gradient shard (4 Psi/N) for the CPU Adam; at stage 3
// the parameter shards can go to host memory or NVMe as well (fetched per layer).
// Working set beyond model states: two gradient buckets (stage 0: in place, 2B; reduce-scatter:
// 2B(1 + 1/N)); stage 2 one layer's full gradient before it is bucketed (G x largest layer); stage 3
// the gathered layers — the one in use and `prefetch_depth` ahead, bounded by max_live_gathered_bytes
// (1 GiB) but never below one layer — plus one layer's full gradient.
// Activations per layer, 16-bit, no tensor/sequence parallelism, dropout masks counted — Korthikanti
// et al., "Reducing Activation Recomputation in Large Transformer Models", MLSys'23, eq. 2 generalised
// to GQA (r = kv/a) and MLP width: s*b*h*(attention 7 + 4r + MLP (3 + 4f/h, SwiGLU 3 + 6f/h) + norms 4)
// + 5*a*s^2*b (the attention scores; none with FlashAttention); with full recomputation only the layer
// input is kept: 2*s*b*h.
// Communication per step per device (ring collectives): stages 0-2 2 Psi P (N-1)/N, stage 3
// 3 Psi P (N-1)/N (qwZ's gathers and qgZ's reduce-scatters at 1 + 4/block bytes per value instead of P); with hybrid sharding (S devices per shard group, R = N/S) the group's collectives
// use S, plus 2 Psi P / S (R-1)/R across the replicas (LinksFor splits them by link). The model per
// device is Psi / (TP x PP), and every sharded term divides by S instead of N. Time: 8 Psi T / (N X) with recomputation, 6 Psi T / (N X) without.
// DeepSpeed's estimator (deepspeed.runtime.zero.stage_1_and_2 / stage3
// estimate_zero{2,3}_model_states_mem_needs, additional_buffer_factor 1.5) for the same inputs is
// reported beside: docs/cli.md says where and why the two differ.
// Failures (goodput.h has the model): a checkpoint holds 12 bytes per parameter (fp32 master and the two
// Adam moments, whatever the dtype or stage), 12 Psi / S per device (at stage 0 the whole state); a
// save stalls for its snapshot at the snapshot rate and is durable after its part (1/R of it: saves
// are spread over the R = N / S replicas) at the disk's write rate. The memory tier's replica moves at
// the peer rate when R = 1 and not at all when R >= 2 (the live replicas serve). A restart loads the
// state at the disk's read rate, from the own copy at the snapshot rate, from a replica at the peer
// rate, after the relaunch. The tier is predicted with and without replicas (own copies only).
#include <algorithm>
#include <cmath>
#include <iomanip>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "zrt/core/device.h"
#include "zrt/core/state_view.h"
#include "zrt/kernels/weight_quant.h"
#include "tools/lib/plan.h"

namespace zrt::tools {

namespace {

constexpr double kMaxLiveGathered = double(int64_t{1} << 30);  // EngineConfig::max_live_gathered_bytes

struct Model {
  double psi = 0;
  double largest = 0;  // parameters gathered at once at stage 3 (0: unknown)
  bool shape = false;
  double act_per_sbh = 0;  // activation bytes per s*b*h per layer, besides the attention scores
};

Result<Model> ModelOf(const PlanInput& in) {
  Model m;
  m.shape = in.layers > 0 || in.hidden > 0;
  if (!m.shape) {
    m.psi = in.params;
    m.largest = in.largest_layer;
    if (!(m.psi > 0) || !std::isfinite(m.psi)) return InvalidArgumentError("plan: give --params > 0 or a transformer shape");
    if (m.largest < 0 || m.largest > m.psi) return InvalidArgumentError("plan: --largest-layer must be between 0 and --params");
    return m;
  }
  if (in.layers <= 0 || in.hidden <= 0 || in.heads <= 0 || in.seq <= 0 || in.vocab <= 0 || in.batch <= 0) {
    return InvalidArgumentError("plan: a transformer shape needs --layers, --hidden, --heads, --seq, --vocab > 0 and --batch >= 1");
  }
  if (in.hidden % in.heads != 0) return InvalidArgumentError("plan: --hidden must be a multiple of --heads");
  const int kv = in.kv_heads > 0 ? in.kv_heads : in.heads;
  if (kv > in.heads || in.heads % kv != 0) return InvalidArgumentError("plan: --kv-heads must divide --heads");
  const bool llama = in.arch == "llama";
  const double h = in.hidden, d = h / in.heads;
  const double f = in.ffn > 0 ? double(in.ffn) : llama ? std::ceil(8.0 * h / 3 / 256) * 256 : 4 * h;
  const double layer = 2 * h * h + 2 * h * kv * d + (llama ? 3 : 2) * h * f + 4 * h;
  const double embed = double(in.vocab) * h;
  m.psi = in.layers * layer + embed * (llama ? 2 : 1) + (llama ? 0 : double(in.seq) * h);
  m.largest = std::max(layer, embed);
  const double r = double(kv) / in.heads;
  m.act_per_sbh = (7 + 4 * r) + (llama ? 3 + 6 * f / h : 3 + 4 * f / h) + 4;
  return m;
}

struct Config {
  int stage = 3;
  std::string offload = "none", offload_params = "none";
  bool recompute = false;
  int64_t batch = 1;
  int shards = 1;  // S: the devices the state is sharded over (gpus, or the hybrid shard group)
};

struct Memory {
  double params = 0, grads = 0, optim = 0, working = 0, buckets = 0, act = 0;  // device
  double host = 0, nvme = 0;                                                    // per device
  double state[3] = {0, 0, 0};  // params, grads, optimizer state per device, wherever they live
  double device() const { return params + grads + optim + working + buckets + act; }
  double states() const { return params + grads + optim; }
};

// Bytes of one Adam moment per parameter as the state keeps it (--moments; Check parsed it): its
// value, and a q8 or q4 block's scale shared by the block.
double MomentBytes(const PlanInput& in) {
  const Result<Precision> p = ParsePrecision(in.moments);
  const StateFormat f = StateFormat::Of(p.ok() ? *p : Precision::kF32, "exp_avg_sq", in.q8_block);
  const int64_t n = std::max<int64_t>(f.block, 1) * 1024;  // whole blocks
  return static_cast<double>(f.Bytes(n)) / static_cast<double>(n);
}

// hpZ's group size over a shard group of `shards` devices, or 0 where it does not apply.
int Secondary(const PlanInput& in, int shards) {
  const int p = in.secondary_shard_group;
  return in.stage == 3 && p >= 2 && p < shards && shards % p == 0 ? p : 0;
}

Memory MemoryFor(const PlanInput& in, const Model& m, const Config& c) {
  // Optimizer state per parameter: the moments, and an fp32 master for 16-bit models (an fp32 model's
  // parameters are its master, except on NVMe where the master streams beside the parameters).
  const double n = c.shards, p = in.param_bytes, g = in.fp32_grads ? 4 : in.param_bytes;
  const double moment = MomentBytes(in);
  const double master = !in.master || (in.param_bytes == 4 && c.offload != "nvme") ? 0 : 4;
  const double k = 2 * moment + master;
  const double psi = m.psi / (in.tp * in.pp);
  Memory mem;
  switch (c.stage) {
    case 0: mem.params = p * psi, mem.grads = g * psi, mem.optim = k * psi; break;
    case 1: mem.params = p * psi, mem.grads = g * psi, mem.optim = k * psi / n; break;
    case 2: mem.params = p * psi, mem.grads = g * psi / n, mem.optim = k * psi / n; break;
    default: mem.params = p * psi / n, mem.grads = g * psi / n, mem.optim = k * psi / n; break;
  }
  mem.state[0] = mem.params, mem.state[1] = mem.grads, mem.state[2] = mem.optim;
  // Gradient buckets in f32: one as large as the model's gradient when that fits bucket_bytes, else two
  // of bucket_bytes; none on one device (nothing is reduced).
  const double bucket = std::min(double(in.bucket_bytes), 4 * psi), buckets = 4 * psi > in.bucket_bytes ? 2 : 1;
  mem.buckets = in.gpus == 1 ? 0 : buckets * bucket * (c.stage == 0 || n == 1 ? 1 : 1 + 1 / n);
  if (c.stage == 2) mem.working = g * m.largest;
  if (c.stage == 3) {
    const double one = p * m.largest;
    mem.working = std::max(one, std::min((1 + in.prefetch_depth) * one, kMaxLiveGathered)) + g * m.largest;
  }
  if (c.offload != "none") {
    (c.offload == "cpu" ? mem.host : mem.nvme) += mem.optim;
    // The host's copies of the device's gradient and parameter shards the CPU Adam reads and writes
    // (the parameters are the store's own when they are offloaded too).
    mem.host += (g + (c.offload_params == "none" ? p : 0)) * psi / n;
    mem.optim = 0;
  }
  if (c.offload_params != "none") {
    (c.offload_params == "cpu" ? mem.host : mem.nvme) += mem.params;
    mem.params = 0;
  }
  // hpZ's secondary copy of the parameters, 1/P of them, kept on the device through the step.
  if (c.stage == 3 && Secondary(in, c.shards) > 0) mem.params += p * psi / Secondary(in, c.shards);
  if (m.shape) {
    const double s = double(in.seq), b = double(c.batch), h = in.hidden, a = in.heads;
    const double scores = in.flash_attention ? 0 : 5.0 * a * s * s * b;
    mem.act = c.recompute ? in.layers * 2.0 * s * b * h : in.layers * (s * b * h * m.act_per_sbh + scores);
  }
  return mem;
}

int Shards(const PlanInput& in) { return in.shard_group > 0 ? in.shard_group : in.gpus; }

int PerNode(const PlanInput& in) { return in.gpus_per_node > 0 ? std::min(in.gpus_per_node, in.gpus) : std::min(in.gpus, 8); }

bool Fits(const PlanInput& in, const Memory& mem) {
  if (mem.device() > in.gpu_mem_gib * double(int64_t{1} << 30)) return false;
  return in.cpu_mem_gib <= 0 || mem.host * PerNode(in) <= in.cpu_mem_gib * double(int64_t{1} << 30);
}

// Configurations cheapest first. Each step down the list costs time per token: stage 3's 1.5x
// communication, recomputation's 4/3 compute, the optimizer on the CPU over PCIe, parameters fetched
// from the host, then NVMe's bandwidth. Within a step the lower stage (equal cost, fewer collectives).
std::vector<Config> Candidates() {
  std::vector<Config> out;
  auto add = [&](int stage, const char* off, const char* off_params, bool rc) { out.push_back({stage, off, off_params, rc, 1, 1}); };
  for (bool rc : {false, true}) {
    for (int s = 0; s <= 3; ++s) add(s, "none", "none", rc);
  }
  for (const char* dev : {"cpu", "nvme"}) {
    for (bool rc : {false, true}) {
      for (int s = 1; s <= 3; ++s) add(s, dev, "none", rc);
    }
    for (bool rc : {false, true}) add(3, dev, dev, rc);
  }
  return out;
}

// DeepSpeed's estimator, for the same model and cluster (bytes; "cpu" is per node).
nlohmann::json DeepSpeedEstimate(const PlanInput& in, const Model& m) {
  const double total = m.psi, per_node = PerNode(in), gpus = in.gpus, nodes = std::ceil(gpus / per_node), buf = 1.5;
  nlohmann::json z2 = nlohmann::json::array(), z3 = nlohmann::json::array();
  z2.push_back({{"offload_optimizer", "cpu"}, {"gpu", std::floor(2 * total)}, {"cpu", std::floor(total * std::max(4 * gpus, 16.0) * buf)}});
  z2.push_back({{"offload_optimizer", "none"}, {"gpu", std::floor(4 * total + std::floor(16 * total / gpus))},
                {"cpu", std::floor(total * 4 * per_node * buf)}});
  if (m.largest > 0) {
    const double layer = 4 * m.largest, gf = 1 / nodes;
    for (int zero_init : {1, 0}) {
      z3.push_back({{"offload_param", "cpu"}, {"offload_optimizer", "cpu"}, {"zero_init", zero_init}, {"gpu", std::floor(layer)},
                    {"cpu", std::floor(total * (zero_init ? 18 * gf : std::max(4 * per_node, 18 * gf)) * buf)}});
    }
    for (int zero_init : {1, 0}) {
      z3.push_back({{"offload_param", "none"}, {"offload_optimizer", "cpu"}, {"zero_init", zero_init},
                    {"gpu", std::floor(layer + std::floor(2 * total / gpus))},
                    {"cpu", std::floor(total * (zero_init ? 16 * gf : std::max(4 * per_node, 16 * gf)) * buf)}});
    }
    for (int zero_init : {1, 0}) {
      z3.push_back({{"offload_param", "none"}, {"offload_optimizer", "none"}, {"zero_init", zero_init},
                    {"gpu", std::floor(layer + std::floor(18 * total / gpus))},
                    {"cpu", std::floor(zero_init ? m.largest * 4 * per_node * buf : total * 4 * per_node * buf)}});
    }
  }
  return {{"zero2", z2}, {"zero3", z3}, {"additional_buffer_factor", buf}};
}

// Bytes per device per step on the links inside a node and across nodes (ring collectives, the
// volumes of docs/engine.md "Hybrid sharding"), M = the model per device in its dtype, G = its
// gradient: stages 0-2 all-reduce (reduce-scatter + all-gather) 2 M (S-1)/S, stage 3 gathers twice
// and reduce-scatters: 3 M (S-1)/S; with R = N / S > 1 replicas the reduced shard is all-reduced
// across them, 2 (M / S) (R-1)/R. A collective over a group that spans nodes is counted across.
struct Links {
  double inside = 0, across = 0;
  double seconds = 0;  // at the given rates (0 when not given)
};

Links LinksFor(const PlanInput& in, const Model& m, int shards) {
  const double elements = m.psi / (in.tp * in.pp), bytes = elements * in.param_bytes, s = shards, r = double(in.gpus) / shards;
  // Per element on the wire: the dtype's bytes, or with qwZ / qgZ a code (qgZ: a byte or half of one)
  // and 4 / block of a scale.
  const int64_t gather_block = kernels::QuantBlockFor(in.quantization_block, 8);
  const int64_t reduce_block = kernels::QuantBlockFor(in.quantization_block, in.quantized_gradient_bits);
  const double code = in.quantized_gradient_bits / 8.0;
  const double gather = in.quantized_weights ? 1 + 4.0 / static_cast<double>(gather_block) : in.param_bytes;
  const double reduce = in.quantized_gradients ? code + 4.0 / static_cast<double>(reduce_block) : in.param_bytes;
  // The shard group: stage 3 gathers twice and reduce-scatters (with hpZ the backward's gather goes
  // over the P-device secondary group, in the dtype); stages 1-2 reduce-scatter and gather once.
  // qgZ over a shard group spanning nodes of P devices goes two levels: (P-1)/P of the codes inside
  // the node, then the node sums' codes, 1/P of them, across: (K-1)/K of those, K = S / P.
  const int hpz = Secondary(in, shards), per_node = PerNode(in);
  const bool two_level = in.quantized_gradients && per_node > 1 && shards > per_node && shards % per_node == 0;
  const double group = ((in.stage == 3 && hpz == 0 ? 2 : 1) * gather + (two_level ? 0 : reduce)) * elements * (s - 1) / s;
  const double replicas = in.stage == 0 ? 0 : 2 * bytes / s * (r - 1) / r;
  Links l;
  auto inside = [&](int devices) { return devices <= per_node && per_node % devices == 0; };
  (inside(shards) ? l.inside : l.across) += in.stage == 0 ? 2 * bytes * (in.gpus - 1.0) / in.gpus : group;
  if (hpz > 0) (inside(hpz) ? l.inside : l.across) += bytes * (hpz - 1.0) / hpz;
  if (two_level) {
    const double k = s / per_node;
    l.inside += reduce * elements * (per_node - 1.0) / per_node;
    l.across += reduce * elements / per_node * (k - 1) / k;
  }
  if (in.stage == 0 && in.gpus > PerNode(in)) l.across += l.inside, l.inside = 0;
  l.across += replicas;
  if (in.intra_gbps > 0 && in.inter_gbps > 0) l.seconds = l.inside / (in.intra_gbps * 1e9) + l.across / (in.inter_gbps * 1e9);
  return l;
}

// Every shard group size that divides the world: memory per device, bytes per link, the time at the
// given rates; and the recommendation: the fastest (least across nodes) that fits.
nlohmann::json MeshJson(const PlanInput& in, const Model& m) {
  nlohmann::json rows = nlohmann::json::array();
  int best = 0;
  double best_cost = 0;
  for (int s = 1; s <= in.gpus; ++s) {
    if (in.gpus % s != 0 || (in.stage == 0 && s != in.gpus)) continue;
    const Config c{in.stage, in.offload, in.offload_params, in.recompute, in.batch, s};
    const Memory mem = MemoryFor(in, m, c);
    const Links l = LinksFor(in, m, s);
    const bool fits = Fits(in, mem);
    const double cost = l.seconds > 0 ? l.seconds : l.across + 1e-6 * l.inside;
    if (fits && (best == 0 || cost < best_cost)) best = s, best_cost = cost;
    nlohmann::json row = {{"shard_group", s}, {"replicas", in.gpus / s}, {"device_total", mem.device()}, {"model_states", mem.states()},
                          {"inside_node_bytes", l.inside}, {"across_nodes_bytes", l.across}, {"fits", fits}};
    if (l.seconds > 0) row["comm_seconds"] = l.seconds;
    rows.push_back(row);
  }
  return {{"gpus_per_node", PerNode(in)}, {"tp", in.tp}, {"pp", in.pp}, {"shard_group", Shards(in)}, {"by_shard_group", rows},
          {"recommended_shard_group", best > 0 ? nlohmann::json(best) : nlohmann::json(nullptr)}};
}

nlohmann::json MemoryJson(const Memory& mem, double cap) {
  return {{"params", mem.params}, {"grads", mem.grads}, {"optimizer", mem.optim}, {"model_states", mem.states()},
          {"working_set", mem.working}, {"buckets", mem.buckets}, {"activations", mem.act}, {"total", mem.device()},
          {"capacity", cap}};
}

// What the planner finds for one input: the given configuration's memory (and with recomputation),
// the cheapest configuration that fits, the traffic and time; `json` holds all of it.
struct Estimate {
  Memory mem, mem_rc;
  std::optional<Config> best;
  std::vector<std::string> left_out;
  double comm = 0, t_rc = 0, t_plain = 0;
  nlohmann::json json;
};

Status CheckInput(const PlanInput& in) {
  if (in.arch != "gpt" && in.arch != "llama") return InvalidArgumentError("plan: --arch must be gpt or llama, got '", in.arch, "'");
  if (in.gpus < 1) return InvalidArgumentError("plan: --gpus must be >= 1, got ", in.gpus);
  if (in.stage < 0 || in.stage > 3) return InvalidArgumentError("plan: --stage must be 0..3, got ", in.stage);
  if (in.shard_group < 0 || (in.shard_group > 0 && in.gpus % in.shard_group != 0)) {
    return InvalidArgumentError("plan: --shard-group must divide --gpus (", in.gpus, "), got ", in.shard_group);
  }
  if (in.stage == 0 && in.shard_group > 0 && in.shard_group != in.gpus) return InvalidArgumentError("plan: stage 0 shards nothing (--shard-group)");
  if (in.quantized_weights && in.stage != 3) return InvalidArgumentError("plan: --quantized-weights needs stage 3");
  if (in.quantized_gradients && in.stage == 0) return InvalidArgumentError("plan: --quantized-gradients needs stage 1-3");
  if (in.quantization_block < 0) return InvalidArgumentError("plan: --quantization-block must be >= 0 (0: each width's own)");
  if (in.quantized_gradient_bits != 8 && in.quantized_gradient_bits != 4) {
    return InvalidArgumentError("plan: --quantized-gradient-bits must be 8 or 4, got ", in.quantized_gradient_bits);
  }
  if (in.quantized_gradients && in.quantized_gradient_bits == 4 && in.quantization_block % 2 != 0) {
    return InvalidArgumentError("plan: --quantization-block must be even with --quantized-gradient-bits 4 (two codes a byte), got ",
                                in.quantization_block);
  }
  if (in.secondary_shard_group != 0 && (in.stage != 3 || Secondary(in, Shards(in)) == 0)) {
    return InvalidArgumentError("plan: --secondary-shard-group (hpZ) needs stage 3 and 2 <= P < the shard group's ", Shards(in),
                                " devices, dividing it; got ", in.secondary_shard_group);
  }
  if (in.tp < 1 || in.pp < 1) return InvalidArgumentError("plan: --tp and --pp must be >= 1");
  if (in.intra_gbps < 0 || in.inter_gbps < 0) return InvalidArgumentError("plan: --intra-gbps and --inter-gbps must be >= 0");
  for (const std::string* o : {&in.offload, &in.offload_params}) {
    if (*o != "none" && *o != "cpu" && *o != "nvme") return InvalidArgumentError("plan: offload must be none, cpu or nvme, got '", *o, "'");
  }
  if (in.offload != "none" && in.stage < 1) return InvalidArgumentError("plan: optimizer offload needs stage 1, 2 or 3 (the state is sharded)");
  if (in.offload_params != "none" && in.stage != 3) return InvalidArgumentError("plan: parameter offload needs stage 3");
  if (in.param_bytes != 2 && in.param_bytes != 4) return InvalidArgumentError("plan: parameter dtype must be 2 or 4 bytes");
  RETURN_IF_ERROR(ParsePrecision(in.moments).status(), "plan: --moments");
  if (!in.master && in.param_bytes != 2) return InvalidArgumentError("plan: --master no needs 16-bit (bf16) parameters");
  if (in.q8_block < 8 || in.q8_block > 4096 || (in.q8_block & (in.q8_block - 1)) != 0) return InvalidArgumentError("plan: --q8-block must be a power of two in [8, 4096]");
  if (in.gpu_mem_gib <= 0 || in.cpu_mem_gib < 0 || in.tokens < 0 || in.tflops < 0 || in.power_watts < 0 || in.step_seconds < 0 ||
      in.prefetch_depth < 0 || in.bucket_bytes <= 0 || in.gpus_per_node < 0) {
    return InvalidArgumentError("plan: --gpu-mem and bucket bytes must be > 0; --cpu-mem, --tokens, --tflops, --power, --step-time, "
                                "--prefetch, --gpus-per-node >= 0");
  }
  return Status();
}

Status CheckFailureInput(const PlanInput& in) {
  auto share = [](double v) { return v >= 0 && v <= 1; };
  if (!(in.mttf_hours > 0) || !(in.mtbf_hours >= 0) || !(in.relaunch >= 0) || !share(in.node_loss) || !share(in.tier_miss)) {
    return InvalidArgumentError("plan: --mttf-hours must be > 0, --mtbf-hours and --relaunch >= 0, --node-loss and --tier-miss in [0, 1]");
  }
  for (double gbps : {in.snapshot_gbps, in.disk_write_gbps, in.disk_read_gbps, in.peer_gbps}) {
    if (!(gbps > 0) || !std::isfinite(gbps)) return InvalidArgumentError("plan: --snapshot-gbps, --disk-write-gbps, --disk-read-gbps and --peer-gbps must be > 0");
  }
  if (std::isnan(in.save_slowdown) || in.save_slowdown > 10) return InvalidArgumentError("plan: --save-slowdown must be in [0, 10]");
  for (double s : {in.save_stall, in.disk_write, in.replica_write, in.restart_disk, in.restart_memory, in.restart_replica}) {
    if (std::isnan(s) || !std::isfinite(s)) return InvalidArgumentError("plan: a given save or restart time must be a number of seconds >= 0");
  }
  return Status();
}

Estimate EstimateFor(const PlanInput& in, const Model& m) {
  Estimate e;
  const double cap = in.gpu_mem_gib * double(int64_t{1} << 30);
  const Config given{in.stage, in.offload, in.offload_params, in.recompute, in.batch, Shards(in)};
  e.mem = MemoryFor(in, m, given);
  Config rc = given;
  rc.recompute = true;
  e.mem_rc = MemoryFor(in, m, rc);
  // The cheapest configuration that fits, with the largest micro-batch up to --batch that does.
  for (Config c : Candidates()) {
    c.shards = Shards(in);
    for (int64_t b = m.shape ? in.batch : 1; b >= 1 && !e.best; b /= 2) {
      c.batch = b;
      if (Fits(in, MemoryFor(in, m, c))) e.best = c;
    }
    if (e.best) break;
  }
  e.left_out = {"the framework's own device memory (CUDA context, allocator fragmentation)",
                in.tp * in.pp > 1 ? "tensor and pipeline parallelism's own buffers and communication (the model per device is divided by TP x PP)"
                                  : "tensor, sequence and pipeline parallelism (data parallelism only)"};
  if (!m.shape) e.left_out.push_back("activations (give the transformer shape: --layers --hidden --heads --seq --vocab)");
  if (m.shape) e.left_out.push_back("the output logits and loss (s x b x vocab, 4 bytes each in fp32) and the embedding's output");
  if (in.stage >= 2 && m.largest == 0) e.left_out.push_back("the gathered layers and per-layer gradients (give --largest-layer)");
  if (in.offload == "nvme" || in.offload_params == "nvme") e.left_out.push_back("NVMe swap buffers in host memory (bounded by offload.host_budget_bytes)");

  const double n = in.gpus;
  const Links links = LinksFor(in, m, Shards(in));
  e.comm = links.inside + links.across;
  const double flops = in.tflops * 1e12;
  e.t_rc = flops > 0 ? 8.0 * m.psi * in.tokens / (n * flops) : 0;
  e.t_plain = flops > 0 ? 6.0 * m.psi * in.tokens / (n * flops) : 0;
  nlohmann::json& j = e.json;
  j = {
      {"units", "bytes (GB = 1e9 bytes, GiB = 2^30 bytes); seconds"},
      {"params", m.psi}, {"largest_layer", m.largest}, {"gpus", in.gpus}, {"gpus_per_node", PerNode(in)}, {"stage", in.stage},
      {"offload", in.offload}, {"offload_params", in.offload_params}, {"micro_batch", in.batch}, {"recompute", in.recompute},
      {"moments", in.moments}, {"master", in.master},
      {"device", MemoryJson(e.mem, cap)}, {"device_with_recompute", MemoryJson(e.mem_rc, cap)},
      {"host", e.mem.host}, {"host_per_node", e.mem.host * PerNode(in)}, {"nvme", e.mem.nvme},
      {"fits", Fits(in, e.mem)}, {"fits_with_recompute", Fits(in, e.mem_rc)},
      {"left_out", e.left_out}, {"comm_bytes_per_step", e.comm}, {"deepspeed", DeepSpeedEstimate(in, m)},
      {"mesh", MeshJson(in, m)},
      {"model_state", {{"params", e.mem.state[0]}, {"grads", e.mem.state[1]}, {"optimizer", e.mem.state[2]}}},
  };
  // Kept for scripts written against the first version.
  j["device"]["activations_recompute"] = e.mem_rc.act;
  if (e.best) {
    const Memory bm = MemoryFor(in, m, *e.best);
    j["recommendation"] = {{"stage", e.best->stage}, {"offload", e.best->offload}, {"offload_params", e.best->offload_params},
                           {"recompute", e.best->recompute}, {"micro_batch", e.best->batch}, {"device_total", bm.device()},
                           {"host_per_node", bm.host * PerNode(in)}};
  } else {
    j["recommendation"] = nullptr;
  }
  if (in.step_seconds > 0) j["bandwidth_to_hide_comm"] = e.comm / in.step_seconds;
  if (flops > 0 && in.tokens > 0) {
    j["train_seconds"] = {{"with_recompute", e.t_rc}, {"without_recompute", e.t_plain}};
    if (in.power_watts > 0) j["energy_kwh"] = {{"with_recompute", e.t_rc * n * in.power_watts / 3.6e6}, {"without_recompute", e.t_plain * n * in.power_watts / 3.6e6}};
  }
  return e;
}

// What failures cost this plan: the job's MTBF, the per-device costs and where they come from, the
// prediction for disk only and for the memory tier beside the disk.
struct Failures {
  double mtbf = 0, bytes = 0;
  double written = 0;  // what a device writes of a save: its shard's part (a save spread over the R replicas)
  int replicas = 1;     // R: the devices holding each shard (>= 2: the tier's peer copies are these live replicas)
  std::string source;
  GoodputInput input;
  Goodput goodput;
};

Result<Failures> FailuresFor(const PlanInput& in, const Model& m, const Estimate& e) {
  Failures f;
  f.mtbf = in.mtbf_hours > 0 ? in.mtbf_hours * 3600 : in.mttf_hours * 3600 / in.gpus;
  // A checkpoint stores the state as it is kept: the two moments and the master (without one, the
  // parameters in their dtype).
  // Each shard is saved once, written in parts by the R = N / S ranks holding it (at most 256 parts),
  // and each rank loads its own: the model per device over the shard group, written over the replicas.
  // At stage 0 every device holds the whole state (R = N replicas of one shard).
  const int shards = in.stage == 0 ? 1 : Shards(in);
  f.replicas = in.gpus / shards;
  f.bytes = (2 * MomentBytes(in) + (in.master ? 4 : in.param_bytes)) * m.psi / (in.tp * in.pp) / shards;
  f.written = f.bytes / std::min(256, f.replicas);
  BenchRates r{.disk_snapshot = in.snapshot_gbps * 1e9, .disk_write = in.disk_write_gbps * 1e9, .disk_read = in.disk_read_gbps * 1e9,
               .tier_snapshot = in.snapshot_gbps * 1e9, .tier_replica = in.peer_gbps * 1e9, .own_load = in.snapshot_gbps * 1e9,
               .replica_load = in.peer_gbps * 1e9};
  f.source = "bandwidths";
  if (!in.from_bench.empty()) {
    ASSIGN_OR_RETURN(r, ReadBenchRates(in.from_bench, f.replicas >= 2), "plan --from-bench");
    f.source = "bench " + in.from_bench + (r.recovery_hybrid ? " (the tier's rates: its hybrid run)" : "");
  }
  FailureCosts& c = f.input.costs;
  auto given = [](double seconds, double computed) { return seconds >= 0 ? seconds : computed; };
  c.disk_stall = given(in.save_stall, f.bytes / r.disk_snapshot);
  c.tier_stall = given(in.save_stall, f.bytes / r.tier_snapshot);
  c.disk_write = given(in.disk_write, f.written / r.disk_write);
  // Live replicas: no replica is sent, a generation is restorable once its snapshots are whole.
  c.tier_write = given(in.replica_write, f.replicas >= 2 ? 0 : f.bytes / r.tier_replica);
  c.disk_restart = given(in.restart_disk, f.bytes / r.disk_read);
  c.own_restart = given(in.restart_memory, f.bytes / r.own_load);
  c.replica_restart = given(in.restart_replica, f.bytes / r.replica_load);
  c.relaunch = in.relaunch;
  f.input.mtbf_seconds = f.mtbf;
  f.input.slowdown = in.save_slowdown >= 0 ? in.save_slowdown : r.slowdown;
  f.input.node_loss = in.node_loss;
  f.input.tier_miss = in.tier_miss;
  f.input.step_seconds = in.step_seconds;
  f.input.compute_seconds = in.recompute ? e.t_rc : e.t_plain;
  f.goodput = PredictGoodput(f.input);
  return f;
}

nlohmann::json FailuresJson(const Failures& f) {
  auto num = [](double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); };  // null: never / none
  auto scenario = [&](const Scenario& s, bool tier) {
    nlohmann::json j = {{"disk_interval_seconds", num(s.disk_interval)}, {"save_stall_share", s.save_share},
                        {"work_lost_per_failure_seconds", s.work_lost}, {"stall_per_failure_seconds", s.stall}, {"ettr", s.ettr}};
    if (tier) j["tier_interval_seconds"] = num(s.tier_interval);
    if (f.input.compute_seconds > 0) j["train_days"] = num(s.wall_seconds / 86400), j["failures"] = num(s.failures);
    return j;
  };
  const FailureCosts& c = f.input.costs;
  return {{"mtbf_hours", f.mtbf / 3600}, {"checkpoint_bytes_per_device", f.bytes}, {"checkpoint_written_bytes_per_device", f.written},
          {"replicas", f.replicas}, {"costs_from", f.source},
          {"node_loss", f.input.node_loss}, {"tier_miss", f.input.tier_miss}, {"save_slowdown", f.input.slowdown},
          {"costs_seconds", {{"disk_stall", c.disk_stall}, {"disk_write", c.disk_write}, {"tier_stall", c.tier_stall},
                             {"tier_write", c.tier_write}, {"restart_disk", c.disk_restart}, {"restart_memory", c.own_restart},
                             {"restart_replica", c.replica_restart}, {"relaunch", c.relaunch}}},
          {"disk_only", scenario(f.goodput.disk_only, false)}, {"memory_tier_own_copies", scenario(f.goodput.own_copies, true)},
          {"memory_tier", scenario(f.goodput.with_tier, true)}};
}

std::string Duration(double s) {
  if (!std::isfinite(s)) return "never";
  std::ostringstream os;
  os << std::fixed << std::setprecision(s < 10 ? 2 : 1);
  if (s == 0) os << "0 s";
  else if (s < 1) os << std::setprecision(1) << s * 1e3 << " ms";
  else if (s < 120) os << s << " s";
  else if (s < 7200) os << s / 60 << " min";
  else if (s < 3 * 86400) os << s / 3600 << " h";
  else os << s / 86400 << " days";
  return os.str();
}

void PrintFailures(const PlanInput& in, const Failures& f, std::ostream& out) {
  const FailureCosts& c = f.input.costs;
  const auto& [d, o, t] = f.goodput;
  out << "failures: one every " << Duration(f.mtbf);
  if (in.mtbf_hours <= 0) out << " (" << std::setprecision(0) << in.mttf_hours << " device-hours / " << in.gpus << " devices)";
  out << "; checkpoint " << FormatBytes(static_cast<int64_t>(f.bytes)) << " per device";
  if (f.written < f.bytes) out << " (" << FormatBytes(static_cast<int64_t>(f.written)) << " written by each: saves spread over replicas)";
  out << "; costs from " << f.source << "\n"
      << "  save: stall " << Duration(c.disk_stall) << " (tier " << Duration(c.tier_stall) << "), durable on disk after "
      << Duration(c.disk_write) << ", replica whole after " << Duration(c.tier_write)
      << (f.replicas >= 2 && in.replica_write < 0 ? " (the " + std::to_string(f.replicas) + " live replicas: none sent)" : "")
      << "; steps " << f.input.slowdown * 100
      << "% slower meanwhile\n  restart: relaunch " << Duration(c.relaunch)
      << " + load from disk " << Duration(c.disk_restart) << ", own copy " << Duration(c.own_restart) << ", replica "
      << Duration(c.replica_restart) << " (" << f.input.node_loss * 100 << "% of failures lose the node, the tier misses "
      << f.input.tier_miss * 100 << "%)\n" << std::setprecision(3);
  auto row = [&](const char* what, const std::string& a, const std::string& b, const std::string& z) {
    out << "  " << std::left << std::setw(24) << what << std::setw(28) << a << std::setw(30) << b << z << std::right << "\n";
  };
  auto pct = [](double v) {
    std::ostringstream os;
    os << std::fixed << std::setprecision(1) << v * 100 << "%";
    return os.str();
  };
  auto every = [](const Scenario& s) { return "tier " + Duration(s.tier_interval) + ", disk " + Duration(s.disk_interval); };
  row("", "disk only", "tier (own copies) + disk", "tier + replicas + disk");
  row("save every", Duration(d.disk_interval), every(o), every(t));
  row("stalled by saves", pct(d.save_share), pct(o.save_share), pct(t.save_share));
  row("work lost per failure", Duration(d.work_lost), Duration(o.work_lost), Duration(t.work_lost));
  row("stall per failure", Duration(d.stall), Duration(o.stall), Duration(t.stall));
  row("ETTR", pct(d.ettr), pct(o.ettr), pct(t.ettr));
  if (f.input.compute_seconds > 0) {
    auto days = [&](const Scenario& s) {
      std::ostringstream os;
      os << Duration(s.wall_seconds) << ", " << std::fixed << std::setprecision(0) << s.failures << " failures";
      return os.str();
    };
    row("training takes", days(d), days(o), days(t));
  }
}

void PrintPlan(const PlanInput& in, const Model& m, const Estimate& e, std::ostream& out) {
  const double flops = in.tflops * 1e12, n = in.gpus;
  auto b = [](double v) { return FormatBytes(static_cast<int64_t>(v)); };
  out << std::fixed << std::setprecision(3);
  out << "model: " << m.psi / 1e9 << " B parameters (" << (in.param_bytes == 2 ? "16-bit" : "fp32") << " + Adam";
  if (in.moments != "f32" || !in.master) out << ", " << in.moments << " moments" << (in.master ? "" : ", no master");
  out << ")";
  if (m.largest > 0) out << ", largest layer " << m.largest / 1e6 << " M";
  out << "; " << in.gpus << " device(s), ZeRO stage " << in.stage;
  if (Shards(in) < in.gpus && in.stage > 0) out << " in shard groups of " << Shards(in) << " (" << in.gpus / Shards(in) << " replicas)";
  if (in.secondary_shard_group > 0) out << ", the backward's gathers over " << in.secondary_shard_group << " devices (hpZ)";
  if (in.quantized_weights || in.quantized_gradients) {
    const std::string qg = "int" + std::to_string(in.quantized_gradient_bits) + " reductions (qgZ)";
    if (in.quantized_weights && in.quantized_gradients && in.quantized_gradient_bits == 8) {
      out << ", int8 gathers and reductions (qwZ, qgZ)";
    } else {
      out << ", " << (in.quantized_weights ? in.quantized_gradients ? "int8 gathers (qwZ), " + qg : "int8 gathers (qwZ)" : qg);
    }
  }
  if (in.tp * in.pp > 1) out << ", TP " << in.tp << " x PP " << in.pp;
  out << ", offload " << in.offload;
  if (in.stage == 3) out << ", parameters offload " << in.offload_params;
  out << "\nper device:  params " << b(e.mem.params) << "   grads " << b(e.mem.grads) << "   optimizer " << b(e.mem.optim)
      << "   model states " << b(e.mem.states()) << "\n             working set " << b(e.mem.working) << "   buckets " << b(e.mem.buckets);
  if (m.shape) {
    out << "   activations " << b(e.mem.act) << " (micro-batch " << in.batch << ", seq " << in.seq << (in.recompute ? ", recomputed" : "")
        << "; recomputed " << b(e.mem_rc.act) << ")";
  }
  out << "\n             total " << b(e.mem.device()) << " of " << in.gpu_mem_gib << " GiB: " << (Fits(in, e.mem) ? "fits" : "does NOT fit");
  if (m.shape && !in.recompute) out << "; with recomputation " << (Fits(in, e.mem_rc) ? "fits" : "does not fit");
  out << "\n";
  if (e.mem.host > 0) out << "host memory: " << b(e.mem.host) << " per device, " << b(e.mem.host * PerNode(in)) << " per node of " << PerNode(in) << "\n";
  if (e.mem.nvme > 0) out << "NVMe: " << b(e.mem.nvme) << " per device\n";
  out << "left out:";
  for (const std::string& l : e.left_out) out << "\n  - " << l;
  out << "\n";
  if (e.best) {
    out << "recommended (the cheapest that fits): stage " << e.best->stage << ", offload " << e.best->offload;
    if (e.best->stage == 3) out << ", parameters offload " << e.best->offload_params;
    out << ", " << (e.best->recompute ? "with" : "no") << " recomputation";
    if (m.shape) out << ", micro-batch " << e.best->batch;
    out << " (" << b(MemoryFor(in, m, *e.best).device()) << " per device)\n";
  } else {
    out << "nothing fits in " << in.gpu_mem_gib << " GiB per device, even at stage 3 with everything on NVMe and recomputation\n";
  }
  const auto& ds = e.json["deepspeed"];
  out << "DeepSpeed's estimator for the same model (per GPU / per node CPU): zero2 offload "
      << b(ds["zero2"][0]["gpu"].get<double>()) << " / " << b(ds["zero2"][0]["cpu"].get<double>()) << ", no offload "
      << b(ds["zero2"][1]["gpu"].get<double>()) << " / " << b(ds["zero2"][1]["cpu"].get<double>());
  if (!ds["zero3"].empty()) {
    out << "; zero3 (zero_init) none " << b(ds["zero3"][4]["gpu"].get<double>()) << ", optimizer cpu " << b(ds["zero3"][2]["gpu"].get<double>())
        << ", all cpu " << b(ds["zero3"][0]["gpu"].get<double>());
  }
  const auto& mesh = e.json["mesh"];
  const Links links = LinksFor(in, m, Shards(in));
  out << "\ncommunication per step per device: " << e.comm / 1e9 << " GB (inside a node " << links.inside / 1e9 << ", across nodes "
      << links.across / 1e9 << ")";
  if (links.seconds > 0) out << ", " << links.seconds << " s at " << in.intra_gbps << " / " << in.inter_gbps << " GB/s";
  if (in.step_seconds > 0) out << "; to hide it in a " << in.step_seconds << " s step: " << e.comm / in.step_seconds / 1e9 << " GB/s";
  out << "\n";
  if (in.stage > 0 && in.gpus > 1) {
    out << "shard group sizes (S devices shard, gpus / S replicate; " << PerNode(in) << " per node):\n";
    for (const auto& row : mesh["by_shard_group"]) {
      out << "  S=" << std::setw(6) << row["shard_group"].get<int>() << "  device " << std::setw(10) << b(row["device_total"].get<double>())
          << (row["fits"].get<bool>() ? " (fits)        " : " (does NOT fit)") << "  inside " << std::setw(9) << row["inside_node_bytes"].get<double>() / 1e9
          << " GB  across " << std::setw(9) << row["across_nodes_bytes"].get<double>() / 1e9 << " GB";
      if (row.contains("comm_seconds")) out << "  " << row["comm_seconds"].get<double>() << " s";
      out << "\n";
    }
    if (mesh["recommended_shard_group"].is_null()) out << "  no shard group size fits\n";
    else out << "  recommended: --shard-group " << mesh["recommended_shard_group"].get<int>() << " (the least time across nodes that fits)\n";
  }
  if (flops > 0 && in.tokens > 0) {
    out << "training " << in.tokens / 1e9 << " B tokens at " << in.tflops << " TFLOP/s per device: " << e.t_rc / 86400
        << " days with recomputation (8PT/NX), " << e.t_plain / 86400 << " days without (6PT/NX)\n";
    if (in.power_watts > 0) {
      out << "energy at " << in.power_watts << " W per device: " << e.t_rc * n * in.power_watts / 3.6e6 << " kWh ("
          << e.t_plain * n * in.power_watts / 3.6e6 << " without recomputation)\n";
    }
  }
}

}  // namespace

Status Plan(const PlanInput& in, bool as_json, std::ostream& out) {
  ASSIGN_OR_RETURN(Model m, ModelOf(in));
  RETURN_IF_ERROR(CheckInput(in));
  RETURN_IF_ERROR(CheckFailureInput(in));
  Estimate e = EstimateFor(in, m);
  ASSIGN_OR_RETURN(const Failures f, FailuresFor(in, m, e));
  e.json["failures"] = FailuresJson(f);
  if (as_json) {
    out << e.json.dump(1) << "\n";
  } else {
    PrintPlan(in, m, e, out);
    PrintFailures(in, f, out);
  }
  if (!e.best) return FailedPreconditionError("plan: no configuration fits in ", in.gpu_mem_gib, " GiB per device");
  return Status();
}

}  // namespace zrt::tools
