#include "zrt/runtime/buffer_pool.h"

namespace zrt {

Result<DeviceBuffer> BufferPool::Acquire(size_t bytes) {
  auto best = free_.end();
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->size() >= bytes && (best == free_.end() || it->size() < best->size())) best = it;
  }
  if (best != free_.end()) {
    DeviceBuffer b = std::move(*best);
    free_.erase(best);
    return b;
  }
  return device_->Allocate(bytes, category_, 4096);
}

void BufferPool::Release(DeviceBuffer buffer) {
  if (!buffer.empty()) free_.push_back(std::move(buffer));
}

}  // namespace zrt
