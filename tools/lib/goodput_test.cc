#include "tools/lib/goodput.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tools/lib/plan.h"

namespace zrt::tools {
namespace {

// Daly's formula worked by hand: stall 60 s, MTBF 1 h: sqrt(2 * 60 * 3600) = 657.267,
// x = 60 / 7200, [1 + sqrt(x)/3 + x/9] = 1.031355, minus the stall: 617.88 s.
TEST(Goodput, DalysIntervalByHand) {
  EXPECT_NEAR(DalyInterval(60, 3600), 617.88, 0.01);
  EXPECT_NEAR(DalyInterval(10, 3600), 261.70, 0.01);
  EXPECT_NEAR(DalyInterval(1e-3, 1e6), std::sqrt(2 * 1e-3 * 1e6), 1e-3);  // Young's, to first order
  EXPECT_EQ(DalyInterval(0, 3600), 0);
  EXPECT_EQ(DalyInterval(8000, 3600), 3600);  // a save longer than 2 MTBF: save once per MTBF
}

GoodputInput Hand() {
  GoodputInput in;
  in.mtbf_seconds = 3600;
  in.costs = {.disk_stall = 10, .disk_write = 30, .tier_stall = 1, .tier_write = 2, .disk_restart = 60, .own_restart = 5,
              .replica_restart = 10, .relaunch = 120};
  in.node_loss = 0.5;
  in.tier_miss = 0.2;
  in.slowdown = 0;
  return in;
}

// Disk only, by hand: tau = Daly(10, 3600) = 261.70 s; lost = 261.70/2 + 30 = 160.85 s; stall 120 + 60;
// ETTR = (1 - 340.85/3600) / (1 + 10/261.70) = 0.87200.
TEST(Goodput, DiskOnlyByHand) {
  const Scenario d = PredictGoodput(Hand()).disk_only;
  EXPECT_NEAR(d.disk_interval, 261.70, 0.01);
  EXPECT_NEAR(d.work_lost, 160.85, 0.01);
  EXPECT_DOUBLE_EQ(d.stall, 180);
  EXPECT_NEAR(d.save_share, 10 / 261.70, 1e-5);
  EXPECT_NEAR(d.ettr, 0.87200, 1e-4);
  EXPECT_EQ(d.tier_interval, 0);
  EXPECT_EQ(d.wall_seconds, 0);  // no training time given
}

// With the tier, by hand: 80% of failures roll back to the tier (MTBF 4500 s for it): tau_m =
// Daly(1, 4500) = 94.20 s; 20% to disk (MTBF 18000 s): tau_d = Daly(10, 18000) = 593.35 s.
// lost = 0.8 (94.20/2 + 2) + 0.2 (593.35/2 + 30) = 39.28 + 65.34 = 104.62 s;
// stall = 120 + 0.8 (0.5 * 5 + 0.5 * 10) + 0.2 * 60 = 138 s; saves' share 1/94.20 + 10/593.35 = 0.027469;
// ETTR = (1 - 242.62/3600) / 1.027469 = 0.90767.
TEST(Goodput, MemoryTierByHand) {
  const Scenario t = PredictGoodput(Hand()).with_tier;
  EXPECT_NEAR(t.tier_interval, 94.20, 0.01);
  EXPECT_NEAR(t.disk_interval, 593.35, 0.01);
  EXPECT_NEAR(t.work_lost, 104.62, 0.01);
  EXPECT_DOUBLE_EQ(t.stall, 138);
  EXPECT_NEAR(t.save_share, 0.027469, 1e-5);
  EXPECT_NEAR(t.ettr, 0.90767, 1e-4);
}

// The tier without replicas, by hand: only the 80% x 50% = 40% of failures that keep their node roll
// back to it (MTBF 9000 s): tau_m = Daly(1, 9000) = 133.50 s, restorable at once (no replica);
// 60% to disk (MTBF 6000 s): tau_d = Daly(10, 6000) = 339.78 s.
// lost = 0.4 (133.50/2) + 0.6 (339.78/2 + 30) = 26.70 + 119.93 = 146.63 s;
// stall = 120 + 0.4 * 5 + 0.6 * 60 = 158 s; saves' share 1/133.50 + 10/339.78 = 0.036922;
// ETTR = (1 - 304.63/3600) / 1.036922 = 0.88279. Replicas save 146.63 - 104.62 s per failure.
TEST(Goodput, MemoryTierWithoutReplicasByHand) {
  const Goodput g = PredictGoodput(Hand());
  const Scenario& o = g.own_copies;
  EXPECT_NEAR(o.tier_interval, 133.50, 0.01);
  EXPECT_NEAR(o.disk_interval, 339.78, 0.01);
  EXPECT_NEAR(o.work_lost, 146.63, 0.01);
  EXPECT_DOUBLE_EQ(o.stall, 158);
  EXPECT_NEAR(o.save_share, 0.036922, 1e-5);
  EXPECT_NEAR(o.ettr, 0.88279, 1e-4);
  EXPECT_LT(g.with_tier.work_lost, o.work_lost);
  EXPECT_LT(o.work_lost, g.disk_only.work_lost);
  // No node is ever lost: the replicas change nothing but their own cost.
  GoodputInput in = Hand();
  in.node_loss = 0;
  in.costs.tier_write = 0;
  const Goodput h = PredictGoodput(in);
  EXPECT_NEAR(h.own_copies.work_lost, h.with_tier.work_lost, 1e-9);
  EXPECT_NEAR(h.own_copies.ettr, h.with_tier.ettr, 1e-12);
}

// A save written in the background slows the steps meanwhile: 10% of its 30 s write adds 3 s to its
// 10 s stall. tau = Daly(13, 3600) = 297.34 s; lost = 148.67 + 30 = 178.67 s; saves' share 13/297.34;
// ETTR = (1 - 358.67/3600) / (1 + 0.043722) = 0.86265.
TEST(Goodput, ASavesBackgroundWriteCountsThroughTheSlowdown) {
  GoodputInput in = Hand();
  in.slowdown = 0.1;
  const Scenario d = PredictGoodput(in).disk_only;
  EXPECT_NEAR(d.disk_interval, 297.34, 0.01);
  EXPECT_NEAR(d.work_lost, 178.67, 0.01);
  EXPECT_NEAR(d.save_share, 0.043722, 1e-5);
  EXPECT_NEAR(d.ettr, 0.86265, 1e-4);
}

TEST(Goodput, IntervalsAreWholeStepsNoShorterThanTheWriteAndNoLongerThanTheTraining) {
  GoodputInput in = Hand();
  in.step_seconds = 100;  // 261.70 s lies between 2 and 3 steps: 10/200 + 200/7200 = 0.0778 > 10/300 + 300/7200 = 0.0750
  EXPECT_DOUBLE_EQ(PredictGoodput(in).disk_only.disk_interval, 300);
  in.step_seconds = 0;
  in.costs.disk_stall = 1e-3;  // Daly's 2.7 s, but a save is durable only after 30 s: the next one waits
  EXPECT_DOUBLE_EQ(PredictGoodput(in).disk_only.disk_interval, 30);
  in.step_seconds = 7;  // ... and in whole steps, 35 s
  EXPECT_DOUBLE_EQ(PredictGoodput(in).disk_only.disk_interval, 35);
  in.compute_seconds = 20;
  const Goodput g = PredictGoodput(in);
  EXPECT_DOUBLE_EQ(g.disk_only.disk_interval, 20);
  EXPECT_NEAR(g.disk_only.wall_seconds, 20 / g.disk_only.ettr, 1e-9);
  EXPECT_NEAR(g.disk_only.failures, g.disk_only.wall_seconds / 3600, 1e-12);
}

TEST(Goodput, EdgeCases) {
  GoodputInput in = Hand();
  in.tier_miss = 0;  // the tier serves every failure: no disk save is needed for failures
  in.compute_seconds = 86400;
  Goodput g = PredictGoodput(in);
  EXPECT_DOUBLE_EQ(g.with_tier.disk_interval, 86400);
  EXPECT_GT(g.with_tier.ettr, g.disk_only.ettr);
  in.tier_miss = 1;  // ... or none: the same as disk only, plus the tier's cost
  g = PredictGoodput(in);
  EXPECT_NEAR(g.with_tier.work_lost, g.disk_only.work_lost, 1e-9);
  EXPECT_LT(g.with_tier.ettr, g.disk_only.ettr + 1e-12);
  in.costs.relaunch = 1e5;  // failures cost more than the time between them: nothing trains
  g = PredictGoodput(in);
  EXPECT_EQ(g.disk_only.ettr, 0);
  EXPECT_TRUE(std::isinf(g.disk_only.wall_seconds));
  in = Hand();
  in.costs = {};
  in.costs.relaunch = 0;  // free saves and restarts: nothing is lost
  g = PredictGoodput(in);
  EXPECT_DOUBLE_EQ(g.disk_only.ettr, 1);
  EXPECT_DOUBLE_EQ(g.with_tier.ettr, 1);
}

nlohmann::json PlanJson(const PlanInput& in) {
  std::ostringstream os;
  const Status s = Plan(in, true, os);
  EXPECT_TRUE(s.ok()) << s;
  return nlohmann::json::parse(os.str());
}

// Meta's projection (arXiv 2410.21680): job MTTF 1.8 h at 16,384 GPUs, about 14 min at 131,072.
TEST(Goodput, MetasMttfScaling) {
  PlanInput in;
  in.params = 7e9;
  in.gpus = 16384;
  EXPECT_NEAR(PlanJson(in)["failures"]["mtbf_hours"].get<double>(), 1.8, 1e-9);
  in.gpus = 131072;
  EXPECT_NEAR(PlanJson(in)["failures"]["mtbf_hours"].get<double>() * 60, 14, 0.1 * 14);
}

// FT-HSDP (arXiv 2602.00277): at O(100K) GPUs, cutting the recovery stall from 10 to 3 minutes raises
// the effective training time from 44% to 80%. Inputs: 100,000 GPUs with Meta's MTTF scaling (one
// failure every 17.7 min); the stall per failure is all of the recovery (relaunch 600 s or 180 s, the
// state already in place); the replicas lose no work (saves free and immediate, every 1 s step).
TEST(Goodput, ReproducesFtHsdpsEffectiveTrainingTime) {
  PlanInput in;
  in.params = 405e9;
  in.gpus = 100000;
  in.step_seconds = 1;
  in.save_stall = 0, in.disk_write = 0, in.restart_disk = 0;
  for (const auto& [relaunch, published] : {std::pair{600.0, 0.44}, std::pair{180.0, 0.80}}) {
    in.relaunch = relaunch;
    const double ettr = PlanJson(in)["failures"]["disk_only"]["ettr"].get<double>();
    EXPECT_NEAR(ettr, published, 0.1 * published) << "recovery stall " << relaunch << " s";
  }
}

// Llama 3 (arXiv 2407.21783, section 3.3.4): 419 unexpected interruptions in a 54-day snapshot on 16,384
// GPUs, about one every three hours: a per-device MTTF of 3 h x 16,384. The plan's failures over its
// training, scaled to 54 days of wall-clock time, against the count; and its effective training time
// with Llama 3's storage (the default rates: 2 TB/s sustained, 7 TB/s peak over 16,384 GPUs) against
// the "higher than 90%" the paper reports.
TEST(Goodput, ReproducesLlama3sInterruptions) {
  PlanInput in;
  in.arch = "llama";
  in.layers = 126, in.hidden = 16384, in.heads = 128, in.kv_heads = 8, in.ffn = 53248, in.vocab = 128256, in.seq = 8192;
  in.gpus = 16384;
  in.tokens = 15.6e12, in.tflops = 400;
  in.mttf_hours = 3.0 * 16384;
  const auto f = PlanJson(in)["failures"];
  const double days = f["disk_only"]["train_days"].get<double>(), failures = f["disk_only"]["failures"].get<double>();
  EXPECT_NEAR(failures * 54 / days, 419, 0.1 * 419);
  EXPECT_GT(f["disk_only"]["ettr"].get<double>(), 0.9);
  EXPECT_GE(f["memory_tier"]["ettr"].get<double>(), f["disk_only"]["ettr"].get<double>() - 1e-3);
}

constexpr const char* kBench =
    "== bench/checkpoint, 2 rank(s)\n"
    "RESULT\tcheckpoint\tN=2 stall per save\t0.100\ts\t0.050\tmemcpy s\t2.000\t-\t-\n"
    "RESULT\tcheckpoint\tN=2 peak staging per rank\t100.000\tMiB\t400.000\tstate per rank MiB\t0.250\t-\t-\n"
    "RESULT\tcheckpoint\tN=2 background write\t900.000\tMB/s\t1000.000\tfio seq write MB/s\t0.900\t-\t-\n"
    "RESULT\tcheckpoint\tN=4 stall per save\t0.200\ts\t0.100\tmemcpy s\t2.000\t-\t-\n"
    "RESULT\tcheckpoint\tN=4 peak staging per rank\t100.000\tMiB\t200.000\tstate per rank MiB\t0.500\t-\t-\n"
    "RESULT\tcheckpoint\tN=4 peak staging per rank, budget 64.00 MiB\t64.000\tMiB\t200.000\tstate per rank MiB\t0.320\t-\t-\n"
    "RESULT\tcheckpoint\tN=4 background write\t800.000\tMB/s\t1000.000\tfio seq write MB/s\t0.800\t-\t-\n"
    "RESULT\tcheckpoint\tN=4 step with save in flight\t1.150\ts\t1.000\tstep without save s\t1.150\t-\t-\n"
    "RESULT\tadam\tf32 AVX2\t1.000\tGelem/s\t1.000\tprobe\t1.000\t-\t-\n"
    "RESULT\trecovery\tN=4 snapshot rate\t2000.000\tMB/s\t4000.000\tmemcpy MB/s\t0.500\t-\t-\n"
    "RESULT\trecovery\tN=4 resume, rank killed\t6000.000\tMB/s\t16000.000\tmemcpy MB/s\t0.375\t-\t-\n"
    "RESULT\trecovery\tN=4 resume, node lost\t3000.000\tMB/s\t16000.000\tmemcpy MB/s\t0.188\t-\t-\n"
    "RESULT\trecovery\tN=4 resume, disk\t1200.000\tMB/s\t1500.000\tfio seq read MB/s\t0.800\t900.000\ttorch.load MB/s\n"
    "RESULT\trecovery\tN=4 replica rate\t500.000\tMB/s\t4000.000\tmemcpy MB/s\t0.125\t-\t-\n";

TEST(Goodput, BenchRatesPerDeviceFromTheLargestRun) {
  auto r = ParseBenchRates(kBench, "bench.tsv");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->checkpoint_ranks, 4);
  EXPECT_EQ(r->recovery_ranks, 4);
  EXPECT_DOUBLE_EQ(r->disk_snapshot, 200.0 * 1048576 / 0.2);  // state per rank / stall
  EXPECT_DOUBLE_EQ(r->disk_write, 800e6 / 4);                 // all ranks' rate, per rank
  EXPECT_DOUBLE_EQ(r->tier_snapshot, 2000e6);                 // per rank already
  EXPECT_DOUBLE_EQ(r->tier_replica, 500e6);
  EXPECT_DOUBLE_EQ(r->own_load, 6000e6 / 4);
  EXPECT_DOUBLE_EQ(r->replica_load, 3000e6 / 4);
  EXPECT_DOUBLE_EQ(r->disk_read, 1200e6 / 4);
  EXPECT_NEAR(r->slowdown, 0.15, 1e-12);
  // An older file without the replica rate: a replica moves at the peer restore's rate.
  std::string old = kBench;
  old.erase(old.find("RESULT\trecovery\tN=4 replica rate"));
  r = ParseBenchRates(old, "old.tsv");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_DOUBLE_EQ(r->tier_replica, 3000e6 / 4);
}

// A plan whose state has live replicas takes the tier's rates from the hybrid run where there is one
// (its replica rate is not used: none is sent), else from the flat run.
TEST(Goodput, BenchRatesOfAHybridRunForLiveReplicas) {
  const std::string hybrid = std::string(kBench) +
      "RESULT\trecovery-hybrid\tN=4 S=2 snapshot rate\t1000.000\tMB/s\t4000.000\tmemcpy MB/s\t0.250\t-\t-\n"
      "RESULT\trecovery-hybrid\tN=4 S=2 resume, rank killed\t8000.000\tMB/s\t16000.000\tmemcpy MB/s\t0.500\t-\t-\n"
      "RESULT\trecovery-hybrid\tN=4 S=2 resume, node lost\t4000.000\tMB/s\t16000.000\tmemcpy MB/s\t0.250\t-\t-\n"
      "RESULT\trecovery-hybrid\tN=4 S=2 resume, disk\t1600.000\tMB/s\t1500.000\tfio seq read MB/s\t1.067\t-\t-\n"
      "RESULT\trecovery-hybrid\tN=4 S=2 replica rate\tinf\tMB/s\t4000.000\tmemcpy MB/s\tinf\t-\t-\n"
      "RESULT\trecovery-hybrid\tN=4 bad row\t1\tMB/s\t1\tx\t1\t-\t-\n";
  auto r = ParseBenchRates(hybrid, "bench.tsv", true);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->recovery_hybrid);
  EXPECT_DOUBLE_EQ(r->tier_snapshot, 1000e6);
  EXPECT_DOUBLE_EQ(r->own_load, 8000e6 / 4);
  EXPECT_DOUBLE_EQ(r->replica_load, 4000e6 / 4);
  EXPECT_DOUBLE_EQ(r->disk_read, 1600e6 / 4);
  EXPECT_DOUBLE_EQ(r->disk_write, 800e6 / 4);  // the checkpoint bench's, as before
  r = ParseBenchRates(hybrid, "bench.tsv", false);  // a flat plan: the flat run
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->recovery_hybrid);
  EXPECT_DOUBLE_EQ(r->own_load, 6000e6 / 4);
  r = ParseBenchRates(kBench, "bench.tsv", true);  // no hybrid run: the flat one serves
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->recovery_hybrid);
  EXPECT_DOUBLE_EQ(r->replica_load, 3000e6 / 4);
}

