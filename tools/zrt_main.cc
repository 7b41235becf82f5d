// zrt: command-line entry point. Each subcommand parses its arguments and calls a library function
// (tools/lib) that writes to std::ostream and returns Status. Exit codes (docs/cli.md): 0 ok, 1 a
// problem found (or any error), 2 usage — every option value is checked here, so a bad one is usage;
// 141 when the reader of the output went away (tools/lib/output.h).
#include <CLI/CLI.hpp>

#include <cmath>
#include <algorithm>
#include <csignal>
#include <iostream>
#include <thread>

#include <unistd.h>

#include "zrt/core/logging.h"
#include "tools/lib/ckpt_commands.h"
#include "tools/lib/output.h"
#include "tools/lib/plan.h"

namespace {

int Report(const zrt::Status& s) {
  if (s.ok()) return 0;
  std::cerr << "zrt: " << s.message() << "\n";
  return 1;
}

// "--world-size 0" should read "must be at least 1", not CLI11's range of doubles.
CLI::Validator AtLeast(int lo) {
  return CLI::Validator(
      [lo](std::string& v) -> std::string {
        try {
          size_t used = 0;
          const long long x = std::stoll(v, &used);
          if (used == v.size() && x >= lo && x <= (1 << 24)) return "";
        } catch (const std::exception&) {
        }
        return "must be an integer >= " + std::to_string(lo) + ", got '" + v + "'";
      },
      ">= " + std::to_string(lo));
}

// A number > 0 (CLI::PositiveNumber's message prints the range of doubles).
CLI::Validator Positive() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        try {
          size_t used = 0;
          const double x = std::stod(v, &used);
          if (used == v.size() && x > 0 && std::isfinite(x)) return "";
        } catch (const std::exception&) {
        }
        return "must be a number > 0, got '" + v + "'";
      },
      "> 0");
}

// A number in [lo, hi] (seconds, shares).
CLI::Validator Between(double lo, double hi, const std::string& range) {
  return CLI::Validator(
      [lo, hi, range](std::string& v) -> std::string {
        try {
          size_t used = 0;
          const double x = std::stod(v, &used);
          if (used == v.size() && x >= lo && x <= hi && std::isfinite(x)) return "";
        } catch (const std::exception&) {
        }
        return "must be a number " + range + ", got '" + v + "'";
      },
      range);
}

// "5G", "512M", "1048576": bytes.
CLI::Validator ByteSize() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        try {
          size_t used = 0;
          const double x = std::stod(v, &used);
          std::string unit = v.substr(used);
          const double mult = unit.empty() || unit == "B" ? 1 : unit == "K" || unit == "KiB" ? 1024.0 : unit == "M" || unit == "MiB" ? 1048576.0
                              : unit == "G" || unit == "GiB" ? 1073741824.0 : -1;
          if (mult > 0 && x * mult >= 1 && x * mult < 9e18) {
            v = std::to_string(static_cast<long long>(x * mult));
            return "";
          }
        } catch (const std::exception&) {
        }
        return "must be a size such as 5G, 512M or 1048576, got '" + v + "'";
      },
      "SIZE");
}

// Every command's options, filled by CLI11.
struct Args {
  bool version = false, json = false;
  std::string root, dir, tensor, out_dir, other, max_shard;
  bool stats = false;
  int world = 0, rstage = -1, rthreads = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u));
  zrt::tools::ExportArgs ea;
  zrt::tools::ImportArgs ia;
  zrt::tools::PlanInput pi;
  std::string dtype = "bf16", master = "yes";
  CLI::App *ls = nullptr, *inspect = nullptr, *verify = nullptr, *reshard = nullptr, *exp = nullptr, *imp = nullptr, *diff = nullptr,
           *plan = nullptr;
};

