// The failure model of goodput.h, and the reader of ./scripts/bench's RESULT lines for its costs.
#include "tools/lib/goodput.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <vector>

#include "zrt/core/unique_fd.h"

namespace zrt::tools {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Stall per unit of training when saving every `tau` seconds (none when nothing stalls).
double Share(double stall, double tau) { return stall > 0 && std::isfinite(tau) ? stall / tau : 0; }

// The interval of a tier that `share` of the failures roll back to: Daly's optimum for them, no shorter
// than the save takes to become restorable (the next save waits for it), in whole steps when the step
// time is known (whichever neighbour costs less), and no longer than the training.
double IntervalFor(const GoodputInput& in, double cost_per_save, double write, double share) {
  if (share <= 0) return in.compute_seconds > 0 ? in.compute_seconds : kInf;
  const double mtbf = in.mtbf_seconds / share;
  double tau = std::max(DalyInterval(cost_per_save, mtbf), write);
  if (in.step_seconds > 0) {
    const double step = in.step_seconds, least = std::max(1.0, std::ceil(write / step - 1e-9));
    auto cost = [&](double t) { return Share(cost_per_save, t) + t / 2 / mtbf; };
    const double lo = std::max(least, std::floor(tau / step)) * step, hi = std::max(least, std::ceil(tau / step)) * step;
    tau = cost(lo) <= cost(hi) ? lo : hi;
  }
  return in.compute_seconds > 0 ? std::min(tau, in.compute_seconds) : tau;
}

Scenario Finish(const GoodputInput& in, Scenario s) {
  s.ettr = std::max(0.0, 1 - (s.work_lost + s.stall) / in.mtbf_seconds) / (1 + s.save_share);
  if (in.compute_seconds > 0) {
    s.wall_seconds = s.ettr > 0 ? in.compute_seconds / s.ettr : kInf;
    s.failures = s.wall_seconds / in.mtbf_seconds;
  }
  return s;
}

}  // namespace

double DalyInterval(double stall, double mtbf) {
  if (stall <= 0) return 0;
  if (stall >= 2 * mtbf) return mtbf;
  const double x = stall / (2 * mtbf);
  return std::sqrt(2 * stall * mtbf) * (1 + std::sqrt(x) / 3 + x / 9) - stall;
}

Goodput PredictGoodput(const GoodputInput& in) {
  const FailureCosts& c = in.costs;
  const double disk_save = c.disk_stall + in.slowdown * c.disk_write, tier_save = c.tier_stall + in.slowdown * c.tier_write;
  Goodput g;
  Scenario& d = g.disk_only;
  d.disk_interval = IntervalFor(in, disk_save, c.disk_write, 1);
  d.save_share = Share(disk_save, d.disk_interval);
  d.work_lost = d.disk_interval / 2 + c.disk_write;
  d.stall = c.relaunch + c.disk_restart;
  d = Finish(in, d);

  // A memory tier whose copies serve `hit` of the failures, restarting them in `restart` on average;
  // the rest roll back to disk. Its saves cost `save`, restorable after `write`.
  auto tiered = [&](double hit, double save, double write, double restart) {
    Scenario t;
    const double miss = 1 - hit;
    t.tier_interval = IntervalFor(in, save, write, hit);
    t.disk_interval = IntervalFor(in, disk_save, c.disk_write, miss);
    t.save_share = Share(save, t.tier_interval) + Share(disk_save, t.disk_interval);
    t.work_lost = hit > 0 ? hit * (t.tier_interval / 2 + write) : 0;
    if (miss > 0) t.work_lost += miss * (t.disk_interval / 2 + c.disk_write);
    t.stall = c.relaunch + hit * restart + miss * c.disk_restart;
    return Finish(in, t);
  };
  const double hit = 1 - in.tier_miss, own = hit * (1 - in.node_loss);
  g.own_copies = tiered(own, c.tier_stall, 0, c.own_restart);
  g.with_tier = tiered(hit, tier_save, c.tier_write, (1 - in.node_loss) * c.own_restart + in.node_loss * c.replica_restart);
  return g;
}

namespace {

struct Figure {
  std::string value, limit;
  int line = 0;
};
using Figures = std::map<std::string, Figure>;                  // case -> figure
using ByRanks = std::map<int, Figures, std::greater<int>>;      // largest run first

// "N=4 stall per save" -> 4, "stall per save"; 0 when the case has no rank count.
int SplitRanks(std::string& what) {
  if (what.rfind("N=", 0) != 0) return 0;
  const size_t space = what.find(' ');
  if (space == std::string::npos || space > 8) return 0;
  char* end = nullptr;
  const long n = std::strtol(what.c_str() + 2, &end, 10);
  if (end != what.c_str() + space || n < 1 || n > 1'000'000) return 0;
  what.erase(0, space + 1);
  return static_cast<int>(n);
}

Result<double> Positive(const std::string& name, const std::string& bench, const std::string& what, const Figure& f, bool limit) {
  const std::string& s = limit ? f.limit : f.value;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || errno == ERANGE || !std::isfinite(v) || v <= 0) {
    return InvalidArgumentError(name, " line ", f.line, ": bench/", bench, " '", what, "' ", limit ? "limit" : "figure", " '", s,
                                "' is not a positive number");
  }
  return v;
}

