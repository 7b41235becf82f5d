// IoEngine: request splitting, the io_uring backend, the thread backend (see io_engine.h; the ring's
// protocol is written above UringEngine).
#include "zrt/offload/io_engine.h"

#include <fcntl.h>
#include <liburing.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <unordered_set>

#include "zrt/core/device.h"
#include "zrt/core/logging.h"
#include "zrt/core/thread_pool.h"

namespace zrt {

// ---- IoFile ----------------------------------------------------------------------------------------
namespace {
int ModeFlags(IoFile::Mode mode) {
  switch (mode) {
    case IoFile::Mode::kRead: return O_RDONLY;
    case IoFile::Mode::kReadWrite: return O_RDWR;
    case IoFile::Mode::kCreate: return O_RDWR | O_CREAT | O_TRUNC;
  }
  return O_RDONLY;
}
}  // namespace

Result<IoFile> IoFile::Open(const std::string& path, Mode mode, bool direct, mode_t perms) {
  const int flags = O_CLOEXEC | ModeFlags(mode);
  IoFile f;
  f.path_ = path;
  f.fd_ = UniqueFd(::open(path.c_str(), flags, perms));
  if (!f.fd_.valid()) return ErrnoStatus(errno, "opening " + path);
  if (direct) {
    // O_DIRECT is refused by some filesystems (tmpfs: EINVAL): then everything goes buffered.
    f.direct_ = UniqueFd(::open(path.c_str(), (flags & ~(O_CREAT | O_TRUNC)) | O_DIRECT));
  }
  return f;
}

Result<IoFile> IoFile::OpenAt(int dir_fd, const std::string& name, const std::string& path, Mode mode, bool direct) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos) {
    return InvalidArgumentError("opening ", path, ": '", name, "' is not a plain file name");
  }
  const int flags = O_CLOEXEC | O_NOFOLLOW | ModeFlags(mode);
  IoFile f;
  f.path_ = path;
  f.fd_ = UniqueFd(::openat(dir_fd, name.c_str(), flags, 0644));
  if (!f.fd_.valid()) {
    const int err = errno;
    if (err == ELOOP) return DataLossError("opening ", path, ": a symbolic link (checkpoint files are never followed through links)");
    return ErrnoStatus(err, "opening " + path);
  }
  struct stat st;
  if (::fstat(f.fd_.get(), &st) != 0) return ErrnoStatus(errno, "stat " + path);
  if (!S_ISREG(st.st_mode)) return DataLossError("opening ", path, ": not a regular file");
  if (direct) f.direct_ = UniqueFd(::openat(dir_fd, name.c_str(), (flags & ~(O_CREAT | O_TRUNC)) | O_DIRECT));
  return f;
}

Result<int64_t> IoFile::Size() const {
  struct stat st;
  if (::fstat(fd_.get(), &st) != 0) return ErrnoStatus(errno, "stat " + path_);
  return static_cast<int64_t>(st.st_size);
}

Status IoFile::Sync() const {
  if (::fsync(fd_.get()) != 0) return ErrnoStatus(errno, "fsync " + path_);
  return Status();
}

Status IoFile::Truncate(int64_t size) const {
  if (::ftruncate(fd_.get(), size) != 0) return ErrnoStatus(errno, "truncating " + path_);
  return Status();
}

Status IoFile::Reserve(int64_t bytes) const {
  if (bytes <= 0) return Status();
  int rc = 0;
  do {
    rc = ::fallocate(fd_.get(), 0, 0, static_cast<off_t>(bytes));
  } while (rc != 0 && errno == EINTR);
  if (rc == 0 || errno == EOPNOTSUPP || errno == ENOSYS) return Status();
  return ErrnoStatus(errno, "reserving " + FormatBytes(bytes) + " for " + path_);
}

Status IoFile::Close() && {
  Status d = std::move(direct_).Close();
  Status b = std::move(fd_).Close();
  if (!b.ok()) return b.WithContext(path_);
  return d.ok() ? d : d.WithContext(path_);
}

// ---- IoRequest -------------------------------------------------------------------------------------
void IoRequest::BlockDone(Status s) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!s.ok() && status_.ok()) status_ = std::move(s);
  if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) cv_.notify_all();
}