void AddCkptCommands(CLI::App& app, Args& a) {
  CLI::App* ckpt = app.add_subcommand("ckpt", "checkpoint commands: ls, inspect, verify, reshard, diff, export, import");
  ckpt->require_subcommand(1);
  ckpt->add_flag("--json", a.json, "machine-readable output");
  a.ls = ckpt->add_subcommand("ls", "checkpoints under a root: complete or not (and why), step, size, age");
  a.ls->add_option("ROOT", a.root, "checkpoint root")->required();
  a.inspect = ckpt->add_subcommand("inspect", "what a checkpoint holds");
  a.inspect->add_option("DIR", a.dir, "checkpoint directory, or a root (its newest complete checkpoint)")->required();
  a.inspect->add_option("--tensor", a.tensor, "only tensors whose name contains this");
  a.inspect->add_flag("--stats", a.stats, "min/max/mean/std/L2/NaN/Inf of the fp32 master weights per tensor");
  a.verify = ckpt->add_subcommand("verify", "re-read every chunk and check every checksum (exit 1 on any problem)");
  a.verify->add_option("DIR", a.dir, "checkpoint directory, or a root (its newest complete checkpoint)")->required();
  a.reshard = ckpt->add_subcommand("reshard", "write a copy laid out for another number of ranks");
  a.reshard->add_option("DIR", a.dir, "checkpoint directory, or a root (its newest complete checkpoint)")->required();
  a.reshard->add_option("OUT", a.out_dir, "output root (the step directory is created inside)")->required();
  a.reshard->add_option("--world-size", a.world, "ranks of the new layout")->required()->check(AtLeast(1));
  a.reshard->add_option("--stage", a.rstage, "stage to record (default: as saved; 0 gives one shard file)")->check(CLI::IsMember({0, 1, 2, 3}));
  a.reshard->add_option("--threads", a.rthreads, "shards built at once (memory: a few chunks each; default: the cores, at most 8)")
      ->check(AtLeast(1))->capture_default_str();

  a.exp = ckpt->add_subcommand("export", "consolidated, unsharded tensors as safetensors or HDF5");
  a.exp->add_option("DIR", a.dir, "checkpoint directory, or a root (its newest complete checkpoint)")->required();
  a.exp->add_option("OUT", a.out_dir, "output: X.safetensors (sharded above --max-shard-size) or X.h5")->required();
  a.exp->add_option("--format", a.ea.format, "safetensors | hdf5 (default: from OUT's extension)")->check(CLI::IsMember({"safetensors", "hdf5"}));
  a.exp->add_option("--states", a.ea.states, "params | all (with the optimizer state)")->check(CLI::IsMember({"params", "all"}))->capture_default_str();
  a.exp->add_option("--dtype", a.ea.dtype, "model | f32 | bf16 | f16 (default: safetensors the model's dtype, f32 with --states all; HDF5 f32)")
      ->check(CLI::IsMember({"model", "f32", "bf16", "f16"}));
  a.exp->add_option("--max-shard-size", a.max_shard, "safetensors: largest file before sharding (default 5G)")->transform(ByteSize());
  a.exp->add_option("--name-map", a.ea.name_map, "safetensors: JSON file of names, checkpoint -> file (null drops a tensor)");
  a.exp->add_option("--rename", a.ea.renames, "safetensors: FROM=TO, a name prefix rule (repeatable)");
  a.imp = ckpt->add_subcommand("import", "a safetensors or HDF5 model into a checkpoint for M ranks");
  a.imp->add_option("IN", a.dir, "X.safetensors, X.safetensors.index.json, a directory holding one, or X.h5")->required();
  a.imp->add_option("OUT", a.out_dir, "output root (the step directory is created inside)")->required();
  a.imp->add_option("--world-size", a.ia.world_size, "ranks of the new layout")->required()->check(AtLeast(1));
  a.imp->add_option("--stage", a.ia.stage, "stage recorded (0 gives one shard file)")->check(CLI::IsMember({0, 1, 2, 3}))->capture_default_str();
  a.imp->add_option("--format", a.ia.format, "safetensors | hdf5 (default: from IN's name)")->check(CLI::IsMember({"safetensors", "hdf5"}));
  a.imp->add_option("--name-map", a.ia.name_map, "safetensors: JSON file of names, file -> checkpoint (null drops a tensor)");
  a.imp->add_option("--rename", a.ia.renames, "safetensors: FROM=TO, a name prefix rule (repeatable)");
  a.diff = ckpt->add_subcommand("diff", "per-tensor max abs/rel difference of two checkpoints (exit 1 if they differ)");
  a.diff->add_option("A", a.dir, "checkpoint directory, or a root (its newest complete checkpoint)")->required();
  a.diff->add_option("B", a.other, "checkpoint directory, or a root")->required();
  for (CLI::App* c : {a.ls, a.inspect, a.verify, a.reshard, a.exp, a.imp, a.diff}) c->add_flag("--json", a.json, "machine-readable output");
}

