// IoEngine: asynchronous file I/O for offload and checkpoints.
//
// Backends behind one interface: io_uring (liburing; bounded requests in flight, completions reaped by
// one owned thread) and a pread/pwrite thread pool, chosen when io_uring is unavailable (runtime probe;
// the choice is logged) or asked for. A request is split into blocks (default 1 MiB); with an O_DIRECT
// descriptor, 4 KiB-aligned parts go direct and unaligned heads/tails through the buffered descriptor.
// Short transfers, EAGAIN and EINTR are retried; other errors fail the request with the file, offset
// and errno, and are also kept as the engine's sticky error, returned (once) by the next call.
//
// Lifetimes: a buffer passed to Read/Write must stay valid and untouched, and its IoFile open, until
// the handle is complete (Wait returned). Destroying the engine waits for everything in flight.
// Thread-safety: Read/Write/Wait may be called from any threads concurrently.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "zrt/core/status.h"
#include "zrt/core/unique_fd.h"

namespace zrt {

inline constexpr size_t kIoAlignment = 4096;  // O_DIRECT alignment of buffers, offsets and lengths

// A file opened for the engine: a buffered descriptor, plus an O_DIRECT one where the filesystem
// allows it. Move-only.
class IoFile {
 public:
  enum class Mode { kRead, kReadWrite, kCreate };  // kCreate: create or truncate, read-write
  static Result<IoFile> Open(const std::string& path, Mode mode, bool direct = true);
  const std::string& path() const { return path_; }
  int fd() const { return fd_.get(); }
  int direct_fd() const { return direct_.get(); }  // -1 when O_DIRECT is unavailable or not asked for
  Result<int64_t> Size() const;
  Status Sync() const;  // fsync
  Status Truncate(int64_t size) const;
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

struct IoOptions {
  enum class Backend { kAuto, kUring, kThreads };
  Backend backend = Backend::kAuto;
  int queue_depth = 32;           // blocks in flight at most
  int64_t block_bytes = 1 << 20;  // requests are split into blocks of this size
  int threads = 4;                // workers of the thread backend
#if defined(ZRT_FAULT_INJECTION)
  // Test builds only: called before each block (remainder) is issued. Return 0 to proceed (optionally
  // lowering *len to force a short transfer), EAGAIN/EINTR to be retried, or an errno to fail with.
  std::function<int(bool write, int64_t offset, size_t* len)> fault;
#endif
};

class IoEngine {
 public:
  static Result<std::unique_ptr<IoEngine>> Create(const IoOptions& options = {});
  virtual ~IoEngine() = default;
  virtual std::string_view backend() const = 0;  // "io_uring" or "threads"

  Result<IoHandle> Read(const IoFile& f, void* buf, size_t len, int64_t offset);
  Result<IoHandle> Write(const IoFile& f, const void* buf, size_t len, int64_t offset);
  // Convenience: submit and wait.
  Status ReadSync(const IoFile& f, void* buf, size_t len, int64_t offset);
  Status WriteSync(const IoFile& f, const void* buf, size_t len, int64_t offset);

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
  explicit IoEngine(const IoOptions& o) : options_(o) {}
  virtual void Submit(std::unique_ptr<Block> b) = 0;
  // Called by backends when a block ends; records the sticky error.
  void Finish(Block& b, Status s);
  // Before (re)issuing a block's remainder: moves an unaligned remainder off the O_DIRECT descriptor
  // and applies the fault hook (test builds); returns an errno to fail the block with, or 0.
  int Fault(Block& b, size_t* len) const;
  static Status BlockError(const Block& b, int err);
  const IoOptions options_;

 private:
  Result<IoHandle> Issue(const IoFile& f, char* buf, size_t len, int64_t offset, bool write);
  std::mutex error_mu_;
  Status sticky_;
};

}  // namespace zrt
