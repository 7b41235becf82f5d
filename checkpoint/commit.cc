// The commit protocol; its steps are described in commit.h.
#include "zrt/checkpoint/commit.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <random>
#include <utility>
#include <vector>

#include "zrt/checkpoint/format.h"
#include "zrt/checkpoint/fs_util.h"
#include "zrt/checkpoint/verify.h"
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

Status ApplyRetention(const std::string& root, const Retention& retention) {
  if (retention.keep_last <= 0) return Status();
  std::vector<std::pair<int64_t, std::string>> steps;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    auto step = ParseStepDirName(e.path().filename().string());
    if (step.ok()) steps.emplace_back(*step, e.path().string());
  }
  if (ec) return ErrnoStatus(ec.value(), "listing " + root);
  std::sort(steps.rbegin(), steps.rend());
  int kept_complete = 0;
  for (const auto& [step, dir] : steps) {
    std::vector<std::string> problems;
    const bool complete = CheckComplete(dir, VerifyLevel::kMetadata, &problems).ok() && problems.empty();
    if (!complete) continue;  // never delete what we cannot vouch for (or one being repaired by hand)
    const bool keep = kept_complete < retention.keep_last || (retention.keep_every > 0 && step % retention.keep_every == 0);
    if (kept_complete < retention.keep_last) ++kept_complete;
    if (!keep) {
      ZRT_LOG(kInfo) << "checkpoint retention: removing " << dir;
      RETURN_IF_ERROR(RemoveTree(dir));
    }
  }
  return Status();
}

Status RemoveDeadSaves(const std::string& root) {
  RETURN_IF_ERROR(MakeDirs(root));
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    if (name.find(".tmp") != std::string::npos) {
      ZRT_LOG(kInfo) << "checkpoint: removing leftover of an interrupted save: " << e.path().string();
      RETURN_IF_ERROR(RemoveTree(e.path().string()));
    }
  }
  if (ec) return ErrnoStatus(ec.value(), "listing " + root);
  return Status();
}

}  // namespace zrt::ckpt
