// IoEngine: asynchronous file I/O for offload and checkpoints.
//
// Backends behind one interface: io_uring (liburing; bounded requests in flight, completions reaped by
// one owned thread) and a pread/pwrite thread pool, chosen when io_uring is unavailable (runtime probe;
// the choice is logged) or asked for. A request is split into blocks (default 1 MiB); with an O_DIRECT
// descriptor, 4 KiB-aligned parts go direct and unaligned heads/tails through the buffered descriptor.
// Short transfers, EAGAIN and EINTR are retried; other errors fail the request with the file, offset
// and errno, returned by its handle's Wait (every handle must be waited). The io_uring backend probes
// the opcodes it uses (kernels before 5.6 set up a ring and then fail every read) and falls back to
// the thread pool; a ring that stops delivering completions fails everything in flight and the engine
// stays failed (every later request returns that error), like NCCL's async error.
//
// Lifetimes: a buffer passed to Read/Write must stay valid and untouched, and its IoFile open, until
// the handle is complete (Wait returned). Destroying the engine waits for everything in flight.
// Thread-safety: Read/Write/Wait may be called from any threads concurrently.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "zrt/core/status.h"
#include "zrt/core/unique_fd.h"
#include "zrt/offload/io_options.h"

namespace zrt {

inline constexpr size_t kIoAlignment = 4096;  // O_DIRECT alignment of buffers, offsets and lengths

// A file opened for the engine: a buffered descriptor, plus an O_DIRECT one where the filesystem
// allows it. Move-only.
class IoFile {
 public:
  enum class Mode { kRead, kReadWrite, kCreate };  // kCreate: create or truncate, read-write
  // `perms`: a created file's mode (before the umask).
  static Result<IoFile> Open(const std::string& path, Mode mode, bool direct = true, mode_t perms = 0644);
  // `name` inside the directory open as `dir_fd`, never through a symbolic link (O_NOFOLLOW); `name`
  // must be one path component (no '/', not "." or ".."). `path` names the file in errors.
  static Result<IoFile> OpenAt(int dir_fd, const std::string& name, const std::string& path, Mode mode, bool direct = true);
  const std::string& path() const { return path_; }
  int fd() const { return fd_.get(); }
  int direct_fd() const { return direct_.get(); }  // -1 when O_DIRECT is unavailable or not asked for
  Result<int64_t> Size() const;
  Status Sync() const;  // fsync
  Status Truncate(int64_t size) const;
  // Allocates the file's blocks for [0, bytes) and makes it at least that long (fallocate, mode 0):
  // writes into it then allocate nothing, and O_DIRECT writes to it are overwrites, not appends that
  // extend the file one by one (1.5-1.8x the sequential write rate on ext4 here). A filesystem without
  // fallocate gets nothing (OK); no room for it is an error naming the file.
  Status Reserve(int64_t bytes) const;
  // Closes both descriptors, reporting close errors.
  Status Close() &&;

 private:
  std::string path_;
  UniqueFd fd_, direct_;
};

// Where a request stands; shared between the handle and the backend.
class IoRequest {
 public:
  explicit IoRequest(int blocks) : pending_(blocks) {}
  void BlockDone(Status s);
  Status Wait();
  bool Done() const { return pending_.load(std::memory_order_acquire) == 0; }

 private:
  std::atomic<int> pending_;
  std::mutex mu_;
  std::condition_variable cv_;
  Status status_;
};

class IoHandle {
 public:
  IoHandle() = default;
  explicit IoHandle(std::shared_ptr<IoRequest> r) : r_(std::move(r)) {}
  // Blocks until every block of the request finished; returns the first error.
  Status Wait() { return r_ ? r_->Wait() : Status(); }
  bool Done() const { return !r_ || r_->Done(); }

 private:
  std::shared_ptr<IoRequest> r_;
};

// The test seam of file I/O (../shared/STYLE.md item 9): an engine made with hooks asks them before
// each transfer and before each durability step of the code that uses it; production code passes none.
// Thread-safety: called from the engine's threads (transfers) and its users' (file operations) at once.
class IoHooks {
 public:
  virtual ~IoHooks() = default;
  // Before a block (or the remainder of a short one) is issued: 0 to proceed (optionally lowering
  // *len to force a short transfer), EAGAIN or EINTR to be retried, another errno to fail it with.
  virtual int BeforeTransfer(bool write, const std::string& path, int64_t offset, size_t* len) {
    (void)write, (void)path, (void)offset, (void)len;
    return 0;
  }
  // Before a durability step `op` ("fsync", "rename", "commit", ...) on `path`: 0, or the errno it fails with.
  virtual int BeforeFileOp(std::string_view op, const std::string& path) {
    (void)op, (void)path;
    return 0;
  }
  // io_uring: before each wait for a completion; an errno makes the wait fail with it.
  virtual int BeforeRingWait() { return 0; }
};

class IoEngine {
 public:
  // `hooks` (tests only; may be null) must outlive the engine.
  static Result<std::unique_ptr<IoEngine>> Create(const IoOptions& options = {}, IoHooks* hooks = nullptr);
  virtual ~IoEngine() = default;
  virtual std::string_view backend() const = 0;  // "io_uring" or "threads"

  Result<IoHandle> Read(const IoFile& f, void* buf, size_t len, int64_t offset);
  Result<IoHandle> Write(const IoFile& f, const void* buf, size_t len, int64_t offset);
  // Convenience: submit and wait.
  Status ReadSync(const IoFile& f, void* buf, size_t len, int64_t offset);
  Status WriteSync(const IoFile& f, const void* buf, size_t len, int64_t offset);
  // A durability step of the caller's protocol: OK, or the hooks' injected failure ("<op> <path>: ...").
  Status FileOp(std::string_view op, const std::string& path) const;
  // fsync of f (after FileOp("fsync")).
  Status Sync(const IoFile& f) const;
  IoHooks* hooks() const { return hooks_; }

  // One block as the backends see it (internal).
  struct Block {
    std::shared_ptr<IoRequest> request;
    const IoFile* file;
    int fd;
    char* buf;
    size_t len;
    int64_t offset;
    bool write;
    size_t done = 0;
  };

 protected:
  IoEngine(const IoOptions& o, IoHooks* hooks) : options_(o), hooks_(hooks) {}
  // Takes the blocks of one request (in order; each is finished exactly once, through Finish).
  virtual void Submit(std::vector<std::unique_ptr<Block>> blocks) = 0;
  // Called by backends when a block ends.
  static void Finish(Block& b, Status s);
  // Before (re)issuing a block's remainder: moves an unaligned remainder off the O_DIRECT descriptor
  // and applies the hooks; returns an errno to fail the block with, or 0.
  int Fault(Block& b, size_t* len) const;
  static Status BlockError(const Block& b, int err);
  const IoOptions options_;
  IoHooks* const hooks_;

 private:
  Result<IoHandle> Issue(const IoFile& f, char* buf, size_t len, int64_t offset, bool write);
};

}  // namespace zrt