Status IoRequest::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return pending_.load(std::memory_order_acquire) == 0; });
  return status_;
}

// ---- IoEngine (common) -----------------------------------------------------------------------------
void IoEngine::Finish(Block& b, Status s) { b.request->BlockDone(std::move(s)); }

int IoEngine::Fault(Block& b, size_t* len) const {
  *len = b.len - b.done;
  int err = 0;
  if (hooks_ != nullptr) {
    // EAGAIN and EINTR are retried, as they are from the kernel.
    do {
      *len = b.len - b.done;
      err = hooks_->BeforeTransfer(b.write, b.file->path(), b.offset + static_cast<int64_t>(b.done), len);
    } while (err == EAGAIN || err == EINTR);
  }
  // O_DIRECT needs position, address and length aligned; a remainder after a short transfer may not
  // be: it continues through the buffered descriptor.
  const auto pos = static_cast<uint64_t>(b.offset) + b.done;
  const auto addr = reinterpret_cast<uintptr_t>(b.buf + b.done);
  if (b.fd == b.file->direct_fd() && ((pos | addr | *len) % kIoAlignment) != 0) b.fd = b.file->fd();
  return err;
}

Status IoEngine::BlockError(const Block& b, int err) {
  return ErrnoStatus(err, internal::StrCat(b.write ? "writing " : "reading ", b.len - b.done, " bytes at offset ",
                                           b.offset + static_cast<int64_t>(b.done), " of ", b.file->path()));
}

Status IoEngine::FileOp(std::string_view op, const std::string& path) const {
  if (hooks_ == nullptr) return Status();
  if (const int err = hooks_->BeforeFileOp(op, path); err != 0) return ErrnoStatus(err, std::string(op) + " " + path);
  return Status();
}

Status IoEngine::Sync(const IoFile& f) const {
  RETURN_IF_ERROR(FileOp("fsync", f.path()));
  return f.Sync();
}

Result<IoHandle> IoEngine::Issue(const IoFile& f, char* buf, size_t len, int64_t offset, bool write) {
  if (offset < 0) return InvalidArgumentError("negative file offset ", offset, " for ", f.path());
  if (len > 0 && buf == nullptr) return InvalidArgumentError("null buffer for ", f.path());
  // Parts: [direct-aligned middle] through O_DIRECT, the rest buffered.
  struct Part {
    int fd;
    size_t begin, end;
  };
  std::vector<Part> parts;
  const auto addr = reinterpret_cast<uintptr_t>(buf);
  const bool direct = f.direct_fd() >= 0 && addr % kIoAlignment == 0 && offset % static_cast<int64_t>(kIoAlignment) == 0;
  const size_t aligned = direct ? len / kIoAlignment * kIoAlignment : 0;
  if (aligned > 0) parts.push_back({f.direct_fd(), 0, aligned});
  if (aligned < len) parts.push_back({f.fd(), aligned, len});
  const size_t block = static_cast<size_t>(std::max<int64_t>(options_.block_bytes, static_cast<int64_t>(kIoAlignment)));
  int blocks = 0;
  for (const Part& p : parts) blocks += static_cast<int>((p.end - p.begin + block - 1) / block);
  auto req = std::make_shared<IoRequest>(blocks);
  std::vector<std::unique_ptr<Block>> batch;
  batch.reserve(static_cast<size_t>(blocks));
  for (const Part& p : parts) {
    for (size_t b = p.begin; b < p.end; b += block) {
      batch.push_back(std::make_unique<Block>(
          Block{req, &f, p.fd, buf + b, std::min(block, p.end - b), offset + static_cast<int64_t>(b), write}));
    }
  }
  if (!batch.empty()) Submit(std::move(batch));
  return IoHandle(std::move(req));
}

