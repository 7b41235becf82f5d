// Standard output of the `zrt` program, where a closed pipe is the end of the output.
//
// `zrt ckpt inspect ... | head -1`: once head exits, every further write to the pipe fails with EPIPE.
// By default that kills the writer with SIGPIPE at whatever it was doing; zrt ignores SIGPIPE instead
// and writes through FdOutput, which records the first write error and drops what follows (so the
// command's `<<` are no-ops from there on and its files are finished or removed by its own code, never
// cut short by a signal). At the end `FinishOutput` turns the outcome into the exit status
// (docs/cli.md "Exit codes").
#pragma once

#include <streambuf>
#include <vector>

namespace zrt::tools {

// A buffered std::streambuf over a file descriptor (not owned). write(2) is retried on EINTR and
// continued after short writes; the first error is kept (error()) and the rest of the output is
// dropped. Not thread-safe (one per descriptor, used by one thread).
class FdOutput : public std::streambuf {
 public:
  explicit FdOutput(int fd, size_t buffer_bytes = 64 * 1024);
  ~FdOutput() override;
  FdOutput(const FdOutput&) = delete;
  FdOutput& operator=(const FdOutput&) = delete;

  int error() const { return error_; }  // errno of the first failed write, 0 if none

 protected:
  int_type overflow(int_type ch) override;
  int sync() override;
  std::streamsize xsputn(const char* s, std::streamsize n) override;

 private:
  bool Drain();
  int fd_;
  int error_ = 0;
  std::vector<char> buffer_;
};

// The exit status of a command that returned `rc`, once its output has been flushed:
//   - the output was cut by a closed pipe (EPIPE) and the command succeeded: 128 + SIGPIPE (141), what
//     a shell reports for any program its reader stopped listening to; nothing is printed;
//   - another write error (a full disk behind a redirection): 1, with "zrt: writing the output: ..."
//     on stderr, since the output the caller asked for is incomplete;
//   - otherwise `rc` (a command's own error wins over a cut output: its message is on stderr).
int FinishOutput(FdOutput& out, int rc);

}  // namespace zrt::tools
