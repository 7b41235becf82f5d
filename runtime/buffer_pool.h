// BufferPool: reusable device buffers for transient working memory (stage-3 gathered parameters,
// stage-2/3 full gradients). Buffers are allocated once and reused: touching fresh pages costs more
// than the work done on them (../shared/DESIGN.md). A released buffer goes back to a free list; an
// acquire takes the smallest free buffer that fits, else allocates.
//
// Accounting: every pooled buffer counts in the device's MemoryTracker under the pool's category,
// live or free. Not thread-safe.
#pragma once

#include <vector>

#include "zrt/core/device.h"

namespace zrt {

class BufferPool {
 public:
  BufferPool(Device* device, MemCategory category) : device_(device), category_(category) {}
  // A buffer of at least `bytes` (content unspecified).
  Result<DeviceBuffer> Acquire(size_t bytes);
  void Release(DeviceBuffer buffer);
  size_t free_buffers() const { return free_.size(); }

 private:
  Device* device_;
  MemCategory category_;
  std::vector<DeviceBuffer> free_;
};

}  // namespace zrt