Result<IoHandle> IoEngine::Read(const IoFile& f, void* buf, size_t len, int64_t offset) {
  return Issue(f, static_cast<char*>(buf), len, offset, false);
}
Result<IoHandle> IoEngine::Write(const IoFile& f, const void* buf, size_t len, int64_t offset) {
  return Issue(f, const_cast<char*>(static_cast<const char*>(buf)), len, offset, true);  // never written through
}
Status IoEngine::ReadSync(const IoFile& f, void* buf, size_t len, int64_t offset) {
  ASSIGN_OR_RETURN(IoHandle h, Read(f, buf, len, offset));
  return h.Wait();
}
Status IoEngine::WriteSync(const IoFile& f, const void* buf, size_t len, int64_t offset) {
  ASSIGN_OR_RETURN(IoHandle h, Write(f, buf, len, offset));
  return h.Wait();
}

namespace {

// ---- io_uring backend ------------------------------------------------------------------------------
// Protocol: submitters take `mu_`, prepare one SQE per block (user_data = Block*) while fewer than
// queue_depth blocks are in flight, and submit once per batch (and before waiting for space, so what
// they wait for is in the kernel). One reaper thread waits for CQEs; a short transfer or -EAGAIN/-EINTR
// is re-prepared for its remainder (keeping its slot), anything else ends the block. If waiting for
// completions keeps failing, the ring is declared broken: every block in flight fails, the reaper
// exits, and every later request fails with the same error. Shutdown: wait until nothing is in
// flight, then a NOP with user_data 0 tells the reaper to exit.
class UringEngine final : public IoEngine {
 public:
  static Result<std::unique_ptr<IoEngine>> Create(const IoOptions& o, IoHooks* hooks) {
    std::unique_ptr<UringEngine> e(new UringEngine(o, hooks));
    const int rc = io_uring_queue_init(static_cast<unsigned>(std::max(o.queue_depth, 1)) + 1, &e->ring_, 0);
    if (rc < 0) return ErrnoStatus(-rc, "io_uring_queue_init");
    e->ring_ok_ = true;
    RETURN_IF_ERROR(e->Probe());
    e->reaper_ = std::thread([p = e.get()] { p->Reap(); });
    pthread_setname_np(e->reaper_.native_handle(), "zrt-io-reap");
    return std::unique_ptr<IoEngine>(std::move(e));
  }
  ~UringEngine() override {
    if (!ring_ok_) return;
    std::unique_lock<std::mutex> lock(mu_);
    space_.wait(lock, [this] { return in_flight_ == 0; });
    stop_.store(true, std::memory_order_release);  // seen by a timed wait (broken ring: no NOP gets through)
    if (broken_.ok()) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      io_uring_prep_nop(sqe);
      io_uring_sqe_set_data(sqe, nullptr);  // the reaper's stop signal
      SubmitLocked();
    }
    lock.unlock();
    if (reaper_.joinable()) reaper_.join();
    io_uring_queue_exit(&ring_);
  }
  std::string_view backend() const override { return "io_uring"; }

 protected:
  void Submit(std::vector<std::unique_ptr<Block>> blocks) override {
    std::unique_lock<std::mutex> lock(mu_);
    const int depth = std::max(options_.queue_depth, 1);
    bool unsubmitted = false;
    for (auto& b : blocks) {
      if (in_flight_ >= depth) {
        if (unsubmitted) SubmitLocked();  // what we wait for must be in the kernel
        unsubmitted = false;
        space_.wait(lock, [&] { return in_flight_ < depth || !broken_.ok(); });
      }
      if (!broken_.ok()) {
        Finish(*b, broken_);
        continue;
      }
      ++in_flight_;
      unsubmitted = Prep(b.release()) || unsubmitted;
    }
    if (unsubmitted) SubmitLocked();
  }

 private:
  UringEngine(const IoOptions& o, IoHooks* hooks) : IoEngine(o, hooks) {}

  // The opcodes used here exist since Linux 5.6; an older kernel sets up a ring and fails every request.
  Status Probe() {
    io_uring_probe* probe = io_uring_get_probe_ring(&ring_);
    if (probe == nullptr) return UnavailableError("io_uring: the kernel cannot report its opcodes (older than 5.6)");
    const bool ok = io_uring_opcode_supported(probe, IORING_OP_READ) && io_uring_opcode_supported(probe, IORING_OP_WRITE) &&
                    io_uring_opcode_supported(probe, IORING_OP_NOP);
    io_uring_free_probe(probe);
    if (!ok) return UnavailableError("io_uring: the kernel lacks IORING_OP_READ/WRITE (older than 5.6)");
    return Status();
  }

