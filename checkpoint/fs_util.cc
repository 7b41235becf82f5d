#include "zrt/checkpoint/fs_util.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "zrt/core/unique_fd.h"

namespace zrt::ckpt {

Status WriteFileDurably(const IoEngine& io, const std::string& dir, const std::string& name, std::string_view content, mode_t perms) {
  const std::string tmp = dir + "/" + name + ".tmp", final = dir + "/" + name;
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, perms));
  if (!fd.valid()) return ErrnoStatus(errno, "creating " + tmp);
  size_t done = 0;
  while (done < content.size()) {
    const ssize_t n = ::write(fd.get(), content.data() + done, content.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "writing " + tmp);
    }
    done += static_cast<size_t>(n);
  }
  RETURN_IF_ERROR(io.FileOp("fsync", tmp));
  if (::fsync(fd.get()) != 0) return ErrnoStatus(errno, "fsync " + tmp);
  RETURN_IF_ERROR(std::move(fd).Close(), tmp);
  RETURN_IF_ERROR(io.FileOp("rename", tmp));
  return RenamePath(tmp, final);
}

Status FsyncDir(const std::string& dir) {
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoStatus(errno, "opening directory " + dir);
  if (::fsync(fd.get()) != 0) return ErrnoStatus(errno, "fsync directory " + dir);
  return Status();
}

Status FsyncFile(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoStatus(errno, "opening " + path);
  if (::fsync(fd.get()) != 0) return ErrnoStatus(errno, "fsync " + path);
  return Status();
}

Result<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return ErrnoStatus(errno ? errno : ENOENT, "reading " + path);
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return IoError("reading ", path);
  return s;
}

Status RenamePath(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) return ErrnoStatus(errno, "renaming " + from + " to " + to);
  return Status();
}

Status MakeDirs(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return ErrnoStatus(ec.value(), "creating directory " + dir);
  return Status();
}

Status RemoveTree(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec) return ErrnoStatus(ec.value(), "removing " + path);
  return Status();
}

}  // namespace zrt::ckpt
