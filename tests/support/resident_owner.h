// An owner for a view whose buffers are all host memory (tests without an engine): a capture puts
// every buffer at once on the calling thread (as a view without an owner does), reads and writes are
// copies, and Restore calls `restore` (so a test sees what a resume hands the owner).
#pragma once

#include <functional>
#include <memory>
#include <utility>

#include "zrt/core/state_view.h"

namespace zrt::testing {

class ResidentOwner final : public StateOwner {
 public:
  // `view` (its groups and buffers) must outlive the owner; its own `owner` member is not consulted.
  explicit ResidentOwner(const StateView* view, std::function<Status(const StateCounters&)> restore = {})
      : view_(view), restore_(std::move(restore)) {}
  Status Capture(std::shared_ptr<StateSink> sink) override { return Plain().Capture(std::move(sink)); }
  Status Settle() override { return Status(); }
  Status Read(int group, int buffer, int64_t offset, int64_t n, float* out) override { return Plain().Read(group, buffer, offset, n, out); }
  Status Write(int group, int buffer, int64_t offset, int64_t n, const float* in) override {
    return Plain().Write(group, buffer, offset, n, in);
  }
  Status Restore(const StateCounters& saved) override { return restore_ ? restore_(saved) : Status(); }

 private:
  StateView Plain() const {
    StateView v = *view_;
    v.owner = nullptr;
    return v;
  }
  const StateView* view_;
  std::function<Status(const StateCounters&)> restore_;
};

}  // namespace zrt::testing
