// Directories only this user may use: where zrt keeps state that another local user must neither read
// nor plant (the memory tier's snapshots under /dev/shm, the NVMe swap files). Checkpoint roots are
// not private: their files follow the umask (docs/configuration.md).
//
// MakePrivateDirs creates what is missing of `path` with mode 0700 and checks every directory from
// `base` down to `path` (and any ancestor of `base` it had to create): each must be a directory, not
// a symbolic link, owned by this process's effective user, and not writable by group or others.
// Anything else is refused with an error naming the directory and why, and nothing in it is used.
// `base` itself, when it existed already (e.g. /dev/shm, sticky and world-writable), is the user's
// choice and is not checked. Files in such a directory are created with kPrivateFileMode.
// Internal: not installed.
#pragma once

#include <sys/types.h>

#include <string>

#include "zrt/core/status.h"

namespace zrt {

inline constexpr mode_t kPrivateFileMode = 0600;

// `what` opens the error ("memory tier", "offload.nvme_dir").
Status MakePrivateDirs(const std::string& base, const std::string& path, const std::string& what);

// The check alone, for a directory that exists.
Status CheckPrivateDir(const std::string& dir, const std::string& what);

}  // namespace zrt