  // Under mu_, with the block counted in flight. Prepares the remainder of a block (or fails it through
  // the hooks); true when an SQE was queued (the caller submits).
  bool Prep(Block* b) {
    size_t len = 0;
    if (const int err = Fault(*b, &len); err != 0) {
      Retire(b, BlockError(*b, err));
      return false;
    }
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);  // never null: the ring has queue_depth + 1 entries
    if (b->write) {
      io_uring_prep_write(sqe, b->fd, b->buf + b->done, static_cast<unsigned>(len), static_cast<uint64_t>(b->offset) + b->done);
    } else {
      io_uring_prep_read(sqe, b->fd, b->buf + b->done, static_cast<unsigned>(len), static_cast<uint64_t>(b->offset) + b->done);
    }
    io_uring_sqe_set_data(sqe, b);
    live_.insert(b);
    return true;
  }

  // Under mu_: ends a block (in flight until now).
  void Retire(Block* b, Status s) {
    live_.erase(b);
    --in_flight_;
    space_.notify_all();
    Finish(*b, std::move(s));
    delete b;
  }

  // Under mu_. A failed submit leaves the SQEs queued; a persistent failure breaks the ring.
  void SubmitLocked() {
    for (int tries = 0; io_uring_sq_ready(&ring_) > 0; ++tries) {
      const int rc = io_uring_submit(&ring_);
      if (rc >= 0 || rc == -EINTR) continue;
      if ((rc == -EAGAIN || rc == -EBUSY) && tries < 100) {
        std::this_thread::sleep_for(std::chrono::microseconds(100 * (tries + 1)));
        continue;
      }
      Break(ErrnoStatus(-rc, "io_uring_submit"));
      return;
    }
  }

  // Under mu_: the ring is unusable. Every block in flight fails (the kernel may still finish its
  // transfer: the engine cannot know), and so does every later request.
  void Break(Status s) {
    if (!broken_.ok()) return;
    broken_ = IoError("the io_uring ring failed (", s.message(), "); the I/O engine is unusable");
    ZRT_LOG(kError) << broken_;
    while (!live_.empty()) Retire(*live_.begin(), broken_);
  }

  void Reap() {
    int failures = 0;
    for (;;) {
      io_uring_cqe* cqe = nullptr;
      int rc = 0;
      if (const int err = hooks_ ? hooks_->BeforeRingWait() : 0; err != 0) {
        rc = -err;
      } else if (ring_.features & IORING_FEAT_EXT_ARG) {
        // A timed wait (no SQE needed on 5.11+), so a stop request is seen even if no NOP gets through.
        __kernel_timespec ts{0, 100 * 1000 * 1000};
        rc = io_uring_wait_cqe_timeout(&ring_, &cqe, &ts);
        if (rc == -ETIME) {
          if (stop_.load(std::memory_order_acquire) && !broken_ok()) return;
          continue;
        }
      } else {
        rc = io_uring_wait_cqe(&ring_, &cqe);
      }
      if (rc == -EINTR) continue;
      if (rc < 0) {
        // Retried with a growing pause (a transient condition passes); a ring that keeps failing for
        // about a second is broken, never spun on forever.
        if (++failures < kMaxWaitFailures) {
          std::this_thread::sleep_for(std::chrono::milliseconds(failures));
          continue;
        }
        std::lock_guard<std::mutex> lock(mu_);
        Break(ErrnoStatus(-rc, "io_uring_wait_cqe"));
        return;
      }
      failures = 0;
      auto* b = static_cast<Block*>(io_uring_cqe_get_data(cqe));
      const int res = cqe->res;
      io_uring_cqe_seen(&ring_, cqe);
      if (b == nullptr) return;  // shutdown NOP
      Complete(b, res);
    }
  }

  void Complete(Block* b, int res) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!live_.contains(b)) return;  // failed already by Break
    if (res == -EAGAIN || res == -EINTR || (res > 0 && b->done + static_cast<size_t>(res) < b->len)) {
      if (res > 0) b->done += static_cast<size_t>(res);
      live_.erase(b);
      if (Prep(b)) SubmitLocked();  // same slot
      return;
    }
    Status s;
    if (res < 0) {
      s = BlockError(*b, -res);
    } else if (res == 0 && b->len > b->done) {
      s = DataLossError("unexpected end of file reading ", b->len - b->done, " bytes at offset ",
                        b->offset + static_cast<int64_t>(b->done), " of ", b->file->path());
    }
    Retire(b, std::move(s));
  }

  bool broken_ok() {
    std::lock_guard<std::mutex> lock(mu_);
    return broken_.ok();
  }

  static constexpr int kMaxWaitFailures = 45;  // pauses of 1..44 ms: about one second in all

  io_uring ring_{};
  bool ring_ok_ = false;
  std::thread reaper_;
  std::mutex mu_;
  std::condition_variable space_;
  int in_flight_ = 0;
  std::unordered_set<Block*> live_;  // prepared or in the kernel
  Status broken_;                    // sticky once set: the ring failed
  std::atomic<bool> stop_{false};    // the destructor asks the reaper to exit
};