// zrt plan's failure model and per-device costs (docs/cli.md "Failures and goodput").
void AddFailureOptions(CLI::App* plan, zrt::tools::PlanInput& pi) {
  const std::string g = "Failures and goodput (seconds and rates per device)";
  const CLI::Validator seconds = Between(0, 1e300, ">= 0"), share = Between(0, 1, "in [0, 1]");
  plan->add_option("--mttf-hours", pi.mttf_hours, "per-device mean time to failure (Meta: 1.8 h at 16,384 GPUs)")
      ->check(Positive())->capture_default_str()->group(g);
  plan->add_option("--mtbf-hours", pi.mtbf_hours, "the job's mean time between failures (instead of --mttf-hours / --gpus)")
      ->check(Positive())->group(g);
  plan->add_option("--node-loss", pi.node_loss, "share of failures that lose the node (restart from a replica; Llama 3: 0.78)")
      ->check(share)->capture_default_str()->group(g);
  plan->add_option("--tier-miss", pi.tier_miss, "share of failures the memory tier cannot serve (restart from disk)")
      ->check(share)->capture_default_str()->group(g);
  plan->add_option("--relaunch", pi.relaunch, "seconds of every restart before loading: scheduling, processes, communicators")
      ->check(seconds)->capture_default_str()->group(g);
  plan->add_option("--snapshot-gbps", pi.snapshot_gbps, "GB/s: device to host (a save's stall) and back (restart from the own copy)")
      ->check(Positive())->capture_default_str()->group(g);
  plan->add_option("--disk-write-gbps", pi.disk_write_gbps, "GB/s written to the checkpoint storage (Llama 3: 2 TB/s / 16,384 GPUs)")
      ->check(Positive())->capture_default_str()->group(g);
  plan->add_option("--disk-read-gbps", pi.disk_read_gbps, "GB/s read from it at a restart (Llama 3: 7 TB/s peak / 16,384 GPUs)")
      ->check(Positive())->capture_default_str()->group(g);
  plan->add_option("--peer-gbps", pi.peer_gbps, "GB/s to and from a peer node (the memory tier's replica)")
      ->check(Positive())->capture_default_str()->group(g);
  plan->add_option("--from-bench", pi.from_bench, "the rates measured by ./scripts/bench (its RESULT lines: build/bench-results.tsv)")
      ->group(g);
  plan->add_option("--save-slowdown", pi.save_slowdown, "steps slower by this fraction while a save is written (default 0.05, or measured)")
      ->check(Between(0, 10, "in [0, 10]"))->group(g);
  plan->add_option("--save-stall", pi.save_stall, "seconds a save stalls training (both tiers)")->check(seconds)->group(g);
  plan->add_option("--disk-write", pi.disk_write, "seconds from a save's snapshot to durable on disk")->check(seconds)->group(g);
  plan->add_option("--replica-write", pi.replica_write, "seconds from a tier snapshot to its replica whole")->check(seconds)->group(g);
  plan->add_option("--restart-disk", pi.restart_disk, "seconds to load the state from disk")->check(seconds)->group(g);
  plan->add_option("--restart-memory", pi.restart_memory, "seconds to load it from the node's own copy")->check(seconds)->group(g);
  plan->add_option("--restart-replica", pi.restart_replica, "seconds to load it from a peer's replica")->check(seconds)->group(g);
}