// The largest run that has every figure in `need`.
Result<std::pair<int, const Figures*>> RunWith(const ByRanks& runs, const std::string& name, const std::string& bench,
                                              const std::vector<std::string>& need) {
  for (const auto& run : runs) {
    const Figures& figs = run.second;
    if (std::all_of(need.begin(), need.end(), [&](const std::string& k) { return figs.count(k) > 0; })) return std::make_pair(run.first, &figs);
  }
  std::string list;
  for (const std::string& k : need) list += (list.empty() ? "'" : ", '") + k + "'";
  return InvalidArgumentError(name, ": no bench/", bench, " RESULT lines with ", list,
                              " from one run with its rank count (\"N=k ...\", as ./scripts/bench writes them to build/bench-results.tsv)");
}

}  // namespace

Result<BenchRates> ParseBenchRates(std::string_view text, const std::string& name, bool live_replicas) {
  std::map<std::string, ByRanks> found;  // bench -> ranks -> case -> figure
  int line_no = 0;
  for (size_t pos = 0; pos < text.size();) {
    const size_t eol = std::min(text.find('\n', pos), text.size());
    const std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (line.rfind("RESULT\t", 0) != 0) continue;
    std::vector<std::string> f;
    for (size_t a = 0; a <= line.size();) {
      const size_t b = std::min(line.find('\t', a), line.size());
      f.emplace_back(line.substr(a, b - a));
      a = b + 1;
    }
    if (f.size() < 7 || (f[1] != "checkpoint" && f[1] != "recovery" && f[1] != "recovery-hybrid")) continue;
    std::string what = f[2];
    const int n = SplitRanks(what);
    if (f[1] == "recovery-hybrid") {  // "N=4 S=2 snapshot rate": the shard group is the run's too
      const size_t space = what.find(' ');
      if (what.rfind("S=", 0) != 0 || space == std::string::npos) continue;
      what.erase(0, space + 1);
    }
    if (n > 0) found[f[1]][n][what] = Figure{f[3], f[5], line_no};
  }
  BenchRates r;
  const std::string ck = "checkpoint";
  ASSIGN_OR_RETURN(auto c, RunWith(found[ck], name, ck, {"stall per save", "peak staging per rank", "background write",
                                                          "step with save in flight"}));
  const Figures& cf = *c.second;
  r.checkpoint_ranks = c.first;
  ASSIGN_OR_RETURN(const double stall, Positive(name, ck, "stall per save", cf.at("stall per save"), false));
  ASSIGN_OR_RETURN(const double mib, Positive(name, ck, "peak staging per rank", cf.at("peak staging per rank"), true));
  ASSIGN_OR_RETURN(const double write, Positive(name, ck, "background write", cf.at("background write"), false));
  ASSIGN_OR_RETURN(const double busy, Positive(name, ck, "step with save in flight", cf.at("step with save in flight"), false));
  ASSIGN_OR_RETURN(const double plain, Positive(name, ck, "step with save in flight", cf.at("step with save in flight"), true));
  r.disk_snapshot = mib * 1048576 / stall;
  r.slowdown = std::max(0.0, busy / plain - 1);
  r.disk_write = write * 1e6 / c.first;

  const std::vector<std::string> tier = {"snapshot rate", "resume, rank killed", "resume, node lost", "resume, disk"};
  std::string rc = "recovery";
  if (live_replicas && RunWith(found["recovery-hybrid"], name, rc, tier).ok()) rc = "recovery-hybrid";
  ASSIGN_OR_RETURN(auto v, RunWith(found[rc], name, rc, tier));
  const Figures& rf = *v.second;
  r.recovery_ranks = v.first;
  r.recovery_hybrid = rc != "recovery";
  auto per_rank = [&](const char* what, double ranks) -> Result<double> {
    ASSIGN_OR_RETURN(const double mbps, Positive(name, rc, what, rf.at(what), false));
    return mbps * 1e6 / ranks;
  };
  ASSIGN_OR_RETURN(r.tier_snapshot, per_rank("snapshot rate", 1));
  ASSIGN_OR_RETURN(r.own_load, per_rank("resume, rank killed", v.first));
  ASSIGN_OR_RETURN(r.replica_load, per_rank("resume, node lost", v.first));
  ASSIGN_OR_RETURN(r.disk_read, per_rank("resume, disk", v.first));
  // Files written before bench/recovery printed its replica rate: a replica moves at the peer restore's rate.
  r.tier_replica = r.replica_load;
  if (rf.count("replica rate") && !r.recovery_hybrid) {  // (none is sent in a hybrid run)
    ASSIGN_OR_RETURN(r.tier_replica, per_rank("replica rate", 1));
  }
  return r;
}

Result<BenchRates> ReadBenchRates(const std::string& path, bool live_replicas) {
  constexpr off_t kMax = 16 << 20;
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (!fd.valid()) return ErrnoStatus(errno, "opening bench results " + path);
  struct stat st{};
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "reading bench results " + path);
  if (!S_ISREG(st.st_mode)) return InvalidArgumentError(path, ": bench results must be a regular file");
  if (st.st_size > kMax) return InvalidArgumentError(path, ": ", st.st_size, " bytes; bench results are at most ", kMax);
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < text.size()) {
    const ssize_t r = ::read(fd.get(), text.data() + got, text.size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return ErrnoStatus(errno, "reading bench results " + path);
    if (r == 0) break;  // shrank while read: parse what is there
    got += static_cast<size_t>(r);
  }
  text.resize(got);
  return ParseBenchRates(text, path, live_replicas);
}

}  // namespace zrt::tools
