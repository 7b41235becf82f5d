// The checkpoints under a root: listing them and finding the newest complete one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zrt/checkpoint/verify.h"
#include "zrt/core/status.h"

namespace zrt::ckpt {

struct CheckpointInfo {
  std::string dir;
  int64_t step = -1;
  bool complete = false;
  bool in_progress = false;   // a .tmp directory: a save being written, or one that died
  std::string problem;        // why not complete (the first problem)
  int world_size = 0;
  int stage = -1;
  int64_t bytes = 0;          // on disk
  int64_t created_unix = 0;
};

// The step directories under `root` by name alone (nothing in them is read; links are never
// checkpoints), newest step first: `in_progress` for a save being written or one that died
// (step-N.tmp-<nonce>, or the memory tier's step-N.tmp). NotFound when root is not a directory. The one
// scan of a root that the catalog, retention, repair, resume and the memory tier share.
struct StepDir {
  int64_t step = -1;
  std::string dir;
  bool in_progress = false;
};
Result<std::vector<StepDir>> ListStepDirs(const std::string& root);

// Every checkpoint directory under root, newest step first, each checked at `level`.
Result<std::vector<CheckpointInfo>> ListCheckpoints(const std::string& root, VerifyLevel level = VerifyLevel::kMetadata);
// The newest complete checkpoint's directory; NotFound when there is none. Incomplete or corrupt
// ones are skipped (with kFull, so are ones with a bad chunk).
Result<std::string> FindLatestComplete(const std::string& root, VerifyLevel level = VerifyLevel::kMetadata);

}  // namespace zrt::ckpt
