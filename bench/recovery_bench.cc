// bench/recovery (under mpirun; ./scripts/bench runs it on 2 and 4 ranks): what a failure costs with
// the memory tier and without, a bf16 + Adam model at stage 3.
//   tier overhead per step   steps with a memory-tier snapshot every K = 1 and K = 10 steps vs none;
//                            the snapshot's rate beside memcpy into touched memory (the tier's limit);
//                            with --device-ms M also steps whose forward/backward runs M ms on an
//                            emulated device (the host waits, as beside a GPU): what K = 1 costs
//                            when the tier's background copy has idle host time to use
//   restart to first step    after (a) a rank killed: its own copy in node-local memory, (b) its
//                            node lost: the replica on the other node, (c) disk only (caches dropped
//                            where allowed): Resume + one step, the restore rate beside memcpy (a, b)
//                            or fio's sequential read (c); with --link-mbps (on emulated nodes,
//                            scripts/cluster) the lost node's restore rate into it beside its link
//   work lost per failure    steps since the newest state each tier held, and the expected value for a
//                            kill at a random moment (K/2 + the commit's step; disk: its interval / 2)
//   ratios                   own copy / memcpy, own copy / disk and peer / disk restore rates, and the
//                            K = 1 step / the step without a tier (the tier's targets, docs/resume.md)
// The state's bytes are as stored (--state: f32, bf16 moments, q8 moments, q8 without a master).
//
//   mpirun -n 4 recovery_bench --dir DIR --shm DIR [--params P] [--state S] [--disk-every D] [--fio-read-mbps R] [--device-ms M] [--link-mbps L]
//                              [--shard-group S]
#include <CLI/CLI.hpp>

#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "bench/bench_engine.h"
#include "bench/bench_util.h"
#include "zrt/checkpoint/checkpointer.h"
#include "zrt/checkpoint/format.h"
#include "zrt/checkpoint/tier/memory_tier.h"
#include "zrt/core/mpi_communicator.h"
#include "zrt/runtime/engine.h"

using namespace zrt;
using namespace zrt::ckpt;
using zrt::bench::MakeEngine;
using zrt::bench::Step;

