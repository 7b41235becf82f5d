// The commit protocol; its steps are described in commit.h.
#include "zrt/checkpoint/commit.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <random>
#include <utility>
#include <vector>

#include "zrt/checkpoint/catalog.h"
#include "zrt/checkpoint/format.h"
#include "zrt/checkpoint/fs_util.h"
#include "zrt/core/logging.h"

namespace zrt::ckpt {

namespace fs = std::filesystem;

std::string NewNonce() {
  std::random_device rd;
  char nonce[17];
  std::snprintf(nonce, sizeof(nonce), "%08x%08x", rd(), rd());
  return nonce;
}

SaveDir SaveDirFor(const std::string& root, int64_t step, const std::string& nonce) {
  SaveDir s;
  s.root = root;
  s.step = step;
  s.nonce = nonce;
  s.final = root + "/" + StepDirName(step);
  s.tmp = s.final + ".tmp-" + nonce;
  return s;
}

Status BeginSave(const SaveDir& save) { return MakeDirs(save.tmp).WithContext("checkpoint of step " + std::to_string(save.step)); }

Status PublishFile(const IoEngine& io, const std::string& dir, std::string_view name, std::string_view content) {
  return WriteFileDurably(io, dir, std::string(name), content);
}

void AbandonSave(const SaveDir& save) {
  if (Status s = RemoveTree(save.tmp); !s.ok()) ZRT_LOG(kWarn) << "checkpoint: " << s;
}

namespace {

constexpr std::string_view kDeadMark = ".dead-";

// Removes the entries of `root` whose names start with `prefix` and hold ".tmp-" or ".dead-" (best
// effort: a leftover that cannot be removed now is removed at the next start).
void RemoveLeftovers(const std::string& root, const std::string& prefix) {
  std::error_code ec;
  for (fs::directory_iterator it(root, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!name.starts_with(prefix)) continue;
    if (name.find(".tmp-") == std::string::npos && name.find(kDeadMark) == std::string::npos) continue;
    ZRT_LOG(kInfo) << "checkpoint: removing leftover of an interrupted save or deletion: " << it->path().string();
    if (Status s = RemoveTree(it->path().string()); !s.ok()) ZRT_LOG(kWarn) << "checkpoint: " << s;
  }
}

// The single-process part of the commit: the directory becomes ROOT/step-N.
Status CommitLocal(const SaveDir& save, const Retention& retention, const IoEngine& io) {
  // Everything must be there and agree before the directory gets its final name.
  std::vector<std::string> problems;
  RETURN_IF_ERROR(CheckComplete(save.tmp, VerifyLevel::kMetadata, &problems));
  if (!problems.empty()) return DataLossError("checkpoint ", save.tmp, " is incomplete: ", problems.front());
  RETURN_IF_ERROR(FsyncDir(save.tmp));
  RETURN_IF_ERROR(io.FileOp("commit", save.final));
  RETURN_IF_ERROR(RenamePath(save.tmp, save.final));
  RETURN_IF_ERROR(FsyncDir(save.root));
  // The advisory pointer moves only now that the checkpoint is complete and durable.
  RETURN_IF_ERROR(WriteFileDurably(io, save.root, std::string(kLatestFile), StepDirName(save.step) + "\n"));
  RETURN_IF_ERROR(FsyncDir(save.root));
  // Temp directories of earlier attempts at this step (a killed reshard or import) are dead now.
  RemoveLeftovers(save.root, StepDirName(save.step) + ".tmp-");
  return ApplyRetention(save.root, retention);
}

}  // namespace

Status Commit(Communicator* comm, const Status& local, const SaveDir& save, const Retention& retention, const IoEngine& io) {
  const std::string ctx = "checkpoint of step " + std::to_string(save.step);
  const bool leader = comm == nullptr || comm->rank() == 0;
  Status agreed = comm == nullptr ? local : AgreeOnStatus(comm, local);
  if (!agreed.ok()) {
    if (leader) AbandonSave(save);
    return local.ok() ? agreed.WithContext(ctx) : agreed;
  }
  Status s;
  if (leader) {
    s = CommitLocal(save, retention, io).WithContext("committing " + ctx);
    if (!s.ok() && fs::exists(save.tmp)) AbandonSave(save);
  }
  if (comm != nullptr) RETURN_IF_ERROR(BroadcastStatus(comm, s, 0));
  return s;
}

// Newest first: the first keep_last complete checkpoints are kept (each checked), and so is every
// multiple of keep_every (not even read); any other is checked only because it would be deleted.
Status ApplyRetention(const std::string& root, const Retention& retention) {
  if (retention.keep_last <= 0) return Status();
  ASSIGN_OR_RETURN(const std::vector<StepDir> dirs, ListStepDirs(root));
  int kept_complete = 0;
  for (const StepDir& sd : dirs) {
    if (sd.in_progress) continue;
    const bool every = retention.keep_every > 0 && sd.step % retention.keep_every == 0;
    if (every && kept_complete >= retention.keep_last) continue;
    std::vector<std::string> problems;
    const bool complete = CheckComplete(sd.dir, VerifyLevel::kMetadata, &problems).ok() && problems.empty();
    if (!complete) continue;  // never delete what we cannot vouch for (or one being repaired by hand)
    if (kept_complete < retention.keep_last) {
      ++kept_complete;
      continue;
    }
    if (every) continue;
    // Dead first (atomic and durable), then removed: a kill in between leaves only a dead name.
    ZRT_LOG(kInfo) << "checkpoint retention: removing " << sd.dir;
    const std::string dead = sd.dir + std::string(kDeadMark) + NewNonce();
    RETURN_IF_ERROR(RenamePath(sd.dir, dead));
    RETURN_IF_ERROR(FsyncDir(root));
    RETURN_IF_ERROR(RemoveTree(dead));
  }
  return Status();
}

// Newest first: `latest` is pointed at the first complete checkpoint found (the rest is not read).
Status RepairRoot(const std::string& root, const Retention& retention, const IoEngine& io) {
  RETURN_IF_ERROR(MakeDirs(root));
  RemoveLeftovers(root, "");
  std::error_code ec;
  fs::remove(fs::path(root) / (std::string(kLatestFile) + ".tmp"), ec);
  ASSIGN_OR_RETURN(const std::vector<StepDir> dirs, ListStepDirs(root));
  for (const StepDir& sd : dirs) {
    std::vector<std::string> problems;
    if (sd.in_progress || !CheckComplete(sd.dir, VerifyLevel::kMetadata, &problems).ok() || !problems.empty()) continue;
    const std::string want = StepDirName(sd.step) + "\n";
    auto have = ReadWholeFile(root + "/" + std::string(kLatestFile));
    if (!have.ok() || *have != want) {
      ZRT_LOG(kInfo) << "checkpoint: pointing " << root << "/latest at " << StepDirName(sd.step);
      RETURN_IF_ERROR(WriteFileDurably(io, root, std::string(kLatestFile), want));
      RETURN_IF_ERROR(FsyncDir(root));
    }
    break;
  }
  return ApplyRetention(root, retention);
}

}  // namespace zrt::ckpt
