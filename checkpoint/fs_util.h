// Small durable-filesystem helpers for the checkpoint module (errors name the path). Durability steps
// ask `io`'s hooks first (the fault-injection seam, offload/io_engine.h).
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>

#include "zrt/core/status.h"
#include "zrt/offload/io_engine.h"

namespace zrt::ckpt {

// Writes `content` to dir/name through dir/name.tmp: write, fsync, close, rename. The caller fsyncs
// the directory when the name must be durable.
Status WriteFileDurably(const IoEngine& io, const std::string& dir, const std::string& name, std::string_view content, mode_t perms = 0644);
Status FsyncDir(const std::string& dir);
Status FsyncFile(const std::string& path);
Result<std::string> ReadWholeFile(const std::string& path);
Status RenamePath(const std::string& from, const std::string& to);
Status MakeDirs(const std::string& dir);
// Removes a tree; a missing path is not an error.
Status RemoveTree(const std::string& path);

}  // namespace zrt::ckpt