void AddPlanCommand(CLI::App& app, Args& a) {
  zrt::tools::PlanInput& pi = a.pi;
  CLI::App* plan = a.plan = app.add_subcommand(
      "plan", "memory per device, what is left out, DeepSpeed's estimate and the cheapest configuration that fits (exit 1 if none)");
  plan->add_option("--params", pi.params, "parameters (or give the transformer shape below)")->check(Positive());
  plan->add_option("--largest-layer", pi.largest_layer, "parameters of the largest layer (stage-3 working set; from the shape if given)");
  plan->add_option("--arch", pi.arch, "gpt (4h GELU MLP, learned positions, tied embeddings) | llama (SwiGLU, rotary, untied)")
      ->check(CLI::IsMember({"gpt", "llama"}))->capture_default_str();
  plan->add_option("--layers", pi.layers, "transformer layers");
  plan->add_option("--hidden", pi.hidden, "hidden size");
  plan->add_option("--heads", pi.heads, "attention heads");
  plan->add_option("--kv-heads", pi.kv_heads, "key/value heads, grouped-query attention (default: --heads)");
  plan->add_option("--ffn", pi.ffn, "MLP width (default: gpt 4 x hidden, llama 8/3 x hidden rounded up to 256)");
  plan->add_option("--seq", pi.seq, "sequence length")->capture_default_str();
  plan->add_option("--batch", pi.batch, "micro-batch per device (the largest the recommendation tries)")->check(AtLeast(1))->capture_default_str();
  plan->add_option("--vocab", pi.vocab, "vocabulary size")->capture_default_str();
  plan->add_option("--gpus", pi.gpus, "data-parallel devices")->check(AtLeast(1))->capture_default_str();
  plan->add_option("--gpus-per-node", pi.gpus_per_node, "devices per node (host memory per node; default min(gpus, 8))")->check(AtLeast(1));
  plan->add_option("--stage", pi.stage, "ZeRO stage 0..3")->check(CLI::IsMember({0, 1, 2, 3}))->capture_default_str();
  plan->add_option("--shard-group", pi.shard_group, "hybrid sharding: devices per shard group, replicated across (default: all --gpus)")
      ->check(AtLeast(1));
  plan->add_flag("--quantized-weights", pi.quantized_weights, "stage 3: parameter gathers as int8 codes (qwZ; EngineConfig::quantized_weights)");
  plan->add_flag("--quantized-gradients", pi.quantized_gradients, "stages 1-3: gradient reduce-scatters as int8 codes (qgZ)");
  plan->add_option("--quantized-gradient-bits", pi.quantized_gradient_bits, "qgZ's codes: 8 or 4 bits (EngineConfig::quantized_gradient_bits)")
      ->check(CLI::IsMember({4, 8}))
      ->capture_default_str();
  plan->add_option("--secondary-shard-group", pi.secondary_shard_group,
                   "stage 3: a secondary copy of the parameters over this many devices (a node), the backward's gathers inside it "
                   "(hpZ; EngineConfig::secondary_shard_group)")
      ->check(AtLeast(2));
  plan->add_option("--quantization-block", pi.quantization_block, "values per f32 scale of qwZ / qgZ (0: 256 for int8, 64 for int4)")
      ->check(AtLeast(0))
      ->capture_default_str();
  plan->add_option("--tp", pi.tp, "tensor-parallel degree: the model per device is divided by TP x PP")->check(AtLeast(1))->capture_default_str();
  plan->add_option("--pp", pi.pp, "pipeline-parallel degree")->check(AtLeast(1))->capture_default_str();
  plan->add_option("--intra-gbps", pi.intra_gbps, "GB/s per device inside a node (with --inter-gbps: communication time per step)")
      ->check(CLI::NonNegativeNumber);
  plan->add_option("--inter-gbps", pi.inter_gbps, "GB/s per device across nodes")->check(CLI::NonNegativeNumber);
  plan->add_option("--offload", pi.offload, "optimizer state: none | cpu | nvme (stages 1-3)")->check(CLI::IsMember({"none", "cpu", "nvme"}))->capture_default_str();
  plan->add_option("--offload-params", pi.offload_params, "stage-3 parameter shards: none | cpu | nvme")
      ->check(CLI::IsMember({"none", "cpu", "nvme"}))->capture_default_str();
  plan->add_flag("--recompute", pi.recompute, "full activation recomputation");
  plan->add_flag("--flash-attention", pi.flash_attention, "attention scores are never stored (FlashAttention)");
  plan->add_flag("--fp32-grads", pi.fp32_grads, "4-byte gradients (EngineConfig::fp32_grads)");
  plan->add_option("--prefetch", pi.prefetch_depth, "stage 3: layers gathered ahead (EngineConfig::prefetch_depth)")->capture_default_str();
  plan->add_option("--moments", pi.moments, "Adam moments: f32, bf16, q8 or q4 (8- or 4-bit block-wise; EngineConfig::state)")
      ->check(CLI::IsMember({"f32", "bf16", "q8", "q4"}))->capture_default_str();
  plan->add_option("--master", a.master, "an fp32 master copy of the parameters: yes, or no (bf16 models)")
      ->check(CLI::IsMember({"yes", "no"}))->capture_default_str();
  plan->add_option("--dtype", a.dtype, "parameter dtype")->check(CLI::IsMember({"bf16", "f16", "fp16", "f32", "fp32"}))->capture_default_str();
  plan->add_option("--gpu-mem", pi.gpu_mem_gib, "device memory, GiB")->check(Positive())->capture_default_str();
  plan->add_option("--cpu-mem", pi.cpu_mem_gib, "host memory per node, GiB (0: not checked)")->capture_default_str();
  plan->add_option("--step-time", pi.step_seconds, "step time in seconds (bandwidth needed to hide communication; save intervals in whole steps)");
  plan->add_option("--tokens", pi.tokens, "training tokens");
  plan->add_option("--tflops", pi.tflops, "achieved TFLOP/s per device");
  plan->add_option("--power", pi.power_watts, "watts per device (energy)");
  plan->add_flag("--json", a.json, "machine-readable output");
  AddFailureOptions(plan, pi);
}

