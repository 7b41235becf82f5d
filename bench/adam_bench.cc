// bench/adam: CPU AdamW throughput against the memory bandwidth it needs, measured in the same run.
//
// For each case (gradient dtype f32/bf16, with/without the bf16 parameter copy, 1 and 2 threads) it
// times AdamCpu over one shard and a bandwidth probe that moves exactly the same bytes (reads p, g, m,
// v; writes p, m, v and the copy) with trivial arithmetic. The ratio adam/probe says how close the
// kernel is to the memory limit. Then the compact-state step (core/quant_math.h) per moment format,
// with and without a master, beside a probe of its own traffic and the f32-state step, in
// interleaved rounds (--reps of them: each round times every case and probe once; medians of the
// rounds), and each case's cost per element in cache (one thread, 32K elements). The peer (torch.optim.AdamW, when Debian's python3-torch is
// installed) is measured by bench/adam_peer.py and passed in with --peer-gelems.
//
//   adam_bench [--elements N] [--reps R] [--peer-gelems X] [--isa avx512|avx2|scalar]  (auto: avx512bf16 where the CPU has it)
#include <CLI/CLI.hpp>

#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "zrt/kernels/adam.h"
#include "zrt/core/device.h"
#include "zrt/core/thread_pool.h"

using namespace zrt;
using namespace zrt::kernels;

