// What every importer's fuzz target asserts after an import that succeeded.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "zrt/checkpoint/catalog.h"

namespace zrt::fuzz {

// Every checkpoint directory under `root` must be complete and verify fully: an import that says OK
// never commits anything less.
inline void AbortUnlessEveryCheckpointVerifies(const std::string& root) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(root, ec)) {
    if (!e.is_directory()) continue;
    std::vector<std::string> problems;
    if (!ckpt::CheckComplete(e.path().string(), ckpt::VerifyLevel::kFull, &problems).ok() || !problems.empty()) std::abort();
  }
}

}  // namespace zrt::fuzz
