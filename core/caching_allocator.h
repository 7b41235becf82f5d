// CachingAllocator: keeps freed blocks for reuse so a training step never calls the backend's
// allocator (cudaMalloc/cudaFree synchronise the device and cost far more than the work between them).
//
// Sizes are rounded to classes (multiples of 512 B up to 1 MiB, of 2 MiB above) and a request takes
// the smallest free block of at least its class, if that block is not more than twice as large
// (splitting is not done: blocks keep their size). A miss allocates from the backend; when the
// backend is out of memory, every cached block is returned to it and the allocation retried once.
// The backend is two functions, so the policy is tested on host memory and used for CUDA.
//
// Thread-safe: one mutex, held also while calling the backend (misses are rare by design).
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <mutex>
#include <unordered_map>

#include "zrt/core/device.h"
#include "zrt/core/status.h"

namespace zrt {

class CachingAllocator {
 public:
  struct Backend {
    std::function<Result<void*>(size_t bytes)> allocate;  // OutOfMemory when exhausted
    std::function<void(void* p, size_t bytes)> free;
  };
  using Stats = AllocatorStats;  // device.h

  explicit CachingAllocator(Backend backend) : backend_(std::move(backend)) {}
  ~CachingAllocator();  // returns every cached block; live blocks are the owners' (a leak is logged)
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  Result<void*> Allocate(size_t bytes);
  void Free(void* p);
  // Returns every cached (free) block to the backend.
  void EmptyCache();
  Stats stats() const;
  static size_t RoundSize(size_t bytes);

 private:
  void EmptyCacheLocked();
  Backend backend_;
  mutable std::mutex mu_;
  std::multimap<size_t, void*> free_;          // by size
  std::unordered_map<void*, size_t> sizes_;    // every block this allocator holds, live or free
  Stats stats_;
};

}  // namespace zrt
