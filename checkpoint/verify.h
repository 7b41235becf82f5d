// Checking that a checkpoint directory is complete and intact (docs/checkpoint-format.md, rules).
#pragma once

#include <string>
#include <vector>

#include "zrt/checkpoint/progress.h"
#include "zrt/core/status.h"

namespace zrt::ckpt {

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

}  // namespace zrt::ckpt
