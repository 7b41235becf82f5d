// What every fuzz target shares: its scratch directory, and what an importer's asserts after an
// import that succeeded.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "zrt/checkpoint/catalog.h"

namespace zrt::fuzz {

// TMPDIR/<prefix><pid>, removed when the process exits (libFuzzer ends with exit()). Call once.
inline std::filesystem::path ScratchDir(const std::string& prefix) {
  static std::filesystem::path dir;
  dir = std::filesystem::temp_directory_path() / (prefix + std::to_string(::getpid()));
  std::atexit([] {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  });
  return dir;
}

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
