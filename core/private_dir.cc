#include "zrt/core/private_dir.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

namespace zrt {

Status CheckPrivateDir(const std::string& dir, const std::string& what) {
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) return ErrnoStatus(errno, what + ": " + dir);
  auto refuse = [&](const std::string& why) {
    return FailedPreconditionError(what, ": ", dir, " ", why,
                                   ": refused (another user could read or replace what zrt keeps there); remove it or choose another directory");
  };
  if (S_ISLNK(st.st_mode)) return refuse("is a symbolic link");
  if (!S_ISDIR(st.st_mode)) return refuse("is not a directory");
  if (st.st_uid != ::geteuid()) return refuse("is owned by uid " + std::to_string(st.st_uid) + ", not by this user (uid " + std::to_string(::geteuid()) + ")");
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return refuse(std::string("is writable by ") + ((st.st_mode & S_IWOTH) ? "others" : "its group") + " (mode " + mode + ")");
  }
  return Status();
}

Status MakePrivateDirs(const std::string& base, const std::string& path, const std::string& what) {
  if (path.compare(0, base.size(), base) != 0 || (path.size() > base.size() && path[base.size()] != '/' && !base.ends_with('/'))) {
    return InternalError(what, ": ", path, " is not under ", base);
  }
  // Every prefix of `path` that ends a component, shortest first.
  std::vector<std::string> prefixes;
  for (size_t i = 1; i <= path.size(); ++i) {
    if (i == path.size() || path[i] == '/') {
      if (path[i - 1] != '/') prefixes.push_back(path.substr(0, i));
    }
  }
  for (const std::string& p : prefixes) {
    const bool below_base = p.size() > base.size();
    bool created = false;
    if (::mkdir(p.c_str(), 0700) == 0) {
      created = true;
    } else if (const int err = errno; err != EEXIST) {
      struct stat st {};
      if (::stat(p.c_str(), &st) != 0) return ErrnoStatus(err, what + ": creating " + p);  // else it exists (a read-only parent)
    }
    if (below_base || created) RETURN_IF_ERROR(CheckPrivateDir(p, what));
  }
  return Status();
}

}  // namespace zrt