// Runs the command that was parsed.
int Dispatch(CLI::App& app, Args& a) {
  // A root where a checkpoint directory is expected: its newest complete checkpoint, said on stderr.
  auto resolve = [&](std::string& d) -> zrt::Status {
    ASSIGN_OR_RETURN(std::string chosen, zrt::tools::ResolveCheckpointDir(d));
    if (chosen != d) std::cerr << "zrt: " << d << " is a checkpoint root: using its newest complete checkpoint " << chosen << "\n";
    d = chosen;
    return zrt::Status();
  };
  if (*a.ls) return Report(zrt::tools::CkptLs(a.root, a.json, std::cout));
  if (*a.inspect || *a.verify || *a.reshard || *a.exp || *a.diff) {
    if (zrt::Status s = resolve(a.dir); !s.ok()) return Report(s);
  }
  if (*a.diff) {
    if (zrt::Status s = resolve(a.other); !s.ok()) return Report(s);
  }
  if (*a.inspect) return Report(zrt::tools::CkptInspect(a.dir, a.tensor, a.stats, a.json, std::cout));
  if (*a.verify) return Report(zrt::tools::CkptVerify(a.dir, a.json, std::cout));
  if (*a.reshard) return Report(zrt::tools::CkptReshard(a.dir, a.out_dir, a.world, std::cout, a.rstage, a.rthreads, a.json));
  if (*a.diff) return Report(zrt::tools::CkptDiff(a.dir, a.other, a.json, std::cout));
  if (*a.exp) {
    a.ea.json = a.json;
    if (!a.max_shard.empty()) a.ea.max_shard_bytes = std::stoll(a.max_shard);
    return Report(zrt::tools::CkptExport(a.dir, a.out_dir, a.ea, std::cout));
  }
  if (*a.imp) {
    a.ia.json = a.json;
    return Report(zrt::tools::CkptImport(a.dir, a.out_dir, a.ia, std::cout));
  }
  if (*a.plan) {
    if (a.dtype == "f32" || a.dtype == "fp32") a.pi.param_bytes = 4;
    a.pi.master = a.master == "yes";
    return Report(zrt::tools::Plan(a.pi, a.json, std::cout));
  }
  std::cout << app.help();
  return 2;  // no command: usage
}

int Run(int argc, char** argv) {
  zrt::SetLogLevel(zrt::LogLevel::kWarn);
  CLI::App app{"zrt: inspect, verify, reshard, compare and convert ZeRO checkpoints; plan a model's memory and time"};
  app.require_subcommand(0, 1);
  Args a;
  app.add_flag("--version", a.version, "print the version and build features");
  app.add_flag("--json", a.json, "machine-readable output (every command; docs/cli.md)");
  AddCkptCommands(app, a);
  AddPlanCommand(app, a);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (a.version) {
    std::cout << "zrt " << zrt::Version() << " (" << zrt::BuildFeatures() << ")\n";
    return 0;
  }
  return Dispatch(app, a);
}

}  // namespace

int main(int argc, char** argv) {
  // A closed output pipe must not kill a command halfway (it may be writing a checkpoint): write
  // errors are seen by FdOutput instead, and FinishOutput makes them the exit status.
  std::signal(SIGPIPE, SIG_IGN);
  zrt::tools::FdOutput stdout_buffer(STDOUT_FILENO);
  std::streambuf* const previous = std::cout.rdbuf(&stdout_buffer);
  const int status = zrt::tools::FinishOutput(stdout_buffer, Run(argc, argv));
  std::cout.rdbuf(previous);
  return status;
}
