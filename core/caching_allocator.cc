#include "zrt/core/caching_allocator.h"

#include "zrt/core/logging.h"

namespace zrt {

size_t CachingAllocator::RoundSize(size_t bytes) {
  constexpr size_t kSmall = 512, kLarge = size_t{2} << 20, kSmallLimit = size_t{1} << 20;
  if (bytes == 0) bytes = 1;
  if (bytes <= kSmallLimit) return (bytes + kSmall - 1) / kSmall * kSmall;
  return (bytes + kLarge - 1) / kLarge * kLarge;
}

CachingAllocator::~CachingAllocator() {
  std::lock_guard<std::mutex> lock(mu_);
  EmptyCacheLocked();
  if (!sizes_.empty()) {
    ZRT_LOG(kWarn) << "caching allocator destroyed with " << sizes_.size() << " live block(s) (" << stats_.live_bytes << " bytes)";
  }
}

Result<void*> CachingAllocator::Allocate(size_t bytes) {
  const size_t size = RoundSize(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = free_.lower_bound(size);
  if (it != free_.end() && it->first <= 2 * size) {
    void* p = it->second;
    stats_.cached_bytes -= static_cast<int64_t>(it->first);
    stats_.live_bytes += static_cast<int64_t>(it->first);
    ++stats_.hits;
    free_.erase(it);
    return p;
  }
  auto r = backend_.allocate(size);
  if (!r.ok() && r.status().code() == StatusCode::kOutOfMemory && !free_.empty()) {
    EmptyCacheLocked();  // the cache may hold what is missing
    r = backend_.allocate(size);
  }
  if (!r.ok()) return r.status();
  sizes_[*r] = size;
  stats_.live_bytes += static_cast<int64_t>(size);
  ++stats_.backend_allocs;
  return *r;
}

void CachingAllocator::Free(void* p) {
  if (p == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sizes_.find(p);
  if (it == sizes_.end()) {
    ZRT_LOG(kError) << "caching allocator: free of a pointer it did not allocate";
    return;
  }
  free_.emplace(it->second, p);
  stats_.live_bytes -= static_cast<int64_t>(it->second);
  stats_.cached_bytes += static_cast<int64_t>(it->second);
}

void CachingAllocator::EmptyCache() {
  std::lock_guard<std::mutex> lock(mu_);
  EmptyCacheLocked();
}

void CachingAllocator::EmptyCacheLocked() {
  for (const auto& [size, p] : free_) {
    backend_.free(p, size);
    sizes_.erase(p);
  }
  free_.clear();
  stats_.cached_bytes = 0;
}

CachingAllocator::Stats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace zrt
