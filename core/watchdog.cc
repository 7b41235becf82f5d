#include "zrt/core/watchdog.h"

#include "zrt/core/logging.h"

namespace zrt {

Watchdog::Watchdog(Options o) : o_(std::move(o)) { thread_ = std::thread([this] { Run(); }); }

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Watchdog::Track(std::string what, std::function<Result<bool>()> done) {
  std::lock_guard<std::mutex> lock(mu_);
  entries_.push_back({std::move(what), std::move(done), std::chrono::steady_clock::now()});
}

Status Watchdog::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

size_t Watchdog::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

void Watchdog::Fail(Status s) {
  if (!error_.ok()) return;
  error_ = std::move(s);
  ZRT_LOG(kError) << error_.message();
  entries_.clear();
}

void Watchdog::Run() {
  if (o_.thread_init) o_.thread_init();
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, o_.interval, [this] { return stop_; });
    if (stop_ || !error_.ok()) continue;
    Poll();
    if (!error_.ok() && o_.abort) {  // once: error_ stays set; outside the lock (abort may take a while)
      lock.unlock();
      o_.abort();
      lock.lock();
    }
  }
}

void Watchdog::Poll() {
  if (o_.check) {
    Status s = o_.check();
    if (!s.ok()) {
      Fail(s.WithContext(o_.name + ": asynchronous error; aborted"));
      return;
    }
  }
  // Operations complete in order on one stream: stop at the first one still running.
  while (!entries_.empty()) {
    Entry& e = entries_.front();
    Result<bool> done = e.done();
    if (!done.ok()) {
      Fail(done.status().WithContext(o_.name + ": " + e.what + " failed; aborted"));
      break;
    }
    if (*done) {
      entries_.pop_front();
      continue;
    }
    const auto waited = std::chrono::steady_clock::now() - e.start;
    if (waited > o_.timeout) {
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(waited).count();
      Fail(Status(StatusCode::kUnavailable,
                  internal::StrCat(o_.name, ": ", e.what, " has not finished after ", ms / 1000.0, " s (timeout ",
                                   o_.timeout.count() / 1000.0, " s: a rank died or stopped calling collectives, ",
                                   "or ranks called different collectives); aborted. Restart from the last checkpoint")));
    }
    break;
  }
}

}  // namespace zrt