namespace {
double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
void DropCaches() {
  std::ofstream f("/proc/sys/vm/drop_caches");
  if (f) f << "3\n";
}

struct Overhead {
  double per_step[5] = {0, 0, 0, 0, 0};  // no tier, K = 1, K = 10; with a device: no tier, K = 1
  double stall = 0, replica_s = 0, alone = 0, dev_stall = 0;
};
// Overhead per step: no tier, K = 1, K = 10 (the same engine, a fresh checkpointer each); then,
// with --device-ms, no tier and K = 1 again with the emulated device's forward/backward in each step.
// Poll comes between the backward pass and Step (where a trainer calls it: a snapshot copied in the
// background and whose replica waits for Poll starts it there).
Overhead MeasureOverhead(Communicator* comm, Device* dev, ZeroEngine& e, const std::string& root, const MemoryTierOptions& tier,
                         int64_t per_group, int steps, double device_ms) {
  Overhead o;
  const int ks[5] = {0, 1, 10, 0, 1};
  for (int c = 0; c < (device_ms > 0 ? 5 : 3); ++c) {
    const int k = ks[c];
    const double sleep_ms = c >= 3 ? device_ms : 0;
    CheckpointOptions co{.root = root};
    if (k > 0) co.memory = tier;
    auto ck = Checkpointer::Create(comm, dev, co).value();
    auto poll = [&] { (void)ck->Poll(); };
    Step(e, per_group);
    if (k > 0) (void)ck->SaveToMemory(e.state_view());  // warm-up: the tier's files exist once
    (void)ck->Wait();
    comm->Barrier().IgnoreError();
    const double t = Now();
    const int timed = std::max(steps, 2 * k);
    for (int s = 0; s < timed; ++s) {
      // The device's forward/backward (the host waits on it), then the host's part of the step.
      if (sleep_ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(sleep_ms));
      Step(e, per_group, poll);
      if (k > 0 && e.steps() % k == 0) (void)ck->SaveToMemory(e.state_view());
    }
    (void)ck->Wait();
    o.per_step[c] = bench::MaxOverRanks(Now() - t) / timed;
    if (c == 4) o.dev_stall = bench::MaxOverRanks(ck->memory_stats()->stall_seconds);
    if (c == 1) {
      o.stall = bench::MaxOverRanks(ck->memory_stats()->stall_seconds);
      o.replica_s = bench::MaxOverRanks(ck->memory_stats()->replica_seconds);
      // The tier's work with nothing beside it (a snapshot, its replica, the commit): K = 1's floor
      // on these ranks, where the tier and the step share the same cores and memory.
      constexpr int kAlone = 3;
      for (int r = 0; r < kAlone; ++r) {
        Step(e, per_group);
        comm->Barrier().IgnoreError();
        const double t0 = Now();
        (void)ck->SaveToMemory(e.state_view());
        (void)ck->Wait();
        o.alone += bench::MaxOverRanks(Now() - t0) / kAlone;
      }
    }
    if (k > 0) {
      (void)ck->SaveAsync(e.state_view());  // supersedes the tier: it cleans up
      (void)ck->Wait();
    }
  }
  return o;
}

struct Restart {
  double seconds = 0, first_step = 0, mbps = 0;
  int64_t lost = 0;
  std::string source;
};

// Every figure of a run, printed on rank 0: the lines a reader reads, then the RESULT rows.
struct Report {
  int64_t params = 0, bytes = 0;
  int n = 0, ranks_per_node = 0, disk_every = 0;
  std::string state_name;
  double device_ms = 0, fio_r = -1, torch_load = -1, memcpy_s = 0, mem_mbps = 0, fill_s = 0;
  Overhead ov;
  Restart local, peer, disk;
  int shard_group = 0;  // hybrid sharding: live replicas, no replica sent
  double link_mbps = 0;  // each node's link (scripts/cluster --rate), 0: not given
};

void PrintReport(const Report& r) {
  const int64_t params = r.params, bytes = r.bytes;
  const int n = r.n, ranks_per_node = r.ranks_per_node, disk_every = r.disk_every;
  const std::string& state_name = r.state_name;
  const double device_ms = r.device_ms, fio_r = r.fio_r, torch_load = r.torch_load, memcpy_s = r.memcpy_s, mem_mbps = r.mem_mbps,
               fill_s = r.fill_s;
  const double* per_step = r.ov.per_step;
  const double stall = r.ov.stall, replica_s = r.ov.replica_s, alone = r.ov.alone, dev_stall = r.ov.dev_stall;
  const Restart &local = r.local, &peer = r.peer, &disk = r.disk;
  const double all_mem = mem_mbps * n;
  char src_peer[16] = {};
  std::snprintf(src_peer, sizeof(src_peer), "%s", peer.source.c_str());
  const double snap_mbps = static_cast<double>(bytes) / alone / 1e6;
  std::printf("bench/recovery: %.0fM bf16 parameters + Adam, stage 3, %d ranks (nodes of %d emulated), %s of %s state per rank (as stored)%s\n",
              params / 1e6, n, ranks_per_node, FormatBytes(bytes).c_str(), state_name.c_str(),
              r.shard_group > 0 ? (", hybrid S=" + std::to_string(r.shard_group) + ": live replicas, none sent").c_str() : "");
  std::printf("  step time           %8.1f ms no tier   %8.1f ms tier K=1 (+%.1f ms)   %8.1f ms tier K=10 (+%.1f ms)\n",
              per_step[0] * 1e3, per_step[1] * 1e3, (per_step[1] - per_step[0]) * 1e3, per_step[2] * 1e3,
              (per_step[2] - per_step[0]) * 1e3);
  if (device_ms > 0) {
    std::printf("  step, device %4.0f ms %7.1f ms no tier   %8.1f ms tier K=1 (+%.1f ms); training waited %.1f ms for the snapshot\n", device_ms,
                per_step[3] * 1e3, per_step[4] * 1e3, (per_step[4] - per_step[3]) * 1e3, dev_stall * 1e3);
  }
  std::printf("  snapshot stall      %8.1f ms (training waited); replica whole after %.1f ms\n", stall * 1e3, replica_s * 1e3);
  std::printf("  tier's work alone   %8.1f ms (snapshot + replica + commit, no step beside it: %6.0f MB/s per rank, memcpy %6.0f MB/s): K=1 costs %.2fx that\n",
              alone * 1e3, snap_mbps, mem_mbps, (per_step[1] - per_step[0]) / alone);
  std::printf("  restart, rank killed  (own copy)  %7.3f s to resume (%6.0f MB/s, memcpy %6.0f), %7.3f s to the first step; %lld steps lost here, %.1f expected\n",
              local.seconds, local.mbps, all_mem, local.first_step, static_cast<long long>(local.lost), 1.5);
  std::printf("  own copy, fill alone  %7.3f s (%6.0f MB/s per rank, memcpy %6.0f: %.2fx; the rest of the resume is agreement and the engine's parameter refresh)\n",
              fill_s, static_cast<double>(bytes) / fill_s / 1e6, mem_mbps, memcpy_s / fill_s);
  std::printf("  restart, node lost    (%-8s)  %7.3f s to resume (%6.0f MB/s, memcpy %6.0f), %7.3f s to the first step; %lld steps lost here, %.1f expected\n",
              src_peer, peer.seconds, peer.mbps, all_mem, peer.first_step, static_cast<long long>(peer.lost), 1.5);
  // A lost node's ranks each take their state over the node's one link.
  const double crossing = static_cast<double>(bytes) * std::min(ranks_per_node, n) / peer.seconds / 1e6;
  if (r.link_mbps > 0) {
    std::printf("  node lost over the link  %6.0f MB/s into the node (%d rank(s) x %s), link %6.0f MB/s: %.2fx\n", crossing,
                std::min(ranks_per_node, n), FormatBytes(bytes).c_str(), r.link_mbps, crossing / r.link_mbps);
  }
  std::printf("  restart, disk only    (%-8s)  %7.3f s to resume (%6.0f MB/s, fio read %6.0f, torch.load %6.0f), %7.3f s to the first step; "
              "%lld steps lost here, %.1f expected\n",
              disk.source.c_str(), disk.seconds, disk.mbps, fio_r, torch_load, disk.first_step, static_cast<long long>(disk.lost),
              disk_every / 2.0 + 1);
  std::printf("  ratios              own/memcpy %.2f (fill %.2f)   own/disk %.2fx faster   peer/disk %.2fx faster   first step own/disk %.2f   K=1 step / no tier %.2f\n",
              local.mbps / all_mem, memcpy_s / fill_s, disk.seconds / local.seconds, disk.seconds / peer.seconds, local.first_step / disk.first_step,
              per_step[1] / per_step[0]);
  bench::PrintResult("recovery", "step, tier K=1", per_step[1] * 1e3, "ms", per_step[0] * 1e3, "step without tier ms");
  bench::PrintResult("recovery", "K=1 cost per step", (per_step[1] - per_step[0]) * 1e3, "ms", alone * 1e3, "tier work alone ms");
  if (device_ms > 0) {
    bench::PrintResult("recovery", "step beside a device, tier K=1", per_step[4] * 1e3, "ms", per_step[3] * 1e3, "step without tier ms");
  }
  bench::PrintResult("recovery", "step, tier K=10", per_step[2] * 1e3, "ms", per_step[0] * 1e3, "step without tier ms");
  // The planner's (zrt plan --bench) rate of a save's stall: state bytes / training's wait.
  bench::PrintResult("recovery", "snapshot rate", static_cast<double>(bytes) / stall / 1e6, "MB/s", mem_mbps, "memcpy MB/s");
  bench::PrintResult("recovery", "tier work rate", snap_mbps, "MB/s", mem_mbps, "memcpy MB/s");
  bench::PrintResult("recovery", "replica rate", static_cast<double>(bytes) / replica_s / 1e6, "MB/s", mem_mbps, "memcpy MB/s");
  bench::PrintResult("recovery", "resume, rank killed", local.mbps, "MB/s", all_mem, "memcpy MB/s");
  bench::PrintResult("recovery", "own copy fill", static_cast<double>(bytes) / fill_s / 1e6, "MB/s", mem_mbps, "memcpy MB/s");
  bench::PrintResult("recovery", "resume, node lost", peer.mbps, "MB/s", all_mem, "memcpy MB/s");
  if (r.link_mbps > 0) bench::PrintResult("recovery", "resume, node lost vs link", crossing, "MB/s", r.link_mbps, "link MB/s");
  bench::PrintResult("recovery", "resume, disk", disk.mbps, "MB/s", fio_r, "fio seq read MB/s", torch_load, "torch.load MB/s");
  bench::PrintResult("recovery", "resume, rank killed vs disk", local.mbps, "MB/s", disk.mbps, "disk MB/s");
  bench::PrintResult("recovery", "resume, node lost vs disk", peer.mbps, "MB/s", disk.mbps, "disk MB/s");
  bench::PrintResult("recovery", "restart to first step, rank killed", local.first_step, "s", disk.first_step, "disk only s");
  bench::PrintResult("recovery", "restart to first step, node lost", peer.first_step, "s", disk.first_step, "disk only s");
}

// What every phase of the failure case shares: the mesh, the model and its state's bytes, the tier,
// the run's root and the step it dies at.
struct Run {
  Communicator* comm;
  Device* dev;
  int64_t params;
  int groups;
  StatePrecision precision;
  int shard_group;
  MemoryTierOptions tier;
  std::string root;  // the run's disk checkpoints
  int64_t die_at;    // the step the run dies at: the tier holds it, the disk an older one
  int64_t bytes = 0;  // this rank's state as stored
  std::unique_ptr<ZeroEngine> Engine() const { return MakeEngine(comm, dev, 3, params, groups, "", precision, shard_group); }
};

// The tier's limit: memcpy of `bytes` between touched buffers, every rank at once (as every rank
// restores at once).
double MemcpySeconds(Communicator* comm, int64_t bytes) {
  std::vector<char> from(static_cast<size_t>(bytes), 2), sink(static_cast<size_t>(bytes), 1);
  comm->Barrier().IgnoreError();
  const double t = Now();
  std::memcpy(sink.data(), from.data(), sink.size());
  return bench::MaxOverRanks(Now() - t);
}

// A run that dies at step die_at: tier every step, disk every `disk_every` (die_at not a disk step).
void RunUntilDeath(const Run& run, int disk_every) {
  auto e = run.Engine();
  auto ck = Checkpointer::Create(run.comm, run.dev, {.root = run.root, .memory = run.tier}).value();
  while (e->steps() < run.die_at) {
    Step(*e, run.params / run.groups);
    if (e->steps() % disk_every == 0) (void)ck->SaveAsync(e->state_view());
    (void)ck->SaveToMemory(e->state_view());
    (void)ck->Poll();
  }
  (void)ck->Wait();
}  // the tier keeps step die_at (newer than the disk's)

// A restart of the run from the tier (own copy or a peer's) or from disk alone, to its first step.
Restart RestartRun(const Run& run, bool with_tier) {
  Restart r;
  auto e = run.Engine();
  CheckpointOptions co{.root = run.root};
  if (with_tier) co.memory = run.tier;
  auto ck = Checkpointer::Create(run.comm, run.dev, co).value();
  if (!with_tier && run.comm->rank() == 0) DropCaches();
  run.comm->Barrier().IgnoreError();
  const double t0 = Now();
  auto res = ck->Resume(e->state_view());
  const double t1 = Now();
  Step(*e, run.params / run.groups);
  r.seconds = bench::MaxOverRanks(t1 - t0);
  r.first_step = bench::MaxOverRanks(Now() - t0);
  r.mbps = bench::SumOverRanks(static_cast<double>(run.bytes)) / r.seconds / 1e6;
  r.lost = res.ok() ? run.die_at - res->step : -1;
  r.source = res.ok() ? res->source : std::string(res.status().message());
  return r;
  // ck's destructor keeps the tier: it holds step die_at, newer than the disk's
}

// The own copy's state fill alone: ckpt::Load of this rank's copy (no agreement, no parameter refresh).
double OwnFillSeconds(const Run& run) {
  auto e = run.Engine();
  const std::string own = MemoryTier::RankDir(run.root, run.tier, run.comm->rank()) + "/own/" + StepDirName(run.die_at);
  run.comm->Barrier().IgnoreError();
  const double t0 = Now();
  const bool ok = Load(own, e->state_view()).ok();
  return bench::MaxOverRanks(ok ? Now() - t0 : 1e9);
}

// Node 0 lost: its ranks' tier directories (own copies and the replicas they held) gone.
void LoseNodeZero(const Run& run, int ranks_per_node) {
  if (run.comm->rank() == 0) {
    for (int r = 0; r < ranks_per_node && r < run.comm->size(); ++r) std::filesystem::remove_all(MemoryTier::RankDir(run.root, run.tier, r));
  }
  run.comm->Barrier().IgnoreError();
}

// A final disk save supersedes the tier, which then lets its copies go.
void Supersede(const Run& run) {
  auto e = run.Engine();
  auto ck = Checkpointer::Create(run.comm, run.dev, {.root = run.root, .memory = run.tier}).value();
  (void)ck->Resume(e->state_view());
  (void)ck->SaveAsync(e->state_view());
  (void)ck->Wait();
}

}  // namespace

