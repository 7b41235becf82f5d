// bench/offload_step (ZeRO-Offload / ZeRO-Infinity; ./scripts/bench runs it): one optimizer step of a
// bf16 model at stage 3 on one rank with its optimizer state and parameter shards
//   nvme: in swap files, streamed through a bounded host budget (read i+1 | update i | write i-1);
//         figure = disk throughput during the step (bytes read + written / step time) beside fio's
//         mixed read/write throughput measured on the same filesystem by the script; plus how the
//         step's time splits (CPU Adam in the callback vs waiting for the disk).
//   host: in host memory; figure = parameters updated per second beside the same engine without
//         offload (on CPU-only builds both are host memory, so the ratio shows the offload path's cost).
//   nvme per state precision (EngineConfig::state): the same NVMe step with q8 moments and an fp32
//         master, q8 moments without one, and q4 moments without one; figure = step time beside the
//         f32 state's, with the bytes each moves.
//
//   offload_step_bench --params P --dir D [--budget BYTES] [--steps S] [--host-params H] [--fio-mixed-mbps M]
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "bench/bench_util.h"
#include "zrt/core/mpi_communicator.h"
#include "zrt/runtime/engine.h"

using namespace zrt;

namespace {

struct Figures {
  double step_seconds = 0;
  SwapStats swap;
  int64_t host_peak = 0;
};

Result<Figures> Run(Communicator* comm, int64_t params, OffloadTarget where, const std::string& dir, int64_t budget, int steps,
                    const StatePrecision& state = {}) {
  constexpr int kGroups = 16;
  CpuDevice dev;
  EngineConfig cfg;
  cfg.stage = 3;
  cfg.state = state;
  cfg.offload.optimizer = where;
  cfg.offload.params = where;
  cfg.offload.nvme_dir = dir;
  cfg.offload.host_budget_bytes = where == OffloadTarget::kNvme ? budget : 0;
  ASSIGN_OR_RETURN(auto e, ZeroEngine::Create(comm, &dev, cfg));
  for (int g = 0; g < kGroups; ++g) {
    RETURN_IF_ERROR(e->AddParam("w" + std::to_string(g), {params / kGroups}, DType::kBF16, {.group = "layer" + std::to_string(g)}).status());
  }
  RETURN_IF_ERROR(e->Finalize([](int64_t, int64_t, int64_t n, float* out) {
    for (int64_t i = 0; i < n; ++i) out[i] = 0.01f;
  }));
  Figures f;
  double total = 0;
  for (int s = 0; s < steps; ++s) {
    for (int g = 0; g < kGroups; ++g) {
      ASSIGN_OR_RETURN(void* grad, e->GradBuffer(g));
      const size_t bytes = static_cast<size_t>(params / kGroups) * 2;
      RETURN_IF_ERROR(dev.Fill(grad, 0x3a, bytes));  // bf16 0x3a3a ~ 7e-4
      RETURN_IF_ERROR(e->GradsReady(g));
    }
    const auto t0 = std::chrono::steady_clock::now();
    ASSIGN_OR_RETURN(StepResult r, e->Step());
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r.skipped) return InternalError("step skipped");
    if (s > 0 || steps == 1) {  // the first step of several is a warm-up
      total += t;
      f.swap.bytes_read += e->swap_stats().bytes_read;
      f.swap.bytes_written += e->swap_stats().bytes_written;
      f.swap.seconds += e->swap_stats().seconds;
      f.swap.update_seconds += e->swap_stats().update_seconds;
      f.swap.wait_seconds += e->swap_stats().wait_seconds;
    }
  }
  f.step_seconds = total / (steps > 1 ? steps - 1 : 1);
  f.host_peak = e->host_memory().total_peak;
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t params = 1'000'000'000, budget = int64_t{2} << 30, host_params = 500'000'000;
  int steps = 3;
  double fio_mixed = 0;
  std::string dir;
  CLI::App app{"offload_step_bench: a stage-3 step with the optimizer state on NVMe (beside fio) and in host memory"};
  app.add_option("--dir", dir, "swap directory (written only here, and removed)")->required();
  app.add_option("--params", params, "parameters (NVMe run)")->capture_default_str();
  app.add_option("--budget", budget, "host memory budget, bytes")->capture_default_str();
  app.add_option("--steps", steps, "timed steps")->capture_default_str();
  app.add_option("--host-params", host_params, "parameters (host run)")->capture_default_str();
  app.add_option("--fio-mixed-mbps", fio_mixed, "fio's mixed read/write rate on the same filesystem");
  CLI11_PARSE(app, argc, argv);
  auto session = MpiSession::Init(&argc, &argv);
  if (!session.ok()) return 1;
  if (dir.empty()) {
    std::fprintf(stderr, "usage: offload_step_bench --params P --dir D [--budget B] [--steps S] [--host-params H] [--fio-mixed-mbps M]\n");
    return 2;
  }
  auto comm = MpiCommunicator::Create();
  if (!comm.ok()) return 1;
  const double state_gib = static_cast<double>(params) * 14 / (1 << 30);  // fp32 master, m, v + bf16 params
  std::printf("bench/offload_step: %.0fM bf16 parameters, stage 3, 1 rank; nvme: %.1f GiB of swap files in %s, host budget %s\n",
              static_cast<double>(params) / 1e6, state_gib, dir.c_str(), FormatBytes(budget).c_str());

