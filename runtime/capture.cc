// Captures of the optimizer store's state (capture.h).
#include "zrt/runtime/capture.h"
#include "zrt/core/base.h"

#include <algorithm>
#include <chrono>

namespace zrt::internal {

Status CaptureJob::Put(int group, int buffer, int64_t offset, int64_t n, const float* data) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!status_.ok()) return status_;
  if (closed_) return FailedPreconditionError("capture: a part came after the sink was closed");
  Status s = sink_->Put(group, buffer, offset, n, data);
  if (!s.ok()) status_ = s;
  return s;
}

Status CaptureJob::PutStored(int group, int buffer, int64_t offset, int64_t n, const StateFormat& format, const void* values,
                             const float* scales) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!status_.ok()) return status_;
  if (closed_) return FailedPreconditionError("capture: a part came after the sink was closed");
  Status s = sink_->PutStored(group, buffer, offset, n, format, values, scales);
  if (!s.ok()) status_ = s;
  return s;
}

void CaptureJob::Waited(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  if (sink_) sink_->Waited(seconds);
}

void CaptureJob::Done(const Status& status) {
  std::shared_ptr<StateSink> sink;
  Status close;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!status.ok() && status_.ok()) status_ = status;
    if (closed_ || --producers_ > 0) return;
    closed_ = true;
    close = status_;
    sink = std::move(sink_);
  }
  sink->Close(close);
}

bool CaptureJob::failed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !status_.ok();
}

bool CaptureJob::closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

// One capture's thread part: its slots, where each starts in the order they are streamed, and how far
// the thread got (every kind of every element before `progress` is put). Guarded by Captures::mu_.
struct Captures::Running {
  std::shared_ptr<CaptureJob> job;
  std::vector<Slot> slots;
  DeviceBuffer bounce;        // empty when no slot bounces
  std::vector<int64_t> base;  // slots[i] starts at base[i]
  int64_t progress = 0;
  bool finished = false;
};

Captures::~Captures() { thread_.reset(); }

Result<std::shared_ptr<CaptureJob>> Captures::Start(std::shared_ptr<StateSink> sink, std::vector<Slot> slots, int other_producers) {
  if (slots.empty() && other_producers == 0) {  // nothing to capture: closed at once
    auto job = std::make_shared<CaptureJob>(std::move(sink), 1);
    job->Done(Status());
    return job;
  }
  auto job = std::make_shared<CaptureJob>(std::move(sink), other_producers + (slots.empty() ? 0 : 1));
  if (slots.empty()) return job;
  auto r = std::make_shared<Running>();
  r->job = job;
  int64_t at = 0, bounce = 0;
  for (const Slot& s : slots) {
    r->base.push_back(at);
    at += s.elements;
    if (s.bounces) bounce = std::max(bounce, std::min(part_, s.elements));
  }
  r->slots = std::move(slots);
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = bounces_.begin(); bounce > 0 && it != bounces_.end(); ++it) {
      if (static_cast<int64_t>(it->size()) >= bounce * 4) {
        r->bounce = std::move(*it);
        bounces_.erase(it);
        break;
      }
    }
  }
  if (bounce > 0 && r->bounce.empty()) {
    ASSIGN_OR_RETURN(r->bounce, allocate_(static_cast<size_t>(bounce) * 4), "capture");
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::erase_if(running_, [](const auto& x) { return x->finished; });
    running_.push_back(r);
  }
  // Background: waking it at each capture never preempts the owner's thread, which goes on training.
  if (!thread_) thread_ = std::make_unique<ThreadPool>(1, "zrt-capture", [] { ThreadPool::MakeBackground(); });
  (void)thread_->Submit([this, r] { Stream(*r); });
  return job;
}

void Captures::Stream(Running& r) {
  Status s;
  for (size_t i = 0; i < r.slots.size() && s.ok(); ++i) {
    const Slot& sl = r.slots[i];
    for (int64_t off = 0; off < sl.elements && s.ok(); off += part_) {
      const int64_t n = std::min(part_, sl.elements - off);
      for (int k = 0; k < sl.kinds && s.ok(); ++k) {
        if (sl.read_stored) {  // a compact kind as kept
          Result<std::optional<StoredPart>> st = sl.read_stored(k, off, n);
          if (!st.ok()) {
            s = st.status();
            break;
          }
          if (*st) {
            const StoredPart& f = **st;
            s = r.job->PutStored(sl.group, k, off, n, f.format, f.values, f.scales);
            continue;
          }
        }
        Result<const float*> p = sl.read(k, off, n, r.bounce.as<float>());
        s = p.ok() ? r.job->Put(sl.group, k, off, n, *p) : p.status();
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        r.progress = r.base[i] + off + n;
      }
      cv_.notify_all();
    }
  }
  r.job->Done(s);  // before `finished`: whoever waits for the capture finds its sink closed (if this was its last part)
  {
    std::lock_guard<std::mutex> lock(mu_);
    r.finished = true;
    if (!r.bounce.empty()) bounces_.push_back(std::move(r.bounce));
  }
  cv_.notify_all();
}

double Captures::WaitPast(int group, int64_t end) {
  double waited = 0;
  std::unique_lock<std::mutex> lock(mu_);
  for (const std::shared_ptr<Running>& r : running_) {
    size_t i = 0;
    while (i < r->slots.size() && r->slots[i].group != group) ++i;
    if (i == r->slots.size() || r->finished || r->progress >= r->base[i] + end) continue;
    const double t0 = SteadySeconds();
    cv_.wait(lock, [&] { return r->finished || r->progress >= r->base[i] + end; });
    const double dt = SteadySeconds() - t0;
    waited += dt;
    r->job->Waited(dt);
  }
  return waited;
}

double Captures::WaitAll() {
  double waited = 0;
  std::unique_lock<std::mutex> lock(mu_);
  for (const std::shared_ptr<Running>& r : running_) {
    if (r->finished) continue;
    const double t0 = SteadySeconds();
    cv_.wait(lock, [&] { return r->finished; });
    const double dt = SteadySeconds() - t0;
    waited += dt;
    r->job->Waited(dt);
  }
  running_.clear();
  return waited;
}

bool Captures::active() const {
  std::lock_guard<std::mutex> lock(mu_);
  return std::any_of(running_.begin(), running_.end(), [](const auto& r) { return !r->finished; });
}

}  // namespace zrt::internal
