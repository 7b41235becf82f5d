// The memory tier's directories (tier_dir.h).
#include "zrt/checkpoint/tier/tier_dir.h"

#include <sys/statvfs.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>

#include "zrt/checkpoint/catalog.h"
#include "zrt/checkpoint/codec.h"
#include "zrt/checkpoint/format.h"
#include "zrt/checkpoint/fs_util.h"
#include "zrt/core/logging.h"
#include "zrt/core/private_dir.h"
#include "zrt/core/thread_pool.h"

namespace zrt::ckpt {

namespace fs = std::filesystem;

std::string MemoryTier::JobDir(const std::string& root, const MemoryTierOptions& o) {
  std::error_code ec;
  fs::path abs = fs::weakly_canonical(fs::absolute(root, ec), ec);
  const std::string key = abs.empty() ? root : abs.string();
  char name[40];
  std::snprintf(name, sizeof(name), "zrt-tier-%016llx", static_cast<unsigned long long>(Checksum(key.data(), key.size())));
  return o.dir + "/" + name;
}

std::string MemoryTier::RankDir(const std::string& root, const MemoryTierOptions& o, int rank) {
  char name[32];
  std::snprintf(name, sizeof(name), "rank-%05d", rank);
  return JobDir(root, o) + "/" + name;
}

namespace internal {

namespace {
// A data file of a removed generation, kept to be written over by the next one: tmpfs then has the
// pages already (no page faults and zeroing while training waits for the snapshot).
constexpr const char* kSpare = "spare.data";
}  // namespace

int RanksPerNode(const MemoryTierOptions& o) {
  return o.ranks_per_node > 0 ? o.ranks_per_node : ThreadPool::LauncherRanksPerNode();
}

// Rank q's replica is held by rank (q + d) mod n.
int Distance(int n, const MemoryTierOptions& o) {
  const int rpn = RanksPerNode(o);
  return n > rpn ? rpn : 1;
}
bool Replicated(int n, const MemoryTierOptions& o) { return o.replicate && n > 1; }
bool LiveReplicas(int n, int shards) { return shards >= 1 && shards < n && n % shards == 0; }

std::string StepPath(const std::string& parent, int64_t step) { return parent + "/" + StepDirName(step); }
std::string ReplicaDir(const std::string& rank_dir, int q) {
  char name[32];
  std::snprintf(name, sizeof(name), "replica-%05d", q);
  return rank_dir + "/" + name;
}

// The whole generations under `parent` (own/ or replica-q/), newest first.
std::vector<int64_t> Steps(const std::string& parent) {
  std::vector<int64_t> out;
  if (auto dirs = ListStepDirs(parent); dirs.ok()) {
    for (const StepDir& d : *dirs) {
      if (!d.in_progress) out.push_back(d.step);
    }
  }
  return out;
}

// Moves the data file of a generation under `parent` other than `keep` to parent/spare.data.
void KeepSpare(const std::string& parent, int64_t keep) {
  std::error_code ec;
  if (fs::exists(parent + "/" + kSpare, ec)) return;
  for (const auto& e : fs::directory_iterator(parent, ec)) {
    auto step = ParseStepDirName(e.path().filename().string());
    if (!step.ok() || *step == keep) continue;
    for (const auto& f : fs::directory_iterator(e.path(), ec)) {
      if (f.path().extension() == ".data" && f.is_regular_file(ec) && !f.is_symlink(ec)) {
        fs::rename(f.path(), parent + "/" + kSpare, ec);
        return;
      }
    }
  }
}

// `path` (a new data file) takes the place of parent/spare.data when that is a plain file (anything
// else found there, a link say, is removed and never written through).
void Recycle(const std::string& parent, const std::string& path) {
  std::error_code ec;
  const std::string spare = parent + "/" + kSpare;
  const fs::file_status st = fs::symlink_status(spare, ec);
  if (ec || !fs::exists(st)) return;  // none: the file is created
  if (fs::is_regular_file(st)) {
    fs::rename(spare, path, ec);
  } else {
    fs::remove_all(spare, ec);
  }
}

// Removes everything under `parent` but generation `keep` (whole or being written; -1: nothing kept).
void RemoveAllBut(const std::string& parent, int64_t keep) {
  std::error_code ec;
  std::vector<fs::path> doomed;
  for (const auto& e : fs::directory_iterator(parent, ec)) {
    const std::string name = e.path().filename().string();
    if (keep >= 0 && (name == StepDirName(keep) || name == StepDirName(keep) + ".tmp" || name == kSpare)) continue;
    doomed.push_back(e.path());
  }
  for (const fs::path& p : doomed) {
    Status s = RemoveTree(p.string());
    if (!s.ok()) ZRT_LOG(kWarn) << "memory tier: " << s;
  }
}

int64_t TreeBytes(const std::string& dir) {
  int64_t n = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_regular_file(ec)) n += static_cast<int64_t>(it->file_size(ec));
  }
  return n;
}