  auto nvme = Run(comm->get(), params, OffloadTarget::kNvme, dir, budget, steps);
  if (!nvme.ok()) {
    std::fprintf(stderr, "nvme: %s\n", nvme.status().ToString().c_str());
    return 1;
  }
  const Figures& n = *nvme;
  const double moved = static_cast<double>(n.swap.bytes_read + n.swap.bytes_written) / (steps > 1 ? steps - 1 : 1);
  const double mbps = moved / n.step_seconds / 1e6;
  std::printf("nvme: step %.2f s, %.2f GB read + written per step = %.0f MB/s (fio mixed r/w: %.0f MB/s); host peak %s\n",
              n.step_seconds, moved / 1e9, mbps, fio_mixed, FormatBytes(n.host_peak).c_str());
  // Outside the callback the step thread only issues I/O (blocking while the queue is full) or waits
  // for it: that share of the streamed time is the disk's.
  std::printf("nvme: of the streamed time, CPU Adam %.0f%%, I/O (queueing and waiting) %.0f%%, of which blocked in Wait %.0f%%\n",
              100 * n.swap.update_seconds / n.swap.seconds, 100 * (1 - n.swap.update_seconds / n.swap.seconds),
              100 * n.swap.wait_seconds / n.swap.seconds);
  bench::PrintResult("offload_step", "nvme disk MB/s, " + std::to_string(params / 1000000) + "M params", mbps, "MB/s",
                     fio_mixed, "fio mixed r/w");
  bench::PrintResult("offload_step", "nvme step: Adam share", n.swap.update_seconds / n.swap.seconds, "fraction", 1, "whole step");

  // The same step with compact state: fewer bytes through the disk.
  for (const StatePrecision& st : {StatePrecision{Precision::kQ8, Precision::kQ8, true, 256},
                                   StatePrecision{Precision::kQ8, Precision::kQ8, false, 256},
                                   StatePrecision{Precision::kQ4, Precision::kQ4, false, 256}}) {
    auto c = Run(comm->get(), params, OffloadTarget::kNvme, dir, budget, steps, st);
    if (!c.ok()) {
      std::fprintf(stderr, "nvme %s: %s\n", StatePrecisionName(st).c_str(), c.status().ToString().c_str());
      return 1;
    }
    const double cm = static_cast<double>(c->swap.bytes_read + c->swap.bytes_written) / (steps > 1 ? steps - 1 : 1);
    std::printf("nvme, %s: step %.2f s (f32 state %.2f s), %.2f GB read + written per step = %.0f MB/s\n", StatePrecisionName(st).c_str(),
                c->step_seconds, n.step_seconds, cm / 1e9, cm / c->step_seconds / 1e6);
    const std::string moments = std::string(PrecisionName(st.exp_avg)) + (st.master ? " moments" : " moments no master");
    bench::PrintResult("offload_step", "nvme step s, " + moments, c->step_seconds, "s",
                       n.step_seconds, "f32 state");
  }

  const int64_t hp = std::min(params, host_params);
  auto host = Run(comm->get(), hp, OffloadTarget::kHost, dir, 0, steps);
  auto none = Run(comm->get(), hp, OffloadTarget::kNone, dir, 0, steps);
  if (!host.ok() || !none.ok()) {
    std::fprintf(stderr, "host: %s / %s\n", host.status().ToString().c_str(), none.status().ToString().c_str());
    return 1;
  }
  const double host_rate = static_cast<double>(hp) / host->step_seconds / 1e9, none_rate = static_cast<double>(hp) / none->step_seconds / 1e9;
  std::printf("host (%lldM params): step %.3f s = %.2f G params/s; without offload %.3f s = %.2f G params/s\n",
              static_cast<long long>(hp / 1000000), host->step_seconds, host_rate, none->step_seconds, none_rate);
  bench::PrintResult("offload_step", "host step, " + std::to_string(hp / 1000000) + "M params", host_rate, "Gparam/s", none_rate,
                     "no offload");
  return 0;
}