TEST(Goodput, BadBenchFilesAreNamedErrors) {
  // A figure missing from every run: named, with where the lines come from.
  std::string text = kBench;
  for (size_t p; (p = text.find("background write")) != std::string::npos;) text.replace(p, 16, "backgrnd write");
  auto r = ParseBenchRates(text, "x.tsv");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("x.tsv"), std::string::npos);
  EXPECT_NE(r.status().message().find("'background write'"), std::string::npos);
  EXPECT_NE(r.status().message().find("scripts/bench"), std::string::npos);
  // A figure that is not a positive number: the file, the line and the figure.
  for (const char* bad : {"abc", "-3", "0", "nan", "inf", "1e999", "", "12x"}) {
    text = kBench;
    const size_t p = text.find("6000.000");
    text.replace(p, 8, bad);
    r = ParseBenchRates(text, "y.tsv");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("y.tsv line 12"), std::string::npos) << r.status();
    EXPECT_NE(r.status().message().find("'resume, rank killed'"), std::string::npos) << r.status();
  }
  // Cases without their rank count (the bench's own output, not ./scripts/bench's) are not guessed at.
  text = kBench;
  for (size_t p; (p = text.find("N=")) != std::string::npos;) text.erase(p, 4);
  EXPECT_FALSE(ParseBenchRates(text, "z.tsv").ok());
  EXPECT_FALSE(ParseBenchRates("", "empty.tsv").ok());
}