Status MakeTierDir(const std::string& dir) { return MakePrivateDirs(fs::path(dir).parent_path().string(), dir, "memory tier"); }

bool Exists(const std::string& p) {
  std::error_code ec;
  return fs::exists(p, ec);
}

TierPlace PlaceOf(const std::string& root, const MemoryTierOptions& o, int n, int rank) {
  TierPlace p;
  p.n = n;
  p.rank = rank;
  p.d = Distance(n, o);
  p.rank_dir = MemoryTier::RankDir(root, o, rank);
  p.own_dir = p.rank_dir + "/own";
  if (Replicated(n, o)) {
    p.source = ((rank - p.d) % n + n) % n;
    p.replica_dir = ReplicaDir(p.rank_dir, p.source);
  }
  return p;
}

Status PrepareRankDir(const std::string& root, const MemoryTierOptions& o, const TierPlace& p, MemoryTierStats* stats) {
  RETURN_IF_ERROR(MakePrivateDirs(o.dir, p.own_dir, "memory tier"));
  if (!p.replica_dir.empty()) RETURN_IF_ERROR(MakePrivateDirs(o.dir, p.replica_dir, "memory tier"));
  std::error_code ec;
  std::vector<fs::path> doomed;
  for (const std::string& parent : {p.own_dir, p.replica_dir}) {
    if (parent.empty()) continue;
    for (const auto& e : fs::directory_iterator(parent, ec)) {
      if (!ParseStepDirName(e.path().filename().string()).ok()) doomed.push_back(e.path());
    }
  }
  for (const auto& e : fs::directory_iterator(p.rank_dir, ec)) {
    if (e.path().filename() != "own" && e.path().string() != p.replica_dir) doomed.push_back(e.path());
  }
  for (const auto& e : fs::directory_iterator(MemoryTier::JobDir(root, o), ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("rank-", 0) == 0 && std::atoi(name.c_str() + 5) >= p.n) doomed.push_back(e.path());
  }
  for (const fs::path& d : doomed) (void)RemoveTree(d.string());
  struct statvfs vfs {};
  if (::statvfs(p.rank_dir.c_str(), &vfs) != 0) return ErrnoStatus(errno, "memory tier: " + p.rank_dir);
  stats->budget_bytes = o.budget_bytes > 0 ? o.budget_bytes : static_cast<int64_t>(vfs.f_bavail) * static_cast<int64_t>(vfs.f_frsize);
  stats->bytes_held = TreeBytes(p.rank_dir);
  // What a previous run left is this run's until it is superseded: never removed at a normal exit
  // before a disk checkpoint holds something as new (a run that resumed from it and stopped early).
  const std::vector<int64_t> held = Steps(p.own_dir);
  stats->step = held.empty() ? -1 : held.front();
  if (o.budget_bytes == 0) stats->budget_bytes += stats->bytes_held;
  return Status();
}

}  // namespace internal
}  // namespace zrt::ckpt
