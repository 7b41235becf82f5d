// UniqueFd: an owned POSIX file descriptor (move-only; closes on destruction). Use Close() where the
// result of close(2) matters (after writes: it can report deferred I/O errors).
#pragma once

#include <unistd.h>

#include <cerrno>
#include <utility>

#include "zrt/core/status.h"

namespace zrt {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) {
      Reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { Reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void Reset() {
    if (fd_ >= 0) ::close(fd_);  // errors ignored here: call Close() where they matter
    fd_ = -1;
  }
  // Gives up ownership (e.g. to fdopendir) and returns the descriptor.
  [[nodiscard]] int Release() && { return std::exchange(fd_, -1); }
  Status Close() && {
    const int fd = std::exchange(fd_, -1);
    if (fd >= 0 && ::close(fd) != 0) return ErrnoStatus(errno, "close");
    return Status();
  }

 private:
  int fd_ = -1;
};

}  // namespace zrt
