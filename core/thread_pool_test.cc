#include "zrt/core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

namespace zrt {
namespace {

TEST(ThreadPool, ParallelForVisitsEveryIndexOnce) {
  for (int workers : {0, 1, 3}) {
    ThreadPool pool(workers, "test");
    for (int64_t n : {0, 1, 2, 7, 1000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      pool.ParallelFor(n, [&](int64_t i) { hits[static_cast<size_t>(i)].fetch_add(1); });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << workers << " " << n;
    }
  }
}

TEST(ThreadPool, MaxParallelismOneRunsOnCaller) {
  ThreadPool pool(3);
  const auto me = std::this_thread::get_id();
  std::atomic<int> elsewhere{0};
  pool.ParallelFor(100, [&](int64_t) { elsewhere += std::this_thread::get_id() != me; }, 1);
  EXPECT_EQ(elsewhere.load(), 0);
}

TEST(ThreadPool, NestedParallelForDoesNotDeadlock) {
  ThreadPool pool(2);
  std::atomic<int> total{0};
  pool.ParallelFor(8, [&](int64_t) { pool.ParallelFor(8, [&](int64_t) { total++; }); });
  EXPECT_EQ(total.load(), 64);
}

TEST(ThreadPool, SubmitReturnsFutures) {
  ThreadPool pool(2);
  auto a = pool.Submit([] { return 40; });
  auto b = pool.Submit([] { return 2; });
  EXPECT_EQ(a.get() + b.get(), 42);
  ThreadPool inline_pool(0);
  EXPECT_EQ(inline_pool.Submit([] { return 5; }).get(), 5);
}

TEST(ThreadPool, DestructorDrainsQueuedTasks) {
  std::atomic<int> ran{0};
  {
    ThreadPool pool(1);
    for (int i = 0; i < 50; ++i) (void)pool.Submit([&] { ran++; });
  }
  EXPECT_EQ(ran.load(), 50);
}

}  // namespace
}  // namespace zrt
