// Small helpers shared by the benchmarks: timing with warm-up and median, and the result line that
// ./scripts/bench collects into one table.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace zrt::bench {

// Seconds one call of fn takes.
inline double Seconds(const std::function<void()>& fn) {
  const auto a = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
}

// The median of x (the upper one of an even count).
inline double Median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  return x[x.size() / 2];
}

// Runs fn `warmup` times untimed, then `reps` times; returns the median seconds.
inline double MedianSeconds(const std::function<void()>& fn, int reps, int warmup = 1) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) t.push_back(Seconds(fn));
  return Median(std::move(t));
}

// One line per figure, tab-separated, for ./scripts/bench:
//   RESULT <bench> <case> <value> <unit> <limit value> <limit name> <ratio> <peer value or -> <peer name or ->
inline void PrintResult(const std::string& bench, const std::string& what, double value, const std::string& unit,
                        double limit, const std::string& limit_name, double peer = -1, const std::string& peer_name = "-") {
  char peer_buf[32] = "-";
  if (peer > 0) std::snprintf(peer_buf, sizeof(peer_buf), "%.3f", peer);
  std::printf("RESULT\t%s\t%s\t%.3f\t%s\t%.3f\t%s\t%.3f\t%s\t%s\n", bench.c_str(), what.c_str(), value, unit.c_str(), limit,
              limit_name.c_str(), limit > 0 ? value / limit : 0.0, peer_buf, peer_name.c_str());
}

}  // namespace zrt::bench
