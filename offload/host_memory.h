// HostMemory: the host buffers offload streams through — page-aligned (O_DIRECT-ready), pinned
// (cudaHostRegister) when zrt is built with CUDA and a GPU is present, and bounded: an allocation that
// would take the total past the budget fails with an error naming the budget's setting instead of
// growing. It is a Device, so every byte is accounted in its MemoryTracker by category and buffers
// are ordinary DeviceBuffers; users allocate their buffers once and reuse them (the swapper keeps its
// buffer sets for the engine's lifetime).
//
// Thread-safety: as Device (Allocate/free and accounting are thread-safe).
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "zrt/core/device.h"

namespace zrt {

class HostMemory final : public Device {
 public:
  // budget_bytes: the most this allocator holds at once (0: unbounded). `setting` names the knob that
  // sets it, for errors ("offload.host_budget_bytes").
  static std::unique_ptr<HostMemory> Create(int64_t budget_bytes, std::string setting);
  ~HostMemory() override = default;

  DeviceKind kind() const override { return DeviceKind::kCpu; }
  std::string name() const override { return pinned_ ? "host (pinned)" : "host"; }
  Status Copy(void* dst, const void* src, size_t bytes) override;
  Status Fill(void* dst, uint8_t byte, size_t bytes) override;

  bool pinned() const { return pinned_; }
  int64_t budget() const { return budget_; }
  const std::string& setting() const { return setting_; }
  int64_t used() const { return used_.load(std::memory_order_relaxed); }
  // Whether `bytes` more would fit the budget now.
  bool Fits(int64_t bytes) const { return budget_ == 0 || used() + bytes <= budget_; }

 protected:
  Result<void*> RawAllocate(size_t bytes, size_t alignment) override;
  void RawFree(void* p, size_t bytes) override;

 private:
  HostMemory(int64_t budget, std::string setting, bool pin) : budget_(budget), setting_(std::move(setting)), pinned_(pin) {}
  const int64_t budget_;
  const std::string setting_;
  const bool pinned_;
  std::atomic<int64_t> used_{0};
};

}  // namespace zrt
