// bench/mesh: flat ZeRO-3 against flat ZeRO-3 with quantized weight gathers (qwZ), with qwZ and
// quantized gradient reductions (qgZ), and hybrid sharding
// (shard groups = nodes) on the nodes this job runs on
// (scripts/cluster emulates them; docs/cluster.md). Per step and rank: the step time, the bytes that
// crossed nodes (measured: the node's eth0 counters, all its ranks' traffic, divided among them; on
// one machine without emulated nodes there is no eth0 and only the engine's figures are printed), and
// the engine's own count of what it moved (gathers, reductions, the replicas' all-reduce), beside the
// analytic volumes and the link rate given.
//   scripts/cluster --nodes 2 --ranks-per-node 2 --rate 1gbit -- build/bench/mesh_bench --link-gbit 1
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <tuple>
#include <vector>

#include "bench/bench_engine.h"
#include "zrt/core/device.h"
#include "zrt/core/dtype.h"
#include "zrt/core/mpi_communicator.h"

namespace {

using namespace zrt;

// This node's eth0 bytes sent and received, or -1 where there is none (not an emulated node).
double Eth0Bytes() {
  double total = 0;
  for (const char* f : {"/sys/class/net/eth0/statistics/tx_bytes", "/sys/class/net/eth0/statistics/rx_bytes"}) {
    std::ifstream in(f);
    double v = 0;
    if (!(in >> v)) return -1;
    total += v;
  }
  return total;
}

struct Figures {
  double step_s = 0;     // median over steps of the slowest rank's step
  double cross = -1;     // bytes per rank per step on the nodes' links (sent + received, halved)
  double gather = 0, reduce = 0, replica = 0;  // the engine's count, per rank per step
};

// A ZeRO-3 step as a trainer runs it: every group gathered for the forward, again for the backward.
void Step(ZeroEngine& e, int64_t n_per_group) {
  for (int g = 0; g < e.num_groups(); ++g) {
    (void)e.Gather(g);
    (void)e.Release(g);
  }
  bench::Step(e, n_per_group);
}

Figures Run(Communicator* comm, Device* dev, MPI_Comm node, int shards, DType reduce, int64_t params, int groups, int steps,
            bool quantized_weights = false, bool quantized_gradients = false, int secondary = 0, int gradient_bits = 8) {
  EngineConfig cfg;
  cfg.quantized_weights = quantized_weights;
  cfg.quantized_gradients = quantized_gradients;
  cfg.quantized_gradient_bits = gradient_bits;
  cfg.secondary_shard_group = secondary;
  cfg.reduce_dtype = reduce;
  cfg.stage = 3;
  cfg.shard_group_size = shards;
  cfg.optimizer_threads = 1;
  cfg.bucket_bytes = 8 << 20;
  auto e = ZeroEngine::Create(comm, dev, cfg).value();
  for (int g = 0; g < groups; ++g) (void)e->AddParam("w" + std::to_string(g), {params / groups}, DType::kBF16, {.group = "l" + std::to_string(g)});
  (void)e->Finalize([](int64_t, int64_t off, int64_t n, float* out) {
    for (int64_t i = 0; i < n; ++i) out[i] = 0.01f * static_cast<float>((off + i) % 97);
  });
  Step(*e, params / groups);  // warm: buffers allocated, prefetch order recorded
  int local = 0;
  MPI_Comm_rank(node, &local);
  MPI_Barrier(MPI_COMM_WORLD);
  const CommStats before = e->comm_stats();
  const double eth_before = local == 0 ? Eth0Bytes() : 0;
  std::vector<double> times;
  for (int s = 0; s < steps; ++s) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    Step(*e, params / groups);
    times.push_back(bench::MaxOverRanks(MPI_Wtime() - t0));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const double eth_after = local == 0 ? Eth0Bytes() : 0;
  const CommStats after = e->comm_stats();
  Figures f;
  std::sort(times.begin(), times.end());
  f.step_s = times[times.size() / 2];
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  double have = local == 0 && eth_before >= 0 ? 1 : (local == 0 ? 0 : 1);
  MPI_Allreduce(MPI_IN_PLACE, &have, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  if (have > 0) {
    // Each byte crossing is sent by one node and received by another: half the nodes' sum.
    f.cross = bench::SumOverRanks(local == 0 ? eth_after - eth_before : 0) / 2 / n / steps;
  }
  f.gather = bench::MaxOverRanks(static_cast<double>(after.gather_bytes - before.gather_bytes)) / steps;
  f.reduce = bench::MaxOverRanks(static_cast<double>(after.reduce_bytes - before.reduce_bytes)) / steps;
  f.replica = bench::MaxOverRanks(static_cast<double>(after.replica_bytes - before.replica_bytes)) / steps;
  return f;
}

// Flat ZeRO-3 with ZeRO++'s options (qwZ: the gathers as int8 codes and a scale per 256 values; qgZ:
// the reduce-scatters likewise, qgZ4 in int4 codes; hpZ: the backward's gathers inside a node), beside
// flat: the lines and the RESULT rows.
void ReportZeroPlusPlus(const Figures& flat, const std::vector<std::pair<std::string, Figures>>& runs, int n, const std::string& reduce_name,
                        double link_gbit) {
  auto mb = [](double b) { return b / 1e6; };
  for (const auto& [label, f] : runs) {
    const char* name = label.c_str();
    std::printf("   flat ZeRO-3 + %s: step %.3f s; engine moved %.1f MB/rank (gathers %.1f, reductions %.1f)", name, f.step_s,
                mb(f.gather + f.reduce), mb(f.gather), mb(f.reduce));
    if (f.cross >= 0) std::printf("; crossed nodes %.1f MB/rank", mb(f.cross));
    const double ratio = flat.cross > 0 && f.cross >= 0 ? f.cross / flat.cross : (f.gather + f.reduce) / (flat.gather + flat.reduce);
    std::printf("; %.3f of flat's bytes, step %.2fx\n", ratio, f.step_s / flat.step_s);
    const std::string tag = "N=" + std::to_string(n) + " " + name + " " + reduce_name + (link_gbit > 0 ? " " + std::to_string(static_cast<int>(link_gbit)) + "gbit" : "");
    std::printf("RESULT\tmesh\t%s cross-node bytes\t%.0f\tMB/rank/step\t%.0f\tflat ZeRO-3\t%.3f\t-\t-\n", tag.c_str(),
                mb(f.cross >= 0 ? f.cross : f.gather + f.reduce), mb(flat.cross >= 0 ? flat.cross : flat.gather + flat.reduce), ratio);
    std::printf("RESULT\tmesh\t%s step\t%.3f\ts\t%.3f\tflat ZeRO-3\t%.3f\t-\t-\n", tag.c_str(), f.step_s, flat.step_s, f.step_s / flat.step_s);
  }
}

// Hybrid sharding over the nodes (S = ranks per node, R = nodes) beside flat: the lines and the RESULT rows.
void ReportHybrid(const Figures& flat, const Figures& hybrid, int n, int per_node, int nodes, const std::string& reduce_name, double link_gbit,
                  double hybrid_cross) {
  auto mb = [](double b) { return b / 1e6; };
  const double S = per_node;
    std::printf("   hybrid (S=%d, R=%d): step %.3f s; engine moved %.1f MB/rank (gathers %.1f, reductions %.1f of which replicas' %.1f); "
                "analytic across %.1f MB",
                per_node, nodes, hybrid.step_s, mb(hybrid.gather + hybrid.reduce), mb(hybrid.gather), mb(hybrid.reduce),
                mb(hybrid.replica), mb(hybrid_cross));
    if (hybrid.cross >= 0) std::printf("; crossed nodes %.1f MB/rank", mb(hybrid.cross));
    std::printf("\n");
    const double ratio = flat.cross > 0 && hybrid.cross >= 0 ? hybrid.cross / flat.cross : hybrid.replica / (flat.gather + flat.reduce);
    std::printf("   hybrid/flat: bytes across nodes %.3f (target <= 0.5; %s), step time %.2f (target < 1 at the slow link)\n", ratio,
                flat.cross > 0 ? "measured on the links" : "engine figures, no emulated links", hybrid.step_s / flat.step_s);
    if (link_gbit > 0 && hybrid.cross >= 0) {
      std::printf("   the link: %.1f MB per step per node at %.1f Gbit/s is %.3f s flat, %.3f s hybrid\n", mb(flat.cross * S), link_gbit,
                  flat.cross * S * 8 / (link_gbit * 1e9), hybrid.cross * S * 8 / (link_gbit * 1e9));
    }
    const std::string tag = "N=" + std::to_string(n) + " S=" + std::to_string(per_node) + " " + reduce_name + (link_gbit > 0 ? " " + std::to_string(static_cast<int>(link_gbit)) + "gbit" : "");
    std::printf("RESULT\tmesh\t%s cross-node bytes\t%.0f\tMB/rank/step\t%.0f\tflat ZeRO-3\t%.3f\t-\t-\n", tag.c_str(),
                mb(hybrid.cross >= 0 ? hybrid.cross : hybrid.replica), mb(flat.cross >= 0 ? flat.cross : flat.gather + flat.reduce), ratio);
    std::printf("RESULT\tmesh\t%s step\t%.3f\ts\t%.3f\tflat ZeRO-3\t%.3f\t-\t-\n", tag.c_str(), hybrid.step_s, flat.step_s,
                hybrid.step_s / flat.step_s);
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  CLI::App app{"bench/mesh: flat ZeRO-3 against hybrid sharding across nodes"};
  int64_t params = 20000000;
  int groups = 8, steps = 5;
  double link_gbit = 0;
  std::string reduce_name = "f32";
  app.add_option("--params", params, "bf16 parameters");
  app.add_option("--groups", groups, "parameter groups (gather/reduce units)");
  app.add_option("--steps", steps, "timed steps");
  app.add_option("--reduce-dtype", reduce_name, "gradient reductions: f32 or bf16 (the engine's reduce_dtype)");
  app.add_option("--link-gbit", link_gbit, "the node links' rate, for the report (scripts/cluster --rate)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    MPI_Finalize();
    return rc;
  }
  {
    const DType reduce = ParseDType(reduce_name).value();
    auto comm = MpiCommunicator::Create(MPI_COMM_WORLD).value();
    comm->set_check_args(false);
    CpuDevice dev;
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, comm->rank(), MPI_INFO_NULL, &node);
    int per_node = 0;
    MPI_Comm_size(node, &per_node);
    const int n = comm->size(), nodes = n / per_node;
    const double model = 2.0 * static_cast<double>(params);  // bf16 bytes
    if (comm->rank() == 0) {
      std::printf("== bench/mesh: %d ranks on %d node(s) x %d, %.0fM bf16 parameters, stage 3, %s reductions, link %s\n", n, nodes,
                  per_node, params / 1e6, reduce_name.c_str(), link_gbit > 0 ? (std::to_string(link_gbit) + " Gbit/s").c_str() : "not given");
    }
    const Figures flat = Run(comm.get(), &dev, node, 0, reduce, params, groups, steps);
    // ZeRO++'s options on flat ZeRO-3; hpZ's secondary group a node (where the world spans several).
    std::vector<std::pair<std::string, Figures>> plus;
    // (qgZ4: qgZ's codes in int4.)
    for (const auto& [name, qw, qg, hpz, bits] :
         {std::tuple{"qwZ", true, false, false, 8}, std::tuple{"qwZ+qgZ", true, true, false, 8}, std::tuple{"qwZ+qgZ4", true, true, false, 4},
          std::tuple{"hpZ", false, false, true, 8}, std::tuple{"qwZ+hpZ+qgZ", true, true, true, 8},
          std::tuple{"qwZ+hpZ+qgZ4", true, true, true, 4}}) {
      if (hpz && !(per_node >= 2 && per_node < n && n % per_node == 0)) continue;
      plus.emplace_back(name, Run(comm.get(), &dev, node, 0, reduce, params, groups, steps, qw, qg, hpz ? per_node : 0, bits));
    }
    Figures hybrid;
    const bool hybrid_ok = nodes > 1 && per_node * nodes == n;
    if (hybrid_ok) hybrid = Run(comm.get(), &dev, node, per_node, reduce, params, groups, steps);
    if (comm->rank() == 0) {
      const double S = per_node, R = nodes, N = n;
      // Analytic per rank per step (G: the gradient in the reduce dtype): flat moves two gathers of
      // M (N-1)/N and a reduce-scatter of G (N-1)/N; hybrid moves only 2 (G / S) (R-1)/R across groups.
      const double G = static_cast<double>(params) * static_cast<double>(DTypeSize(reduce));
      const double flat_all = 2 * model * (N - 1) / N + G * (N - 1) / N;
      const double hybrid_cross = 2 * (G / S) * (R - 1) / R;
      auto mb = [](double b) { return b / 1e6; };
      std::printf("   flat ZeRO-3 (S=%d): step %.3f s; engine moved %.1f MB/rank (gathers %.1f, reductions %.1f); analytic %.1f MB",
                  n, flat.step_s, mb(flat.gather + flat.reduce), mb(flat.gather), mb(flat.reduce), mb(flat_all));
      if (flat.cross >= 0) std::printf("; crossed nodes %.1f MB/rank", mb(flat.cross));
      std::printf("\n");
      ReportZeroPlusPlus(flat, plus, n, reduce_name, link_gbit);
      if (hybrid_ok) ReportHybrid(flat, hybrid, n, per_node, nodes, reduce_name, link_gbit, hybrid_cross);
    }
    MPI_Comm_free(&node);
  }
  MPI_Finalize();
  return 0;
}
