// bench/zero_step (run under mpirun; ./scripts/bench runs it at 1, 2 and 4 ranks): one training step of
// a bf16 model with Adam at stages 0-3 on CPU ranks. Per stage it prints the step time (slowest rank,
// median of the timed steps), the bytes this rank moved per step as elements per parameter beside the
// ZeRO paper's 2 (stages 0-2) or 3 (stage 3) x (N-1)/N, and the peak model-state memory per rank beside
// the paper's formula. The trainer's forward/backward is trivial here: the figures are the engine's.
//
//   mpirun -n N zero_step_bench [--params P] [--groups G] [--steps S]
#include <CLI/CLI.hpp>

#include <mpi.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "zrt/core/mpi_communicator.h"
#include "zrt/runtime/engine.h"

using namespace zrt;

int main(int argc, char** argv) {
  int64_t params = 100'000'000;
  int groups = 24, steps = 3;
  CLI::App app{"zero_step_bench: one ZeRO step per stage (reduce, Adam, gather) against the DDP cost, on CPU ranks"};
  app.add_option("--params", params, "parameters")->capture_default_str();
  app.add_option("--groups", groups, "parameter groups")->capture_default_str();
  app.add_option("--steps", steps, "timed steps")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  auto session = MpiSession::Init(&argc, &argv);
  if (!session.ok()) {
    std::fprintf(stderr, "%s\n", session.status().ToString().c_str());
    return 1;
  }
  auto comm = MpiCommunicator::Create();
  if (!comm.ok()) return 1;
  comm.value()->set_check_args(false);  // the hot path: arguments are right by construction here
  const int n = (*comm)->size(), rank = (*comm)->rank();
  const int64_t per_group = params / groups;
  const double psi = static_cast<double>(per_group * groups);
  if (rank == 0) {
    std::printf("bench/zero_step: %.0fM bf16 parameters in %d groups, Adam, %d ranks, median of %d steps\n", psi / 1e6,
                groups, n, steps);
    std::printf("%-6s %10s %14s %10s %8s %16s %16s %8s\n", "stage", "step s", "moved el/param", "paper", "ratio",
                "state MiB/rank", "formula MiB", "ratio");
  }
  for (int stage = 0; stage <= 3; ++stage) {
    CpuDevice dev;
    EngineConfig cfg;
    cfg.stage = stage;
    cfg.optimizer_threads = 1;  // ranks share the machine's cores
    auto e = ZeroEngine::Create(comm->get(), &dev, cfg);
    if (!e.ok()) return 1;
    for (int g = 0; g < groups; ++g) {
      if (!(*e)->AddParam("w" + std::to_string(g), {per_group}, DType::kBF16, {.group = "layer" + std::to_string(g)}).ok()) return 1;
    }
    Status st = (*e)->Finalize([](int64_t, int64_t, int64_t cnt, float* out) {
      for (int64_t i = 0; i < cnt; ++i) out[i] = 0.01f;
    });
    if (!st.ok()) {
      std::fprintf(stderr, "%s\n", st.ToString().c_str());
      return 1;
    }
    auto one_step = [&] {
      for (int g = 0; g < groups; ++g) {  // forward
        (void)(*e)->Gather(g);
        (void)(*e)->Release(g);
      }
      for (int g = groups - 1; g >= 0; --g) {  // backward
        (void)(*e)->Gather(g);
        auto gb = (*e)->GradBuffer(g);
        auto* h = static_cast<uint16_t*>(*gb);
        for (int64_t i = 0; i < per_group; i += 1024) h[i] = FloatToBf16(1e-3f);  // touch, do not compute
        (void)(*e)->Release(g);
        (void)(*e)->GradsReady(g);
      }
      (void)(*e)->Step();
    };
    one_step();  // warm-up: first-step order recording, pool fill
    const CommStats before = (*e)->comm_stats();
    std::vector<double> times;
    for (int s = 0; s < steps; ++s) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      one_step();
      double t = MPI_Wtime() - t0;
      MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      times.push_back(t);
    }
    std::sort(times.begin(), times.end());
    const CommStats after = (*e)->comm_stats();
    // Elements moved per parameter: reductions in f32, gathers in bf16.
    const double moved = ((after.reduce_bytes - before.reduce_bytes) / 4.0 + (after.gather_bytes - before.gather_bytes) / 2.0) /
                         steps / psi;
    const double paper = (stage == 3 ? 3.0 : 2.0) * (n - 1) / n;
    const auto m = (*e)->memory();
    const double state = static_cast<double>(m.peak_of(MemCategory::kParameters) + m.peak_of(MemCategory::kGradients) +
                                             m.peak_of(MemCategory::kOptimizerState));
    const double formula[] = {16 * psi, 4 * psi + 12 * psi / n, 2 * psi + 14 * psi / n, 16 * psi / n};
    if (rank == 0) {
      std::printf("%-6d %10.3f %14.3f %10.3f %8.3f %16.1f %16.1f %8.3f\n", stage, times[times.size() / 2], moved, paper,
                  paper > 0 ? moved / paper : 0.0, state / (1 << 20), formula[stage] / (1 << 20), state / formula[stage]);
      std::printf("        buffers beyond model state: communication %s, staging %s (peak)\n",
                  FormatBytes(m.peak_of(MemCategory::kCommunication)).c_str(),
                  FormatBytes(m.peak_of(MemCategory::kStaging)).c_str());
      const std::string c = "stage " + std::to_string(stage) + ", " + std::to_string(n) + " ranks";
      bench::PrintResult("zero_step", c + " moved", moved, "el/param", paper, "paper (N-1)/N");
      bench::PrintResult("zero_step", c + " state", state / (1 << 20), "MiB/rank", formula[stage] / (1 << 20), "ZeRO formula");
      bench::PrintResult("zero_step", c + " step time", times[times.size() / 2], "s", 0, "-");
    }
  }
  return 0;
}
