// The checkpoints under a root and each one's state: listing them, finding the newest complete one,
// checking that one is complete and intact.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "zrt/core/status.h"

namespace zrt::ckpt {

// Progress reports of long offline operations (verify, reshard, export, import): done out of total, in
// the operation's unit (bytes where it can). Called on the caller's thread or a worker; may be empty.
using ProgressFn = std::function<void(int64_t done, int64_t total)>;

// Checking that a checkpoint directory is complete and intact (docs/checkpoint-format.md, rules).
enum class VerifyLevel {
  kMetadata,  // manifest and indexes exist, parse, pass their checksums and agree; data file sizes
  kFull,      // + every chunk read back, checksummed and decoded
};

// Appends a line per problem ("rank-00002.index.json: missing", "rank-00001.data chunk 17 (group
// 'layer0', exp_avg, tensors w1..w3): checksum mismatch"). OK with problems empty = complete.
// A non-OK status means the check itself could not run (e.g. the directory is unreadable).
// `progress` (full level): bytes of data files checked out of those present.
Status CheckComplete(const std::string& dir, VerifyLevel level, std::vector<std::string>* problems,
                     const ProgressFn& progress = nullptr);

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
