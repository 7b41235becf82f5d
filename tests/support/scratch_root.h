// A scratch directory every rank of a multi-rank test shares: named by rank 0 (under the system's
// temporary directory, the process id in the name, emptied first) and broadcast; removed by rank 0
// after a barrier, with its memory tier's directory (TierScratchDir).
#pragma once

#include <linux/magic.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "zrt/core/communicator.h"

namespace zrt::testing {

inline std::string SharedScratchRoot(Communicator* comm, const std::string& name) {
  char path[512] = {};
  if (comm->rank() == 0) {
    const std::string p = (std::filesystem::temp_directory_path() / (name + "_" + std::to_string(::getpid()))).string();
    std::filesystem::remove_all(p);
    std::snprintf(path, sizeof(path), "%s", p.c_str());
  }
  if (!comm->Broadcast(path, sizeof(path), DType::kBytes, 0).ok()) return {};
  return path;
}

// Where a test's memory tier goes: /dev/shm/<root's name> when /dev/shm is a tmpfs (as in a real
// run: the tier's files are then mapped and restored from memory), else root/shm.
inline std::string TierScratchDir(const std::string& root) {
  struct statfs st {};
  if (::statfs("/dev/shm", &st) == 0 && st.f_type == TMPFS_MAGIC) return "/dev/shm/" + std::filesystem::path(root).filename().string();
  return root + "/shm";
}

inline Status RemoveSharedScratchRoot(Communicator* comm, const std::string& root) {
  RETURN_IF_ERROR(comm->Barrier());
  if (comm->rank() == 0 && !root.empty()) {
    std::filesystem::remove_all(TierScratchDir(root));
    std::filesystem::remove_all(root);
  }
  return Status();
}

}  // namespace zrt::testing
