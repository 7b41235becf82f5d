// zrt: command-line entry point. Each subcommand parses its arguments and calls a library function
// (tools/lib) that writes to std::ostream and returns Status. Exit codes: 0 ok, 1 problem found
// (or any error), 2 usage.
#include <CLI/CLI.hpp>

#include <iostream>

#include "zrt/core/logging.h"
#include "zrt/core/version.h"
#include "tools/lib/ckpt_commands.h"
#include "tools/lib/plan.h"

namespace {
int Report(const zrt::Status& s) {
  if (s.ok()) return 0;
  std::cerr << "zrt: " << s.message() << "\n";
  return 1;
}
}  // namespace

int main(int argc, char** argv) {
  zrt::SetLogLevel(zrt::LogLevel::kWarn);
  CLI::App app{"zrt: inspect, verify, reshard and compare ZeRO checkpoints; plan a model's memory and time"};
  app.require_subcommand(0, 1);
  bool version = false, json = false;
  app.add_flag("--version", version, "print the version and build features");
  app.add_flag("--json", json, "machine-readable output");

  CLI::App* ckpt = app.add_subcommand("ckpt", "checkpoint commands");
  ckpt->require_subcommand(1);
  std::string root, dir, tensor, out_dir, other;
  bool stats = false;
  int world = 0;
  CLI::App* ls = ckpt->add_subcommand("ls", "checkpoints under a root: complete or not (and why), step, size, age");
  ls->add_option("ROOT", root, "checkpoint root")->required();
  CLI::App* inspect = ckpt->add_subcommand("inspect", "what a checkpoint holds");
  inspect->add_option("DIR", dir, "checkpoint directory")->required();
  inspect->add_option("--tensor", tensor, "only tensors whose name contains this");
  inspect->add_flag("--stats", stats, "min/max/mean/std/L2/NaN/Inf of the fp32 master weights per tensor");
  CLI::App* verify = ckpt->add_subcommand("verify", "re-read every chunk and check every checksum (exit 1 on any problem)");
  verify->add_option("DIR", dir, "checkpoint directory")->required();
  CLI::App* reshard = ckpt->add_subcommand("reshard", "write a copy laid out for another number of ranks");
  reshard->add_option("DIR", dir, "checkpoint directory")->required();
  reshard->add_option("OUT", out_dir, "output root (the step directory is created inside)")->required();
  reshard->add_option("--world-size", world, "ranks of the new layout")->required()->check(CLI::PositiveNumber);
  int rstage = -1, rthreads = 1;
  reshard->add_option("--stage", rstage, "stage to record (default: as saved; 0 gives one shard file)")->check(CLI::Range(0, 3));
  reshard->add_option("--threads", rthreads, "shards built at once (memory: one new shard each)")->check(CLI::PositiveNumber);
  std::string states = "params", xdtype = "f32";
  int stage = 3;
  CLI::App* exp = ckpt->add_subcommand("export", "consolidated, unsharded tensors in one HDF5 file");
  exp->add_option("DIR", dir, "checkpoint directory")->required();
  exp->add_option("OUT", out_dir, "output .h5 file")->required();
  exp->add_option("--states", states, "params | all (with the optimizer state)");
  exp->add_option("--dtype", xdtype, "f32 | bf16");
  CLI::App* imp = ckpt->add_subcommand("import", "an HDF5 file of tensors into a checkpoint for M ranks");
  imp->add_option("IN", dir, "input .h5 file")->required();
  imp->add_option("OUT", out_dir, "output root (the step directory is created inside)")->required();
  imp->add_option("--world-size", world, "ranks of the new layout")->required()->check(CLI::PositiveNumber);
  imp->add_option("--stage", stage, "stage recorded (0 gives one shard file)")->check(CLI::Range(0, 3));
  CLI::App* diff = ckpt->add_subcommand("diff", "per-tensor max abs/rel difference of two checkpoints");
  diff->add_option("A", dir, "checkpoint directory")->required();
  diff->add_option("B", other, "checkpoint directory")->required();
  for (CLI::App* c : {ls, inspect, verify, reshard, diff}) c->add_flag("--json", json, "machine-readable output");

  zrt::tools::PlanInput pi;
  std::string dtype = "bf16";
  CLI::App* plan = app.add_subcommand("plan", "memory per device, communication and time for a model");
  plan->add_option("--params", pi.params, "parameters (or give the transformer shape)");
  plan->add_option("--layers", pi.layers);
  plan->add_option("--hidden", pi.hidden);
  plan->add_option("--heads", pi.heads);
  plan->add_option("--seq", pi.seq, "sequence length");
  plan->add_option("--batch", pi.batch, "micro-batch per device");
  plan->add_option("--vocab", pi.vocab);
  plan->add_option("--gpus", pi.gpus, "data-parallel devices");
  plan->add_option("--stage", pi.stage, "ZeRO stage 0..3");
  plan->add_option("--offload", pi.offload, "none | cpu | nvme");
  plan->add_option("--dtype", dtype, "parameter dtype: bf16 | f16 | f32");
  plan->add_option("--gpu-mem", pi.gpu_mem_gib, "device memory, GiB");
  plan->add_option("--step-time", pi.step_seconds, "step time in seconds (bandwidth needed to hide communication)");
  plan->add_option("--tokens", pi.tokens, "training tokens");
  plan->add_option("--tflops", pi.tflops, "achieved TFLOP/s per device");
  plan->add_option("--power", pi.power_watts, "watts per device (energy)");
  plan->add_flag("--json", json, "machine-readable output");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (version) {
    std::cout << "zrt " << zrt::Version() << " (" << zrt::BuildFeatures() << ")\n";
    return 0;
  }
  if (*ls) return Report(zrt::tools::CkptLs(root, json, std::cout));
  if (*inspect) return Report(zrt::tools::CkptInspect(dir, tensor, stats, json, std::cout));
  if (*verify) return Report(zrt::tools::CkptVerify(dir, json, std::cout));
  if (*reshard) return Report(zrt::tools::CkptReshard(dir, out_dir, world, std::cout, rstage, rthreads));
  if (*diff) return Report(zrt::tools::CkptDiff(dir, other, json, std::cout));
  if (*exp) return Report(zrt::tools::CkptExport(dir, out_dir, states, xdtype, std::cout));
  if (*imp) return Report(zrt::tools::CkptImport(dir, out_dir, world, stage, std::cout));
  if (*plan) {
    if (dtype == "f32" || dtype == "fp32") pi.param_bytes = 4;
    else if (dtype != "bf16" && dtype != "f16" && dtype != "fp16") return Report(zrt::InvalidArgumentError("plan: unknown --dtype ", dtype));
    return Report(zrt::tools::Plan(pi, json, std::cout));
  }
  std::cout << app.help();
  return 2;  // no command: usage
}
