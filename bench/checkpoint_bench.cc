// bench/checkpoint (under mpirun; ./scripts/bench runs it on 4 ranks with fio's figures): a bf16 + Adam
// model at stage 3.
//   stall per save        what training waited (SaveAsync + the next steps' waits for the capture)
//                         vs a plain memcpy of the same bytes into already-touched memory; the same
//                         copied at SaveAsync (a view without its owner: the peer design), and with a
//                         staging budget (--staging-budget) beside the peak staging of each
//   write throughput      all ranks' bytes / slowest rank's background write time, vs fio seq write
//   step slowdown         training steps while a save is in flight vs without
//   load, reshard-load    N -> N and N -> 2 ranks, bytes read / time (caches dropped, each from a save
//                         not read before), vs fio seq read and torch.load of the same bytes
//   compression           ratio and MB/s per core, plain zstd vs byte-grouped, for bf16 weights and
//                         fp32 master / moments (zstd level 1)
//   reshard plan          1T parameters, 100k tensors, 16384 -> 12288 ranks, metadata only
//   spread save           a hybrid run's save (S = N/2) beside the flat save of the same state
//
//   mpirun -n 4 checkpoint_bench --dir DIR [--params P] [--fio-write-mbps W] [--fio-read-mbps R] [--torch-load-mbps T]
#include <CLI/CLI.hpp>

#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "bench/bench_engine.h"
#include "bench/bench_util.h"
#include "zrt/checkpoint/catalog.h"
#include "zrt/checkpoint/checkpointer.h"
#include "zrt/checkpoint/codec.h"
#include "zrt/checkpoint/load.h"
#include "zrt/core/mpi_communicator.h"
#include "zrt/runtime/engine.h"

using namespace zrt;
using namespace zrt::ckpt;
using zrt::bench::MakeEngine;
using zrt::bench::Step;