int main(int argc, char** argv) {
  int64_t params = 25'000'000;
  int groups = 8, disk_every = 10, ranks_per_node = 0, steps = 20, shard_group = 0;
  double fio_r = -1, torch_load = -1, device_ms = 0, link_mbps = 0;
  std::string dir, shm = "/dev/shm", state_name = "f32";
  CLI::App app{"recovery_bench: the memory tier's cost per step and the time from a restart to the first step, by tier"};
  app.add_option("--dir", dir, "disk checkpoint root (written only here, and removed)")->required();
  app.add_option("--shm", shm, "node-local memory for the tier (tmpfs)")->capture_default_str();
  app.add_option("--params", params, "bf16 parameters + Adam state")->capture_default_str();
  app.add_option("--steps", steps, "timed steps per overhead case (at least 2 snapshots at K = 10)")->capture_default_str();
  app.add_option("--disk-every", disk_every, "disk checkpoint interval of the failure case")->capture_default_str();
  app.add_option("--ranks-per-node", ranks_per_node, "emulated node size (0: half the ranks, at least 1)");
  app.add_option("--shard-group", shard_group,
                 "hybrid sharding over groups of this many ranks (EngineConfig::shard_group_size; 0: flat): the tier then "
                 "keeps no replica, the other groups' copies of each shard serve a lost node");
  app.add_option("--fio-read-mbps", fio_r, "fio's sequential read rate on the disk's filesystem");
  app.add_option("--link-mbps", link_mbps, "each node's link rate in MB/s (scripts/cluster --rate): the node-lost restore beside it");
  app.add_option("--device-ms", device_ms, "also time steps whose forward/backward takes this long on an emulated device (the host sleeps)");
  app.add_option("--torch-load-mbps", torch_load, "torch.load's rate for the same bytes, caches dropped (the disk restart's peer)");
  app.add_option("--state", state_name, "optimizer state precision: f32, bf16 (moments), q8 (moments), q8-no-master")
      ->check(CLI::IsMember({"f32", "bf16", "q8", "q8-no-master"}))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  const Precision moments = state_name == "f32" ? Precision::kF32 : state_name == "bf16" ? Precision::kBF16 : Precision::kQ8;
  auto session = MpiSession::Init(&argc, &argv).value();
  auto comm = MpiCommunicator::Create().value();
  const int rank = comm->rank(), n = comm->size();
  if (ranks_per_node <= 0) ranks_per_node = std::max(1, n / 2);
  if (rank == 0) std::filesystem::remove_all(dir);
  comm->Barrier().IgnoreError();
  CpuDevice dev;
  Run run{comm.get(), &dev, params, groups, {moments, moments, state_name != "q8-no-master", 256}, shard_group,
          {.dir = shm, .ranks_per_node = ranks_per_node}, dir + "/run", 2 * disk_every + disk_every / 2};

  auto e = run.Engine();
  for (const StateGroup& g : e->state_view().groups) {
    for (const StateBuffer& b : g.buffers) run.bytes += b.format.Bytes(b.count);
  }
  const double memcpy_s = MemcpySeconds(comm.get(), run.bytes);
  const double mem_mbps = static_cast<double>(run.bytes) / memcpy_s / 1e6;
  const Overhead ov = MeasureOverhead(comm.get(), &dev, *e, dir + "/overhead", run.tier, params / groups, steps, device_ms);
  e.reset();
  if (rank == 0) std::filesystem::remove_all(dir);
  comm->Barrier().IgnoreError();

  RunUntilDeath(run, disk_every);
  const Restart local = RestartRun(run, true);
  const double fill_s = OwnFillSeconds(run);
  LoseNodeZero(run, ranks_per_node);
  const Restart peer = RestartRun(run, true);
  const Restart disk = RestartRun(run, false);
  Supersede(run);
  if (rank == 0) std::filesystem::remove_all(dir);

  if (rank == 0) {
    PrintReport({params, run.bytes, n, ranks_per_node, disk_every, state_name, device_ms, fio_r, torch_load, memcpy_s, mem_mbps, fill_s, ov,
                 local, peer, disk, shard_group, link_mbps});
  }
  return 0;
}