namespace {

struct Buffers {
  DeviceBuffer p, m, v, g32, g16, copy;
};

// Same traffic as the Adam step, trivial arithmetic: the achievable bandwidth for this access pattern.
// kPrefetch adds the kernel's software prefetch; the limit reported is the faster of the two probes.
template <bool kBf16Grad, bool kCopy, bool kPrefetch>
void ProbeRange(Buffers& b, int64_t lo, int64_t hi) {
  float* __restrict p = b.p.as<float>();
  float* __restrict m = b.m.as<float>();
  float* __restrict v = b.v.as<float>();
  const float* __restrict g32 = b.g32.as<float>();
  const uint16_t* __restrict g16 = b.g16.as<uint16_t>();
  uint16_t* __restrict c = b.copy.as<uint16_t>();
  constexpr int64_t kBlock = kPrefetch ? 16 : int64_t{1} << 40, kAhead = 256;  // no prefetch: one plain loop
  for (int64_t blk = lo; blk < hi; blk += kBlock) {
    if constexpr (kPrefetch) {
      __builtin_prefetch(p + blk + kAhead, 1, 3);
      __builtin_prefetch(m + blk + kAhead, 1, 3);
      __builtin_prefetch(v + blk + kAhead, 1, 3);
      __builtin_prefetch(kBf16Grad ? static_cast<const void*>(g16 + blk + kAhead) : g32 + blk + kAhead, 0, 3);
    }
    const int64_t end = std::min(hi, blk + kBlock);
    for (int64_t i = blk; i < end; ++i) {
      float g;
      if constexpr (kBf16Grad) {
        const uint32_t u = static_cast<uint32_t>(g16[i]) << 16;
        std::memcpy(&g, &u, 4);
      } else {
        g = g32[i];
      }
      const float np = p[i] + g;
      p[i] = np;
      m[i] += g;
      v[i] += g;
      if constexpr (kCopy) {
        uint32_t u;
        std::memcpy(&u, &np, 4);
        c[i] = static_cast<uint16_t>(u >> 16);
      }
    }
  }
}

template <bool kPrefetch>
void Probe(ThreadPool& pool, int threads, Buffers& b, int64_t n, bool bf16_grad, bool copy, int64_t chunk) {
  const int64_t items = (n + chunk - 1) / chunk;
  pool.ParallelFor(
      items,
      [&](int64_t k) {
        const int64_t lo = k * chunk, hi = std::min(n, lo + chunk);
        if (bf16_grad) {
          copy ? ProbeRange<true, true, kPrefetch>(b, lo, hi) : ProbeRange<true, false, kPrefetch>(b, lo, hi);
        } else {
          copy ? ProbeRange<false, true, kPrefetch>(b, lo, hi) : ProbeRange<false, false, kPrefetch>(b, lo, hi);
        }
      },
      threads);
}

// The same traffic as a compact step: each stream's bytes of a chunk read (and written back, for the
// state) in 8-byte words. kInterleaved: a tile of elements at a time, every stream's bytes of the tile
// (as a fused step moves them), each stream prefetched a tile ahead; otherwise stream after stream.
// The limit reported is the faster of the two.
struct Stream {
  void* data;
  double bytes_per_element;
  bool write;
};
volatile uint64_t probe_zero = 0;  // opaque to the compiler: the probe's writes are real stores
template <bool kInterleaved>
void ByteProbe(ThreadPool& pool, int threads, const std::vector<Stream>& streams, int64_t n, int64_t chunk) {
  const int64_t items = (n + chunk - 1) / chunk;
  constexpr int64_t kTile = 256;
  const uint64_t zero = probe_zero;
  std::vector<uint64_t> sink(static_cast<size_t>(items));
  pool.ParallelFor(
      items,
      [&](int64_t k) {
        uint64_t acc = 0;
        const int64_t lo = k * chunk, hi = std::min(n, lo + chunk), tile = kInterleaved ? kTile : hi - lo;
        for (int64_t t0 = lo; t0 < hi; t0 += tile) {
          const int64_t t1 = std::min(hi, t0 + tile);
          for (const Stream& st : streams) {
            const auto wlo = static_cast<int64_t>(static_cast<double>(t0) * st.bytes_per_element) / 8;
            const auto whi = static_cast<int64_t>(static_cast<double>(t1) * st.bytes_per_element) / 8;
            uint64_t* __restrict w = static_cast<uint64_t*>(st.data);
            if constexpr (kInterleaved) {
              for (int64_t a = whi; a < whi + (whi - wlo); a += 8) __builtin_prefetch(w + a, 1, 3);
            }
            if (st.write) {
              for (int64_t i = wlo; i < whi; ++i) w[i] ^= zero;  // written back unchanged: the state stays valid
            } else {
              for (int64_t i = wlo; i < whi; ++i) acc ^= w[i];
            }
          }
        }
        sink[static_cast<size_t>(k)] = acc;
      },
      threads);
}

DeviceBuffer Alloc(CpuDevice& dev, size_t bytes) {
  auto r = dev.Allocate(bytes, MemCategory::kOptimizerState, 4096);
  if (!r.ok()) {
    std::fprintf(stderr, "%s\n", r.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(*r);
}

// One moment format's state, zeroed (a valid state in every format). Each compact case runs over its
// own format's (its cases with and without a master share it): a case never reads another format's
// bytes as its own, since a q8 code read from f32 bytes is often of exponent 0 and a bf16 often
// subnormal, which costs an Intel core a microcode assist per operation and measures nothing a
// trainer sees. The values' buffers have room for the scales too: the probe reads those bytes with them.
struct FormatState {
  DeviceBuffer m, v, ms, vs;  // values, scales
};
FormatState ZeroedState(CpuDevice& dev, Precision m, Precision v, int64_t n) {
  FormatState st;
  auto zeroed = [&](DeviceBuffer& d, int64_t bytes) {
    d = Alloc(dev, static_cast<size_t>(bytes));
    std::memset(d.data(), 0, d.size());
  };
  zeroed(st.m, StateFormat::Of(m, "exp_avg", 256).Bytes(n));
  zeroed(st.v, StateFormat::Of(v, "exp_avg_sq", 256).Bytes(n));
  zeroed(st.ms, (n / 256 + 1) * 4);
  zeroed(st.vs, (n / 256 + 1) * 4);
  return st;
}

// Compact state (issue 34): the fused step per moment format and master choice at 2 threads, bf16
// gradients, beside the probe of its own traffic and the f32-state step. Interleaved rounds: each
// round times every case and every probe once, so a host whose bandwidth or clock drifts moves them
// together; each ratio is the median of the rounds' ratios (the step against its probe, and against
// the f32 state's step, in the same round).
void CompactCases(CpuDevice& dev, ThreadPool& pool, Buffers& b, int64_t n, int reps, CpuIsa isa, const AdamStepScalars& s) {
  struct Case {
    const char* name;
    Precision m, v;
    bool master;
  };
  const Case cases[] = {{"f32 moments + master", Precision::kF32, Precision::kF32, true},
                        {"bf16 moments + master", Precision::kBF16, Precision::kBF16, true},
                        {"q8 moments + master", Precision::kQ8, Precision::kQ8, true},
                        {"bf16 moments, no master", Precision::kBF16, Precision::kBF16, false},
                        {"q8 moments, no master", Precision::kQ8, Precision::kQ8, false},
                        {"q4 moments + master", Precision::kQ4, Precision::kQ4, true},
                        {"q4 moments, no master", Precision::kQ4, Precision::kQ4, false}};
  struct Row {
    const Case* c;
    AdamCompactArgs t;
    std::vector<Stream> probe;
    double bytes;
    std::vector<double> step, limit, vs_limit, vs_f32;  // per round
    double cached = 0;  // ns per element in cache
  };
  CpuKernelOptions o;
  o.pool = &pool;
  o.threads = 2;
  o.isa = isa;
  std::map<std::pair<Precision, Precision>, FormatState> states;
  std::vector<Row> rows;
  for (const Case& c : cases) {
    if (!states.contains({c.m, c.v})) states.emplace(std::pair{c.m, c.v}, ZeroedState(dev, c.m, c.v, n));
    const CompactFormat f{.exp_avg = c.m, .exp_avg_sq = c.v, .master = c.master};
    auto mb = [](Precision k) { return static_cast<double>(StateFormat::Of(k, "exp_avg", 256).Bytes(256)) / 256; };
    void* param = c.master ? b.p.data() : b.copy.data();
    FormatState& st = states.at({c.m, c.v});
    const AdamCompactArgs t{param, b.g16.data(), st.m.data(), st.ms.as<float>(), st.v.data(), st.vs.as<float>(),
                            c.master ? b.copy.data() : nullptr, n, 0, f};
    std::vector<Stream> probe = {{param, c.master ? 4.0 : 2.0, true}, {b.g16.data(), 2, false}, {st.m.data(), mb(c.m), true},
                                 {st.v.data(), mb(c.v), true}};
    double bytes = 2;  // gradient
    for (size_t k = 0; k < probe.size(); ++k) bytes += k == 1 ? 0 : 2 * probe[k].bytes_per_element;
    if (c.master) bytes += 2;  // the bf16 copy written
    if (c.master) probe.push_back({b.copy.data(), 2, true});  // (a read + write: slightly more than the kernel's write)
    rows.push_back({&c, t, probe, bytes, {}, {}, {}, {}});
  }
  auto step = [&](const Row& r) { (void)AdamCompactCpu(s, 10, std::span(&r.t, 1), DType::kBF16, DType::kBF16, o); };
  for (const Row& r : rows) step(r);  // warm-up
  for (int round = 0; round < reps; ++round) {
    for (Row& r : rows) {
      r.step.push_back(bench::Seconds([&] { step(r); }));
      r.limit.push_back(std::min(bench::Seconds([&] { ByteProbe<false>(pool, 2, r.probe, n, o.chunk); }),
                                 bench::Seconds([&] { ByteProbe<true>(pool, 2, r.probe, n, o.chunk); })));
      r.vs_limit.push_back(r.limit.back() / r.step.back());
      r.vs_f32.push_back(rows[0].step.back() / r.step.back());
    }
  }
  // In cache: one thread over the first 32K elements, the minimum of 2000 calls per case, the cases in
  // turn. Compute alone, and steadier than the rounds on a host whose memory speed drifts: the figure
  // to compare two builds by (alternate their runs).
  CpuKernelOptions one = o;
  one.threads = 1;
  for (int call = 0; call < 2000; ++call) {
    for (Row& r : rows) {
      AdamCompactArgs t = r.t;
      t.numel = std::min<int64_t>(n, 32768);
      const double ns = bench::Seconds([&] { (void)AdamCompactCpu(s, 10, std::span(&t, 1), DType::kBF16, DType::kBF16, one); }) * 1e9 / t.numel;
      r.cached = call == 0 ? ns : std::min(r.cached, ns);
    }
  }
  std::printf("\ncompact state, 2 threads, bf16 gradients (bytes per parameter moved: read + written), median of %d interleaved rounds;\n"
              "in cache: ns per element, 1 thread, 32K elements, min of 2000 calls\n", reps);
  std::printf("%-26s %8s %12s %10s %12s %8s %10s %9s\n", "case", "B/param", "adam Gel/s", "adam GB/s", "probe GB/s", "ratio", "vs f32",
              "in cache");
  for (const Row& r : rows) {
    const double ta = bench::Median(r.step), tp = bench::Median(r.limit);
    const double gel = n / ta / 1e9, gbs = r.bytes * n / ta / 1e9, pgbs = r.bytes * n / tp / 1e9;
    const double ratio = bench::Median(r.vs_limit), vs_f32 = bench::Median(r.vs_f32);
    std::printf("%-26s %8.2f %12.3f %10.2f %12.2f %8.2f %10.2f %9.3f\n", r.c->name, r.bytes, gel, gbs, pgbs, ratio, vs_f32, r.cached);
    bench::PrintResult("adam", std::string("compact ") + r.c->name + ", 2t", gbs, "GB/s", gbs / ratio, "probe GB/s");
    bench::PrintResult("adam", std::string("compact ") + r.c->name + ", 2t vs f32 state", gel, "Gelem/s", gel / vs_f32,
                       "f32-state Gelem/s");
  }
}

}  // namespace

int main(int argc, char** argv) {
  int64_t n = int64_t{256} << 20;
  int reps = 5;
  double peer = -1;
  std::string isa_name = "auto";
  CLI::App app{"adam_bench: the fused CPU AdamW against memory bandwidth measured in the same run (and a peer's rate)"};
  app.add_option("--elements", n, "parameters per step")->capture_default_str();
  app.add_option("--reps", reps, "timed repetitions (median)")->capture_default_str();
  app.add_option("--peer-gelems", peer, "the peer's rate in G elements/s (bench/adam_peer.py), printed beside");
  app.add_option("--isa", isa_name, "auto | avx512 | avx2 | scalar")->check(CLI::IsMember({"auto", "avx512", "avx2", "scalar"}))->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  const CpuIsa isa = isa_name == "avx512" ? CpuIsa::kAvx512 : isa_name == "avx2" ? CpuIsa::kAvx2 : isa_name == "scalar" ? CpuIsa::kScalar : CpuIsa::kAuto;
  CpuDevice dev;
  Buffers b;
  auto alloc = [&](DeviceBuffer& d, size_t bytes) { d = Alloc(dev, bytes); };
  const size_t un = static_cast<size_t>(n);
  alloc(b.p, un * 4);
  alloc(b.m, un * 4);
  alloc(b.v, un * 4);
  alloc(b.g32, un * 4);
  alloc(b.g16, un * 2);
  alloc(b.copy, un * 2);
  ThreadPool pool(1, "bench");
  // First touch (page faults) outside the timings, with realistic values.
  pool.ParallelFor(static_cast<int64_t>((un + (1 << 20) - 1) >> 20), [&](int64_t k) {
    const size_t lo = static_cast<size_t>(k) << 20, hi = std::min(un, lo + (size_t{1} << 20));
    for (size_t i = lo; i < hi; ++i) {
      b.p.as<float>()[i] = 0.01f * static_cast<float>(i % 97);
      b.m.as<float>()[i] = 0;
      b.v.as<float>()[i] = 0;
      b.g32.as<float>()[i] = 1e-3f * static_cast<float>(i % 89) - 0.04f;
      b.g16.as<uint16_t>()[i] = FloatToBf16(b.g32.as<float>()[i]);
      b.copy.as<uint16_t>()[i] = 0;
    }
  });
  AdamConfig cfg;
  cfg.weight_decay = 0.01;
  const AdamStepScalars s = *MakeAdamStepScalars(cfg, 10);
  std::printf("bench/adam: %lld elements (%.1f GiB of fp32 state), isa %s, median of %d\n", static_cast<long long>(n),
              12.0 * n / (1 << 30), std::string(CpuIsaName(isa == CpuIsa::kAuto ? DetectCpuIsa() : isa)).c_str(), reps);
  std::printf("%-24s %7s %12s %10s %12s %8s\n", "case", "threads", "adam Gel/s", "adam GB/s", "probe GB/s", "ratio");
  for (int threads : {1, 2}) {
    for (bool bf16 : {false, true}) {
      for (bool copy : {false, true}) {
        AdamTensorArgs t{b.p.as<float>(), bf16 ? static_cast<const void*>(b.g16.data()) : b.g32.data(), b.m.as<float>(),
                         b.v.as<float>(), nullptr, copy ? b.copy.data() : nullptr, n};
        CpuKernelOptions o;
        o.pool = &pool;
        o.threads = threads;
        o.isa = isa;
        const double bytes = static_cast<double>(n) * (12 + (bf16 ? 2 : 4) + 12 + (copy ? 2 : 0));
        const double ta = bench::MedianSeconds([&] { (void)AdamCpu(s, std::span(&t, 1), bf16 ? DType::kBF16 : DType::kF32, DType::kBF16, o); }, reps);
        const double tp = std::min(bench::MedianSeconds([&] { Probe<false>(pool, threads, b, n, bf16, copy, o.chunk); }, reps),
                                   bench::MedianSeconds([&] { Probe<true>(pool, threads, b, n, bf16, copy, o.chunk); }, reps));
        const std::string name = std::string(bf16 ? "grad bf16" : "grad f32") + (copy ? " + bf16 copy" : "");
        const double gel = n / ta / 1e9, gbs = bytes / ta / 1e9, pgbs = bytes / tp / 1e9;
        std::printf("%-24s %7d %12.3f %10.2f %12.2f %8.2f\n", name.c_str(), threads, gel, gbs, pgbs, gbs / pgbs);
        bench::PrintResult("adam", name + ", " + std::to_string(threads) + "t", gbs, "GB/s", pgbs, "probe GB/s",
                           threads == 2 && !bf16 && !copy ? peer * bytes / n : -1, "torch AdamW GB/s");
      }
    }
  }
  CompactCases(dev, pool, b, n, reps, isa, s);
  return 0;
}
