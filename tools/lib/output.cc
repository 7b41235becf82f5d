#include "tools/lib/output.h"

#include <cerrno>
#include <csignal>
#include <cstring>
#include <iostream>

#include <unistd.h>

namespace zrt::tools {

FdOutput::FdOutput(int fd, size_t buffer_bytes) : fd_(fd), buffer_(buffer_bytes) {
  setp(buffer_.data(), buffer_.data() + buffer_.size());
}

FdOutput::~FdOutput() { Drain(); }

// Writes the buffered bytes; after the first error the buffer is emptied without writing.
bool FdOutput::Drain() {
  const char* p = pbase();
  size_t left = static_cast<size_t>(pptr() - pbase());
  while (left > 0 && error_ == 0) {
    const ssize_t n = ::write(fd_, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      error_ = errno;
      break;
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  setp(buffer_.data(), buffer_.data() + buffer_.size());
  return error_ == 0;
}

FdOutput::int_type FdOutput::overflow(int_type ch) {
  if (!Drain()) return traits_type::eof();
  if (!traits_type::eq_int_type(ch, traits_type::eof())) {
    *pptr() = traits_type::to_char_type(ch);
    pbump(1);
  }
  return traits_type::not_eof(ch);
}

int FdOutput::sync() { return Drain() ? 0 : -1; }

std::streamsize FdOutput::xsputn(const char* s, std::streamsize n) {
  if (error_ != 0) return 0;  // the stream sets badbit: the command's further output is a no-op
  return std::streambuf::xsputn(s, n);
}

int FinishOutput(FdOutput& out, int rc) {
  out.pubsync();
  if (out.error() == 0) return rc;
  if (out.error() == EPIPE) return rc != 0 ? rc : 128 + SIGPIPE;
  std::cerr << "zrt: writing the output: " << std::strerror(out.error()) << "\n";
  return 1;
}

}  // namespace zrt::tools
