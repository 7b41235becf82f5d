// Watchdog: a background thread that watches pending asynchronous operations (NCCL collectives) and
// turns a hang or an asynchronous failure into an error instead of a job stuck forever.
//
// The owner Track()s each operation with a `done` probe. Every `interval`, the thread calls the
// `check` probe (e.g. ncclCommGetAsyncError), then each pending operation's `done`. The first failure,
// or the first operation pending longer than `timeout`, becomes the sticky error() and `abort` is
// called once (e.g. ncclCommAbort, which makes the stuck kernels return). Later work must not be
// started once error() is set; the owner checks it before each operation and in each wait.
//
// Thread-safety: Track/error/pending may be called from any thread. The probes and `abort` run on the
// watchdog thread (with `thread_init` called there first); they must be safe to call concurrently
// with the owner's own calls (NCCL documents both as such).
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "zrt/core/status.h"

namespace zrt {

class Watchdog {
 public:
  struct Options {
    std::chrono::milliseconds timeout{std::chrono::minutes(10)};
    std::chrono::milliseconds interval{std::chrono::milliseconds(100)};
    std::string name = "watchdog";                // names the error: "nccl communicator (rank 3 of 8)"
    std::function<void()> thread_init;            // optional: runs first on the watchdog thread
    std::function<Status()> check;                // optional: an asynchronous error of the whole resource
    std::function<void()> abort;                  // called once, on the first error or timeout
  };
  explicit Watchdog(Options o);
  ~Watchdog();  // stops the thread (pending operations are left as they are)
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Watches an operation until done() reports true (or an error).
  void Track(std::string what, std::function<Result<bool>()> done);
  // The sticky error (OK while none).
  Status error() const;
  size_t pending() const;

 private:
  struct Entry {
    std::string what;
    std::function<Result<bool>()> done;
    std::chrono::steady_clock::time_point start;
  };
  void Run();
  void Poll();          // with mu_ held
  void Fail(Status s);  // with mu_ held

  Options o_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Entry> entries_;
  Status error_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace zrt
