#include "zrt/core/caching_allocator.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace zrt {
namespace {

// Host memory with a capacity, counting calls: the policy is the same whatever the backend.
struct FakeBackend {
  size_t capacity = size_t{1} << 40, used = 0;
  int allocs = 0, frees = 0;
  CachingAllocator::Backend Make() {
    return {[this](size_t n) -> Result<void*> {
              if (used + n > capacity) return OutOfMemoryError("fake backend: ", used, " + ", n, " > ", capacity);
              used += n;
              ++allocs;
              return std::malloc(n);
            },
            [this](void* p, size_t n) {
              used -= n;
              ++frees;
              std::free(p);
            }};
  }
};

TEST(CachingAllocatorTest, RoundsToSizeClasses) {
  EXPECT_EQ(CachingAllocator::RoundSize(0), 512u);
  EXPECT_EQ(CachingAllocator::RoundSize(1), 512u);
  EXPECT_EQ(CachingAllocator::RoundSize(513), 1024u);
  EXPECT_EQ(CachingAllocator::RoundSize(1 << 20), size_t{1} << 20);
  EXPECT_EQ(CachingAllocator::RoundSize((1 << 20) + 1), size_t{2} << 20);
  EXPECT_EQ(CachingAllocator::RoundSize((5 << 20) + 7), size_t{6} << 20);
}

TEST(CachingAllocatorTest, ReusesFreedBlocksWithoutCallingTheBackend) {
  FakeBackend fb;
  {
    CachingAllocator a(fb.Make());
    auto p = a.Allocate(1000);
    ASSERT_TRUE(p.ok());
    a.Free(*p);
    auto q = a.Allocate(900);  // same class: the cached block
    ASSERT_TRUE(q.ok());
    EXPECT_EQ(*q, *p);
    EXPECT_EQ(fb.allocs, 1);
    auto r = a.Allocate(100);  // 512 B class; the only free block is none (q is live)
    ASSERT_TRUE(r.ok());
    a.Free(*q);
    a.Free(*r);
    auto big = a.Allocate(4096);  // cached blocks are 1024 and 512: too small
    ASSERT_TRUE(big.ok());
    a.Free(*big);
    auto small = a.Allocate(512);  // 4096 is more than twice 512: take the exact 512 block instead
    ASSERT_TRUE(small.ok());
    EXPECT_EQ(*small, *r);
    const auto s = a.stats();
    EXPECT_EQ(s.live_bytes, 512);
    EXPECT_EQ(s.cached_bytes, 1024 + 4096);
    EXPECT_EQ(s.backend_allocs, 3);
    EXPECT_EQ(s.hits, 2);
    a.Free(*small);
    a.EmptyCache();
    EXPECT_EQ(fb.frees, 3);
    EXPECT_EQ(fb.used, 0u);
  }
}

TEST(CachingAllocatorTest, OutOfMemoryEmptiesTheCacheAndRetriesOnce) {
  FakeBackend fb;
  fb.capacity = size_t{4} << 20;
  CachingAllocator a(fb.Make());
  auto p = a.Allocate(size_t{2} << 20);
  ASSERT_TRUE(p.ok());
  a.Free(*p);                                 // 2 MiB cached
  auto q = a.Allocate(size_t{3} << 20);       // 4 MiB class: needs the cached 2 MiB back
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(a.stats().cached_bytes, 0);
  auto r = a.Allocate(1 << 20);                // nothing cached, nothing left: the backend's error
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kOutOfMemory);
  a.Free(*q);
}

}  // namespace
}  // namespace zrt
