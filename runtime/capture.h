// Captures of the optimizer store's state in progress (StateOwner::Capture; core/state_view.h): the
// one mechanism every snapshot goes through, whoever receives it (the disk writer, the memory tier).
//
// A capture is a Job: its sink, behind a mutex (two producers may feed it: this thread and the
// store's step), and the count of producers still to finish (the last closes the sink). Parts that
// are memory (host memory, device memory copied on the snapshot stream, frozen parameters cast to
// f32) are streamed by the capture thread, window by window (`part` elements of every kind of a slot,
// then the next window), slot by slot in the order the store gives (the slots its step changes
// first); after each window the job's progress moves on. The store's next change of a window waits
// for every job to have passed it (WaitPast), so training waits only for the part it is about to
// change that is not copied yet, and each job's sink is told what it cost (StateSink::Waited). Parts
// on NVMe are put by the store itself as its step streams them (Job::Put, then Job::Done).
//
// Internal to zrt_runtime. Thread-safety: Start, WaitPast and WaitAll on the owner's thread; the
// capture thread is internal.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "zrt/core/device.h"
#include "zrt/core/state_view.h"
#include "zrt/core/thread_pool.h"

namespace zrt::internal {

class CaptureJob {
 public:
  CaptureJob(std::shared_ptr<StateSink> sink, int producers) : sink_(std::move(sink)), producers_(producers) {}
  // The sink's Put, one producer at a time; after the first error nothing more is put.
  Status Put(int group, int buffer, int64_t offset, int64_t n, const float* data);
  Status PutStored(int group, int buffer, int64_t offset, int64_t n, const StateFormat& format, const void* values,
                   const float* scales);
  void Waited(double seconds);
  // A producer finished (`status`: its outcome); the last one closes the sink with the first error
  // and lets it go (its receiver decides how long it lives from then on).
  void Done(const Status& status);
  bool failed() const;
  bool closed() const;

 private:
  mutable std::mutex mu_;
  std::shared_ptr<StateSink> sink_;
  int producers_;
  Status status_;
  bool closed_ = false;
};

class Captures {
 public:
  // One slot as the capture thread streams it: `kinds` buffers of `elements` each; read(kind, offset,
  // n, bounce) returns where those elements are now (host memory, or the capture's `bounce` buffer
  // of `part` elements, filled from device memory or a cast; null when the capture asked for none).
  struct Slot {
    int group = 0;  // the view's group index
    int64_t elements = 0;
    int kinds = 0;
    bool bounces = false;  // read() needs the bounce buffer
    std::function<Result<const float*>(int kind, int64_t offset, int64_t n, float* bounce)> read;
    // Set for a compact slot whose kinds the thread may stream as stored: where kind k's part is kept
    // (codes or bf16 values and q8 scales), or nullopt to stream it through `read` as f32 values.
    std::function<Result<std::optional<StoredPart>>(int kind, int64_t offset, int64_t n)> read_stored;
  };
  // `allocate(bytes)`: host memory for bounce buffers (pinned where the store has it); they are kept
  // for the next captures.
  Captures(int64_t part, std::function<Result<DeviceBuffer>(size_t bytes)> allocate) : part_(part), allocate_(std::move(allocate)) {}
  ~Captures();  // the thread finishes its jobs first

  int64_t part() const { return part_; }
  // A capture whose memory parts are `slots` (streamed by the thread, in this order) and that has
  // `other_producers` more (the store's NVMe delivery). Returns the job for those producers.
  Result<std::shared_ptr<CaptureJob>> Start(std::shared_ptr<StateSink> sink, std::vector<Slot> slots, int other_producers);
  // Before the owner changes elements [0, end) of view group `group`: waits until every capture whose
  // thread streams that group has put them. Returns the seconds waited.
  double WaitPast(int group, int64_t end);
  // Every capture's thread part finished. Returns the seconds waited.
  double WaitAll();
  // Whether a capture's thread part is still running (the store then updates window by window).
  bool active() const;

 private:
  struct Running;
  void Stream(Running& r);

  const int64_t part_;
  const std::function<Result<DeviceBuffer>(size_t bytes)> allocate_;
  mutable std::mutex mu_;
  std::vector<DeviceBuffer> bounces_;  // free bounce buffers
  std::condition_variable cv_;
  std::vector<std::shared_ptr<Running>> running_;
  std::unique_ptr<ThreadPool> thread_;  // last: joined before the rest goes
};

}  // namespace zrt::internal