namespace {
double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
// Loads are timed from the disk, not from the page cache (where this machine lets us drop it).
void DropCaches(Communicator& comm) {
  comm.Barrier().IgnoreError();
  if (comm.rank() == 0) {
    ::sync();
    std::ofstream f("/proc/sys/vm/drop_caches");
    if (f) f << "3\n";
  }
  comm.Barrier().IgnoreError();
}
// Per state precision (EngineConfig::state): a save's bytes on disk, stored as the state is kept,
// and its time (SaveAsync to the commit), each under a root of its own.
void SavePerPrecision(Communicator* comm, Device* dev, const CheckpointOptions& co, const std::string& dir, int64_t params, int groups) {
  const std::pair<const char*, StatePrecision> precisions[] = {
      {"f32 state", {}},
      {"bf16 moments", {Precision::kBF16, Precision::kBF16, true, 256}},
      {"q8 moments", {Precision::kQ8, Precision::kQ8, true, 256}},
      {"q8 moments, no master", {Precision::kQ8, Precision::kQ8, false, 256}},
      {"q4 moments, no master", {Precision::kQ4, Precision::kQ4, false, 256}}};
  double f32_per_param = 0, f32_save = 0;
  for (const auto& [name, st] : precisions) {
    auto ep = MakeEngine(comm, dev, 3, params, groups, "", st);
    Step(*ep, params / groups);
    CheckpointOptions po = co;
    po.root = dir + "/" + name;  // a root each: a step already saved under a root is not saved again
    po.keep_last = 1;
    auto pk = Checkpointer::Create(comm, dev, po).value();
    comm->Barrier().IgnoreError();
    const double t = Now();
    const Status done = pk->SaveAsync(ep->state_view()).ok() ? pk->Wait() : InternalError("SaveAsync failed");
    const double save_s = bench::MaxOverRanks(Now() - t);
    const double per_param = bench::SumOverRanks(static_cast<double>(pk->last_stats().stored_bytes)) / static_cast<double>(params);
    if (f32_per_param == 0) f32_per_param = per_param, f32_save = save_s;
    if (comm->rank() == 0) {
      std::printf("  %-22s %6.2f bytes per parameter on disk, save %.3f s (f32 state: %.2f, %.3f s)%s\n", name, per_param, save_s,
                  f32_per_param, f32_save, done.ok() ? "" : "  [save FAILED]");
      bench::PrintResult("checkpoint", std::string("bytes on disk per parameter, ") + name, per_param, "B/param", f32_per_param, "f32 state");
      bench::PrintResult("checkpoint", std::string("save s, ") + name, save_s, "s", f32_save, "f32 state s");
    }
  }
}

// A save of a hybrid run (S = N/2: two replicas of each shard) beside the flat save of the same state
// (S = N): each writes 1/N of the state per rank (the hybrid one spread over both replicas), so the two
// take about the same time; before saves were spread, the hybrid save had half the ranks write twice as
// much each. Raw and compressed (bg+zstd level 1: the encoding is per rank CPU work).
void SaveHybrid(Communicator* comm, Device* dev, const CheckpointOptions& co, const std::string& dir, int64_t params, int groups) {
  const int n = comm->size();
  if (n < 2 || n % 2 != 0) return;
  for (Codec codec : {Codec::kRaw, Codec::kByteGroupZstd}) {
    double seconds[2] = {0, 0};
    for (int hybrid = 0; hybrid < 2; ++hybrid) {
      auto e = MakeEngine(comm, dev, 3, params, groups, "", {}, hybrid ? n / 2 : 0);
      Step(*e, params / groups);
      CheckpointOptions po = co;
      po.root = dir + "/spread" + std::to_string(hybrid) + std::string(CodecName(codec));
      po.compression.codec = codec;
      po.keep_last = 1;
      auto pk = Checkpointer::Create(comm, dev, po).value();
      comm->Barrier().IgnoreError();
      const double t = Now();
      const Status done = pk->SaveAsync(e->state_view()).ok() ? pk->Wait() : InternalError("SaveAsync failed");
      seconds[hybrid] = bench::MaxOverRanks(Now() - t);
      if (!done.ok() && comm->rank() == 0) std::printf("  [save FAILED: %s]\n", done.ToString().c_str());
    }
    if (comm->rank() == 0) {
      std::printf("  %-8s hybrid S=%d save %.3f s, every rank writing its part; flat S=%d save of the same state %.3f s (%.2fx)\n",
                  std::string(CodecName(codec)).c_str(), n / 2, seconds[1], n, seconds[0], seconds[0] / seconds[1]);
      bench::PrintResult("checkpoint", "hybrid save s, " + std::string(CodecName(codec)), seconds[1], "s", seconds[0], "flat save s");
    }
  }
}

// The flat save's figures: what training waited (at SaveAsync, with the owner's capture and with a
// staging budget), the step slowdown with a save in flight, the background write.
struct SaveFigures {
  int64_t bytes = 0, budget = 0;  // state per rank; the budgeted save's staging budget
  double memcpy_s = 0, plain = 0, busy = 0, stall = 0, staged = 0, stall_at_save = 0;
  double stall_budget = 0, staged_budget = 0, busy_budget = 0, write_s = 0, total_bytes = 0, state_bytes = 0;
  Status w;  // the saves' outcome
};

// memcpy baseline: the state's bytes into touched memory.
double MemcpySeconds(const StateView& v, int64_t bytes) {
  std::vector<char> sink(static_cast<size_t>(bytes), 1);
  const double t = Now();
  int64_t off = 0;
  for (const StateGroup& g : v.groups) {
    for (const StateBuffer& b : g.buffers) {
      std::memcpy(sink.data() + off, b.data, static_cast<size_t>(b.count) * 4);
      off += b.count * 4;
    }
  }
  return bench::MaxOverRanks(Now() - t);
}

SaveFigures MeasureSaves(Communicator* comm, Device* dev, ZeroEngine& e, Checkpointer& ck, const CheckpointOptions& co, int64_t per_group,
                         int64_t budget) {
  SaveFigures f;
  for (const StateGroup& g : e.state_view().groups) {
    for (const StateBuffer& b : g.buffers) f.bytes += b.count * 4;
  }
  f.memcpy_s = MemcpySeconds(e.state_view(), f.bytes);
  // Step time without a save, then with a save in flight.
  const int k = 3;
  comm->Barrier().IgnoreError();
  double t = Now();
  for (int i = 0; i < k; ++i) Step(e, per_group);
  f.plain = bench::MaxOverRanks(Now() - t) / k;
  Step(e, per_group);
  comm->Barrier().IgnoreError();
  (void)ck.SaveAsync(e.state_view());
  t = Now();
  for (int i = 0; i < k; ++i) Step(e, per_group);
  f.busy = bench::MaxOverRanks(Now() - t) / k;
  f.w = ck.Wait();
  // SaveAsync's own time and the next steps' waits for the capture (the engine's copy thread).
  f.stall = bench::MaxOverRanks(ck.last_stats().stall_seconds);
  f.staged = bench::MaxOverRanks(static_cast<double>(ck.last_stats().staging_bytes));
  // The same save of a view without its owner: SaveAsync copies while training waits (the peer
  // design, and zrt's before the owner's thread made the copy).
  {
    Step(e, per_group);
    comm->Barrier().IgnoreError();
    StateView v = e.state_view();
    v.owner = nullptr;  // every buffer is host memory here
    (void)ck.SaveAsync(v);
    f.stall_at_save = bench::MaxOverRanks(ck.last_stats().stall_seconds);
    (void)ck.Wait();
  }
  // With a staging budget: the chunk buffers stay within it, and the steps wait where the copy waits
  // for the disk.
  f.budget = budget > 0 ? budget : std::max<int64_t>(f.bytes / 4, int64_t{16} << 20);
  {
    CheckpointOptions cb = co;
    cb.staging_budget_bytes = f.budget;
    auto ckb = Checkpointer::Create(comm, dev, cb).value();
    Step(e, per_group);
    comm->Barrier().IgnoreError();
    (void)ckb->SaveAsync(e.state_view());
    t = Now();
    for (int i = 0; i < k; ++i) Step(e, per_group);
    f.busy_budget = bench::MaxOverRanks(Now() - t) / k;
    Status wb = ckb->Wait();
    if (!wb.ok() && f.w.ok()) f.w = wb;
    f.stall_budget = bench::MaxOverRanks(ckb->last_stats().stall_seconds);
    f.staged_budget = bench::MaxOverRanks(static_cast<double>(ckb->last_stats().staging_bytes));
  }
  f.write_s = bench::MaxOverRanks(ck.last_stats().write_seconds);
  f.total_bytes = bench::SumOverRanks(static_cast<double>(ck.last_stats().stored_bytes));
  f.state_bytes = bench::SumOverRanks(static_cast<double>(ck.last_stats().raw_bytes));
  return f;
}

// Loads of the two newest saves (keep_last = 2), each read once: N -> N from the newest, N -> 2 from
// the other, so neither load finds its bytes in a cache the other filled (a virtual disk's host cache
// included).
struct LoadFigures {
  double load_s = 0, load_bytes = 0, reshard_s = 0, reshard_bytes = 0;
};
LoadFigures MeasureLoads(Communicator* comm, Device* dev, const std::string& dir, int64_t params, int groups) {
  std::vector<std::string> saved;
  const auto listed = ListCheckpoints(dir);
  for (const CheckpointInfo& c : listed.ok() ? *listed : std::vector<CheckpointInfo>{}) {
    if (c.complete) saved.push_back(c.dir);
  }
  const std::string latest = saved.at(0), previous = saved.at(1);
  LoadFigures f;
  auto e2 = MakeEngine(comm, dev, 3, params, groups);
  DropCaches(*comm);
  const double t = Now();
  auto lr = Load(latest, e2->state_view());
  f.load_s = bench::MaxOverRanks(Now() - t);
  f.load_bytes = bench::SumOverRanks(lr.ok() ? static_cast<double>(lr->bytes_read) : 0.0);
  e2.reset();
  auto sub = comm->Split(comm->rank() < 2 ? 0 : -1, comm->rank()).value();
  std::unique_ptr<ZeroEngine> e3;
  if (sub) e3 = MakeEngine(sub.get(), dev, 3, params, groups);
  DropCaches(*comm);
  double s = 0, b = 0;
  if (sub) {
    const double t0 = Now();
    auto r = Load(previous, e3->state_view());
    s = Now() - t0;
    b = r.ok() ? static_cast<double>(r->bytes_read) : 0;
  }
  f.reshard_s = bench::MaxOverRanks(s);
  f.reshard_bytes = bench::SumOverRanks(b);
  return f;
}

void PrintSavesAndLoads(int64_t params, int n, const std::string& codec_name, int writer_threads, double fio_w, double fio_r, double torch_load,
                        const SaveFigures& s, const LoadFigures& l) {
  std::printf("bench/checkpoint: %.0fM bf16 parameters + Adam, stage 3, %d ranks, %s per rank of fp32 state, %s, %d writer "
              "thread(s) per rank\n", params / 1e6, n, FormatBytes(s.bytes).c_str(), codec_name.c_str(), writer_threads);
  std::printf("  stall per save      %8.4f s   (copied at SaveAsync instead: %.4f s)   memcpy of the same bytes %8.3f s   "
              "ratio %.2f (target <= 1.2); staging %s per rank\n", s.stall, s.stall_at_save, s.memcpy_s, s.stall / s.memcpy_s,
              FormatBytes(static_cast<int64_t>(s.staged)).c_str());
  std::printf("  with a budget of %s: stall per save %8.4f s, staging %s per rank, steps %.3f s with the save in flight\n",
              FormatBytes(s.budget).c_str(), s.stall_budget, FormatBytes(static_cast<int64_t>(s.staged_budget)).c_str(), s.busy_budget);
  const double wmb = s.total_bytes / s.write_s / 1e6;
  std::printf("  background write    %8.0f MB/s (all ranks; %.0f MB/s of state before compression, %.3f s)   fio seq write %8.0f MB/s   "
              "ratio %.2f (target >= 0.85)%s\n", wmb, s.state_bytes / s.write_s / 1e6, s.write_s, fio_w, fio_w > 0 ? wmb / fio_w : 0.0,
              s.w.ok() ? "" : "  [save FAILED]");
  std::printf("  step time           %8.3f s plain, %8.3f s with a save in flight: slowdown %.1f%% (target < 10%%)\n", s.plain,
              s.busy, 100.0 * (s.busy / s.plain - 1));
  const double lmb = l.load_bytes / l.load_s / 1e6, rmb = l.reshard_bytes / l.reshard_s / 1e6;
  std::printf("  load %d -> %d         %8.0f MB/s   reshard-load %d -> 2 %8.0f MB/s   fio seq read %8.0f MB/s   torch.load %8.0f MB/s "
              "(caches dropped)\n", n, n, lmb, n, rmb, fio_r, torch_load);
  bench::PrintResult("checkpoint", "stall per save", s.stall, "s", s.memcpy_s, "memcpy s");
  bench::PrintResult("checkpoint", "stall per save, copied at SaveAsync", s.stall_at_save, "s", s.memcpy_s, "memcpy s");
  bench::PrintResult("checkpoint", "stall per save, staging budget " + FormatBytes(s.budget), s.stall_budget, "s", s.memcpy_s, "memcpy s");
  bench::PrintResult("checkpoint", "peak staging per rank", s.staged / 1048576.0, "MiB", s.bytes / 1048576.0, "state per rank MiB");
  bench::PrintResult("checkpoint", "peak staging per rank, budget " + FormatBytes(s.budget), s.staged_budget / 1048576.0, "MiB",
                     s.bytes / 1048576.0, "state per rank MiB");
  bench::PrintResult("checkpoint", "background write", wmb, "MB/s", fio_w, "fio seq write MB/s");
  bench::PrintResult("checkpoint", "step with save in flight", s.busy, "s", s.plain, "step without save s");
  bench::PrintResult("checkpoint", "load N->N", lmb, "MB/s", fio_r, "fio seq read MB/s", torch_load, "torch.load MB/s");
  bench::PrintResult("checkpoint", "reshard-load N->2", rmb, "MB/s", fio_r, "fio seq read MB/s", torch_load, "torch.load MB/s");
}

// Compression of realistic synthetic state (this bench's own training data is constant): weights ~
// N(0, 0.02) as bf16 and fp32 master, gradients ~ N(0, 1e-3) folded into Adam moments over 20 steps.
void PrintCompression() {
  const size_t take = size_t{16} << 20;
  std::mt19937_64 rng(7);
  std::normal_distribution<float> wdist(0.0f, 0.02f), gdist(0.0f, 1e-3f);
  std::vector<float> master(take), avg(take, 0.0f), avg_sq(take, 0.0f);
  for (size_t i = 0; i < take; ++i) master[i] = wdist(rng);
  for (int s = 0; s < 20; ++s) {
    for (size_t i = 0; i < take; ++i) {
      const float g = gdist(rng);
      avg[i] = 0.9f * avg[i] + 0.1f * g;
      avg_sq[i] = 0.999f * avg_sq[i] + 0.001f * g * g;
    }
  }
  std::vector<uint16_t> bf16(take);
  for (size_t i = 0; i < take; ++i) bf16[i] = FloatToBf16(master[i]);
  struct Case {
    const char* name;
    const void* data;
    size_t bytes, esize;
  } cases[] = {{"bf16 weights", bf16.data(), take * 2, 2}, {"fp32 master", master.data(), take * 4, 4},
               {"fp32 exp_avg", avg.data(), take * 4, 4}, {"fp32 exp_avg_sq", avg_sq.data(), take * 4, 4}};
  std::vector<char> scratch, out;
  for (const Case& c : cases) {
    for (Codec codec : {Codec::kZstd, Codec::kByteGroupZstd}) {
      const double t0 = Now();
      size_t stored = 0;
      for (size_t o = 0; o < c.bytes; o += size_t{4} << 20) {
        const size_t len = std::min(c.bytes - o, size_t{4} << 20);
        auto used = EncodeChunk(static_cast<const char*>(c.data) + o, len, c.esize, {codec, 1}, &scratch, &out);
        stored += used.ok() && *used != Codec::kRaw ? out.size() : len;
      }
      const double secs = Now() - t0;
      std::printf("  compress %-16s %-8s ratio %.2f  %6.0f MB/s per core\n", c.name, std::string(CodecName(codec)).c_str(),
                  static_cast<double>(c.bytes) / stored, c.bytes / secs / 1e6);
      char what[96];
      std::snprintf(what, sizeof(what), "compress %s %s (%.0f MB/s/core)", c.name, std::string(CodecName(codec)).c_str(), c.bytes / secs / 1e6);
      bench::PrintResult("checkpoint", what, static_cast<double>(c.bytes) / stored, "x smaller", 0, "-");
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  int64_t params = 250'000'000;
  int groups = 16;
  double fio_w = -1, fio_r = -1, torch_load = -1;
  std::string dir;
  CLI::App app{"checkpoint_bench: save stall, background write, load and reshard-load rates beside fio and memcpy"};
  app.add_option("--dir", dir, "checkpoint directory (written only here, and removed)")->required();
  app.add_option("--params", params, "bf16 parameters + Adam state")->capture_default_str();
  app.add_option("--fio-write-mbps", fio_w, "fio's sequential write rate on the same filesystem");
  app.add_option("--fio-read-mbps", fio_r, "fio's sequential read rate on the same filesystem");
  app.add_option("--torch-load-mbps", torch_load, "torch.load's rate for the same bytes, caches dropped (the loads' peer)");
  int64_t budget = 0;
  app.add_option("--staging-budget", budget, "CheckpointOptions::staging_budget_bytes of the budgeted save (0: a quarter of a rank's state)");
  int writer_nice = 0, writer_threads = 1;
  std::string codec_name = "raw";
  app.add_option("--writer-nice", writer_nice, "CheckpointOptions::writer_nice (the writer thread's priority)");
  app.add_option("--writer-threads", writer_threads, "CheckpointOptions::writer_threads (encoding threads per rank)")
      ->capture_default_str()->check(CLI::Range(1, 256));
  app.add_option("--codec", codec_name, "the saves' compression: raw, zstd or bg+zstd (level 1)")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  auto session = MpiSession::Init(&argc, &argv).value();
  auto comm = MpiCommunicator::Create().value();
  const int rank = comm->rank(), n = comm->size();
  if (rank == 0) std::filesystem::remove_all(dir);
  comm->Barrier().IgnoreError();
  CpuDevice dev;
  auto e = MakeEngine(comm.get(), &dev, 3, params, groups);
  const int64_t per_group = params / groups;
  CheckpointOptions co;
  co.root = dir;
  co.keep_last = 2;
  co.writer_nice = writer_nice;
  co.writer_threads = writer_threads;
  if (auto c = ParseCodec(codec_name); c.ok()) {
    co.compression.codec = *c;
  } else {
    if (rank == 0) std::fprintf(stderr, "checkpoint_bench: %s\n", c.status().ToString().c_str());
    return 2;
  }
  auto ck = Checkpointer::Create(comm.get(), &dev, co).value();
  // Warm-up save (allocates and touches the staging memory once).
  Step(*e, per_group);
  (void)ck->SaveAsync(e->state_view());
  (void)ck->Wait();
  const SaveFigures saves = MeasureSaves(comm.get(), &dev, *e, *ck, co, per_group, budget);
  e.reset();
  ck.reset();
  const LoadFigures loads = MeasureLoads(comm.get(), &dev, dir, params, groups);
  if (rank == 0) {
    PrintSavesAndLoads(params, n, codec_name, writer_threads, fio_w, fio_r, torch_load, saves, loads);
    PrintCompression();
    std::filesystem::remove_all(dir);
  }
  SavePerPrecision(comm.get(), &dev, co, dir, params, groups);
  SaveHybrid(comm.get(), &dev, co, dir, params, groups);
  if (rank == 0) std::filesystem::remove_all(dir);
  return 0;
}