// Hostile bytes: never a crash, an error or rates > 0.
TEST(Goodput, RandomBytesNeverCrashTheBenchReader) {
  std::mt19937 rng(std::random_device{}());
  const std::string base = kBench;
  for (int i = 0; i < 2000; ++i) {
    std::string t = base;
    const int edits = 1 + static_cast<int>(rng() % 8);
    for (int e = 0; e < edits; ++e) {
      const size_t p = rng() % t.size();
      switch (rng() % 3) {
        case 0: t[p] = static_cast<char>(rng()); break;
        case 1: t.erase(p, 1 + rng() % 16); break;
        default: t.insert(p, std::string(1 + rng() % 4, "\t\n0N= -."[rng() % 8])); break;
      }
      if (t.empty()) t = "x";
    }
    auto r = ParseBenchRates(t, "fuzz.tsv");
    if (r.ok()) {
      for (double v : {r->disk_snapshot, r->disk_write, r->disk_read, r->tier_snapshot, r->tier_replica, r->own_load, r->replica_load}) {
        EXPECT_TRUE(v > 0 && std::isfinite(v));
      }
    }
  }
}

TEST(Goodput, ReadBenchRatesRefusesWhatIsNotASmallRegularFile) {
  const std::string dir = ::testing::TempDir() + "goodput_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  EXPECT_FALSE(ReadBenchRates(dir + "/missing.tsv").ok());
  EXPECT_FALSE(ReadBenchRates(dir).ok());  // a directory
  ASSERT_EQ(::mkfifo((dir + "/fifo").c_str(), 0600), 0);
  auto fifo = ReadBenchRates(dir + "/fifo");  // never waits for a writer
  ASSERT_FALSE(fifo.ok());
  EXPECT_NE(fifo.status().message().find("regular file"), std::string::npos);
  {
    std::ofstream big(dir + "/big.tsv");
    big << std::string((16 << 20) + 1, '\n');
  }
  EXPECT_FALSE(ReadBenchRates(dir + "/big.tsv").ok());
  {
    std::ofstream good(dir + "/good.tsv");
    good << kBench;
  }
  auto r = ReadBenchRates(dir + "/good.tsv");
  EXPECT_TRUE(r.ok()) << r.status();

  // The planner takes the measured rates: the costs are the checkpoint's bytes at them.
  PlanInput in;
  in.params = 1e9;
  in.gpus = 8;
  in.from_bench = dir + "/good.tsv";
  const auto f = PlanJson(in)["failures"];
  EXPECT_EQ(f["costs_from"].get<std::string>(), "bench " + in.from_bench);
  const double bytes = 12e9 / 8;
  EXPECT_NEAR(f["costs_seconds"]["restart_disk"].get<double>(), bytes / (1200e6 / 4), 1e-9);
  EXPECT_NEAR(f["costs_seconds"]["tier_write"].get<double>(), bytes / 500e6, 1e-9);
  in.restart_disk = 7;  // a given time wins over the measured rate
  EXPECT_DOUBLE_EQ(PlanJson(in)["failures"]["costs_seconds"]["restart_disk"].get<double>(), 7);
  std::ostringstream os;
  in.from_bench = dir + "/fifo";
  const Status s = Plan(in, false, os);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("fifo"), std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace zrt::tools
