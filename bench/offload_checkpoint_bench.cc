// bench/offload_checkpoint (under mpirun; ./scripts/bench runs it on 2 ranks beside fio's write rate):
// checkpoints of state that lives on NVMe (ZeRO-Infinity: fp32 master, Adam moments and the bf16
// parameter shards in swap files), stage 3, to disk (SaveAsync) and to the memory tier
// (SaveToMemory, on --shm), two ways each, in interleaved rounds:
//   handed over   the default: the save's capture takes nothing at once, the next step hands every
//                 sub-group to the writer (or the tier) before updating it (the optimizer store's capture)
//   read at once  the save's capture settled at once (StateView::Settle): the state is read from the
//                 swap files before training goes on (what a save of NVMe state cost before)
// Per way: the save's stall and the next step's time beside a step without a save (what training
// waits for; for the disk beside the save's bytes at fio's sequential write rate: the disk time of an
// extra write stream where the swap files and the checkpoints share the disk), and when the save is
// complete (durable; the tier's generation committed).
//
//   mpirun -n 2 offload_checkpoint_bench --dir DIR [--shm DIR] [--params P] [--rounds R] [--fio-write-mbps W]
#include <CLI/CLI.hpp>

#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

#include "bench/bench_engine.h"
#include "bench/bench_util.h"
#include "zrt/checkpoint/checkpointer.h"
#include "zrt/core/mpi_communicator.h"

using namespace zrt;
using namespace zrt::ckpt;

namespace {
double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

struct Figures {
  double stall = 0, step = 0, total = 0;
};
}  // namespace

int main(int argc, char** argv) {
  int64_t params = 50'000'000;
  int groups = 8, rounds = 3;
  double fio_w = -1;
  std::string dir, shm = "/dev/shm";
  CLI::App app{"offload_checkpoint_bench: saving NVMe-offloaded state, handed over by the next step vs read at once"};
  app.add_option("--dir", dir, "where the swap files and checkpoints go (written only here, and removed)")->required();
  app.add_option("--params", params, "bf16 parameters (+ Adam state), all on NVMe")->capture_default_str();
  app.add_option("--shm", shm, "node-local memory for the tier (tmpfs)")->capture_default_str();
  app.add_option("--rounds", rounds, "interleaved rounds of each way")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--fio-write-mbps", fio_w, "fio's sequential write rate on the same filesystem");
  CLI11_PARSE(app, argc, argv);
  auto session = MpiSession::Init(&argc, &argv).value();
  auto comm = MpiCommunicator::Create().value();
  const int rank = comm->rank(), n = comm->size();
  const std::string swap = dir + "/swap", root = dir + "/ckpt";
  if (rank == 0) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(swap);
  }
  comm->Barrier().IgnoreError();
  CpuDevice dev;
  auto e = bench::MakeEngine(comm.get(), &dev, 3, params, groups, swap);
  const int64_t per_group = params / groups;
  auto ck = Checkpointer::Create(comm.get(), &dev, {.root = root, .keep_last = 1, .memory = MemoryTierOptions{.dir = shm}}).value();
  bench::Step(*e, per_group);

  // A step without a save: the mean of 3, after one to warm up.
  bench::Step(*e, per_group);
  comm->Barrier().IgnoreError();
  double t = Now();
  for (int i = 0; i < 3; ++i) bench::Step(*e, per_group);
  const double plain = bench::MaxOverRanks(Now() - t) / 3;

  Figures way[2][2];  // [disk, tier][handed over, read at once]
  Status failed;
  for (int r = 0; r < rounds; ++r) {
    for (int i = 0; i < 4; ++i) {
      const int to = i / 2, w = i % 2;
      StateView v = e->state_view();
      comm->Barrier().IgnoreError();
      const double t0 = Now();
      Status s = to == 0 ? ck->SaveAsync(v) : ck->SaveToMemory(v);
      if (s.ok() && w == 1) s = v.Settle();
      const double t1 = Now();
      bench::Step(*e, per_group);
      const double t2 = Now();
      if (s.ok()) s = ck->Wait();
      const double t3 = Now();
      if (!s.ok() && failed.ok()) failed = s;
      way[to][w].stall += bench::MaxOverRanks(t1 - t0) / rounds;
      way[to][w].step += bench::MaxOverRanks(t2 - t1) / rounds;
      way[to][w].total += bench::MaxOverRanks(t3 - t0) / rounds;
    }
  }
  const double bytes = bench::SumOverRanks(static_cast<double>(ck->last_stats().raw_bytes));
  ck.reset();
  e.reset();
  if (rank == 0) {
    std::filesystem::remove_all(dir);
    std::printf("bench/offload_checkpoint: %.0fM bf16 parameters + Adam on NVMe, stage 3, %d ranks, %s of state per save, "
                "%d rounds%s\n", params / 1e6, n, FormatBytes(static_cast<int64_t>(bytes)).c_str(), rounds,
                failed.ok() ? "" : ("  [a save FAILED: " + failed.ToString() + "]").c_str());
    // The limit: the save's bytes at fio's write rate, the disk time an extra write stream takes
    // where the swap files and the checkpoints share the disk (as here).
    const double limit = fio_w > 0 ? bytes / (fio_w * 1e6) : -1;
    std::printf("  step without a save %7.3f s; the save's bytes at fio's seq write rate (%0.f MB/s): %.3f s\n", plain, fio_w, limit);
    const char* names[2] = {"handed over", "read at once"};
    const char* targets[2] = {"disk", "tier"};
    double waits[2][2] = {};
    for (int to = 0; to < 2; ++to) {
      for (int w = 0; w < 2; ++w) {
        const Figures& f = way[to][w];
        // Training waits for the stall and the step's extra time; the Wait after it is the write
        // still to finish (in a run, Poll commits it in the background).
        waits[to][w] = f.stall + f.step - plain;
        std::printf("  %s, %-13s stall %7.3f s   next step %7.3f s   training waits %7.3f s   complete %7.3f s after the save\n",
                    targets[to], names[w], f.stall, f.step, waits[to][w], f.total);
        const std::string what = std::string(targets[to]) + ", " + names[w];
        if (to == 0) {
          bench::PrintResult("offload_checkpoint", what + ": training waits per save", waits[to][w], "s", limit, "save bytes at fio seq write s");
        } else {
          bench::PrintResult("offload_checkpoint", what + ": training waits per save", waits[to][w], "s", plain, "step s");
        }
        bench::PrintResult("offload_checkpoint", what + ": save complete after", f.total, "s", plain, "step s");
      }
      std::printf("  %s: handed over / read at once: training waits %.2fx\n", targets[to], waits[to][0] / waits[to][1]);
    }
  }
  return failed.ok() ? 0 : 1;
}