// ---- thread-pool backend ---------------------------------------------------------------------------
class ThreadEngine final : public IoEngine {
 public:
  ThreadEngine(const IoOptions& o, IoHooks* hooks) : IoEngine(o, hooks), pool_(std::max(o.threads, 1), "zrt-io") {}
  ~ThreadEngine() override {
    std::unique_lock<std::mutex> lock(mu_);
    space_.wait(lock, [this] { return in_flight_ == 0; });
  }
  std::string_view backend() const override { return "threads"; }

 protected:
  void Submit(std::vector<std::unique_ptr<Block>> blocks) override {
    for (auto& b : blocks) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        space_.wait(lock, [this] { return in_flight_ < std::max(options_.queue_depth, 1); });
        ++in_flight_;
      }
      (void)pool_.Submit([this, blk = std::shared_ptr<Block>(std::move(b))] {
        Finish(*blk, Transfer(*blk));
        std::lock_guard<std::mutex> lock(mu_);
        --in_flight_;
        space_.notify_all();
      });
    }
  }

 private:
  Status Transfer(Block& b) {
    while (b.done < b.len) {
      size_t len = 0;
      if (const int err = Fault(b, &len); err != 0) return BlockError(b, err);
      const off_t off = static_cast<off_t>(b.offset + static_cast<int64_t>(b.done));
      const ssize_t n = b.write ? ::pwrite(b.fd, b.buf + b.done, len, off) : ::pread(b.fd, b.buf + b.done, len, off);
      if (n < 0) {
        if (errno == EINTR || errno == EAGAIN) continue;
        return BlockError(b, errno);
      }
      if (n == 0 && !b.write) {
        return DataLossError("unexpected end of file reading ", b.len - b.done, " bytes at offset ", off, " of ", b.file->path());
      }
      b.done += static_cast<size_t>(n);
    }
    return Status();
  }

  ThreadPool pool_;
  std::mutex mu_;
  std::condition_variable space_;
  int in_flight_ = 0;
};

}  // namespace

Result<std::unique_ptr<IoEngine>> IoEngine::Create(const IoOptions& o, IoHooks* hooks) {
  if (o.queue_depth < 1) return InvalidArgumentError("io engine: queue_depth must be >= 1, got ", o.queue_depth);
  if (o.block_bytes < 1) return InvalidArgumentError("io engine: block_bytes must be >= 1, got ", o.block_bytes);
  if (o.backend != IoOptions::Backend::kThreads) {
    auto e = UringEngine::Create(o, hooks);
    if (e.ok()) {
      ZRT_LOG(kDebug) << "io engine: io_uring, queue depth " << o.queue_depth;
      return e;
    }
    if (o.backend == IoOptions::Backend::kUring) return e.status().WithContext("io engine: io_uring requested");
    ZRT_LOG(kInfo) << "io engine: io_uring unavailable (" << e.status() << "); using the pread/pwrite thread pool";
  }
  return std::unique_ptr<IoEngine>(new ThreadEngine(o, hooks));
}

}  // namespace zrt
