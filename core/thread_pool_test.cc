#include "zrt/core/thread_pool.h"

#include <gtest/gtest.h>
#include <sched.h>

#include <cstdlib>
#include <thread>

#include <algorithm>
#include <atomic>
#include <vector>

namespace zrt {
namespace {

// The optimizer's default thread count: this rank's affinity, shared with the node's other ranks.
TEST(ThreadPool, CoresPerRankIsThisRanksShareOfItsCores) {
  const char* saved = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  const std::string restore = saved ? saved : "";
  const int online = ThreadPool::HardwareThreads();
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(::sched_getaffinity(0, sizeof(set), &set), 0);
  const int mine = std::min(CPU_COUNT(&set), online);
  auto with_ranks = [&](int ranks) {
    ::setenv("OMPI_COMM_WORLD_LOCAL_SIZE", std::to_string(ranks).c_str(), 1);
    return ThreadPool::CoresPerRank();
  };
  EXPECT_EQ(ThreadPool::LauncherRanksPerNode(), (::setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "3", 1), 3));
  if (mine == online) {  // unbound: the machine divided among the ranks
    EXPECT_EQ(with_ranks(1), online);
    EXPECT_EQ(with_ranks(2), std::max(1, online / 2));
    EXPECT_EQ(with_ranks(4 * online), 1);  // oversubscribed: one each, never zero
  }
  // Bound to one core (Open MPI's default for 1 or 2 ranks): one thread, whatever the node's ranks.
  int bound = 0;
  std::thread([&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &set)) {
        CPU_SET(c, &one);
        break;
      }
    }
    if (::sched_setaffinity(0, sizeof(one), &one) == 0) bound = with_ranks(online);
  }).join();
  EXPECT_EQ(bound, 1);
  if (saved) {
    ::setenv("OMPI_COMM_WORLD_LOCAL_SIZE", restore.c_str(), 1);
  } else {
    ::unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  }
}

// Background threads (capture, checkpoint writer, tier) are SCHED_BATCH: waking one never preempts
// the training thread. Only the calling thread changes.
TEST(ThreadPool, MakeBackgroundMarksOnlyTheCallingThread) {
  int inside = -1;
  std::thread([&] {
    ThreadPool::MakeBackground();
    inside = ::sched_getscheduler(0);
  }).join();
  EXPECT_EQ(inside, SCHED_BATCH);
  EXPECT_EQ(::sched_getscheduler(0), SCHED_OTHER);
  int worker = -1;
  ThreadPool pool(1, "bg", [] { ThreadPool::MakeBackground(); });
  pool.Submit([&] { worker = ::sched_getscheduler(0); }).get();
  EXPECT_EQ(worker, SCHED_BATCH);
}

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
