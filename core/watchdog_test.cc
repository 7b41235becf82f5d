#include "zrt/core/watchdog.h"

#include <gtest/gtest.h>

#include <atomic>

namespace zrt {
namespace {

using namespace std::chrono_literals;

Watchdog::Options Fast(std::atomic<int>* aborts) {
  Watchdog::Options o;
  o.timeout = 200ms;
  o.interval = 5ms;
  o.name = "test communicator (rank 0 of 2)";
  o.abort = [aborts] { ++*aborts; };
  return o;
}

// The abort runs after the error is set (outside the lock): wait for it, at most 5 s.
int Aborts(const std::atomic<int>& aborts) {
  for (int i = 0; i < 1000 && aborts.load() == 0; ++i) std::this_thread::sleep_for(5ms);
  return aborts.load();
}

// Polls until the watchdog settled (an error, or nothing pending), at most 5 s.
void Settle(const Watchdog& w) {
  for (int i = 0; i < 1000 && w.error().ok() && w.pending() > 0; ++i) std::this_thread::sleep_for(5ms);
}

TEST(Watchdog, FinishedOperationsLeaveNoError) {
  std::atomic<int> aborts{0};
  auto o = Fast(&aborts);
  o.timeout = 1s;  // generous: a loaded machine may starve the watchdog thread for a while
  Watchdog w(o);
  std::atomic<int> polls{0};
  for (int i = 0; i < 3; ++i) w.Track("all_reduce #" + std::to_string(i), [&polls]() -> Result<bool> { return ++polls > 2; });
  Settle(w);
  EXPECT_EQ(w.pending(), 0u);
  EXPECT_TRUE(w.error().ok()) << w.error();
  std::this_thread::sleep_for(1200ms);  // past the timeout: nothing pending, nothing fails
  EXPECT_TRUE(w.error().ok()) << w.error();
  EXPECT_EQ(aborts.load(), 0);
}

TEST(Watchdog, AHungOperationTimesOutAbortsOnceAndNamesIt) {
  std::atomic<int> aborts{0};
  Watchdog w(Fast(&aborts));
  w.Track("reduce_scatter #7 (4096 x bf16)", []() -> Result<bool> { return false; });
  w.Track("all_gather #8", []() -> Result<bool> { return false; });
  Settle(w);
  const Status s = w.error();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("reduce_scatter #7 (4096 x bf16)"), std::string::npos) << s;
  EXPECT_NE(s.message().find("test communicator (rank 0 of 2)"), std::string::npos) << s;
  EXPECT_NE(s.message().find("timeout 0.2 s"), std::string::npos) << s;
  EXPECT_EQ(Aborts(aborts), 1);
  EXPECT_EQ(w.pending(), 0u);
  // Sticky: later operations are not watched into a second abort.
  w.Track("broadcast", []() -> Result<bool> { return false; });
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(aborts.load(), 1);
  EXPECT_EQ(w.error().message(), s.message());
}

TEST(Watchdog, AsynchronousErrorsAbort) {
  std::atomic<int> aborts{0};
  auto o = Fast(&aborts);
  o.timeout = std::chrono::hours(1);
  std::atomic<bool> broken{false};
  o.check = [&broken]() -> Status {
    return broken ? Status(StatusCode::kUnavailable, "remote rank 1 closed the connection") : Status();
  };
  Watchdog w(o);
  w.Track("all_reduce", []() -> Result<bool> { return false; });
  std::this_thread::sleep_for(50ms);
  EXPECT_TRUE(w.error().ok());
  broken = true;
  Settle(w);
  ASSERT_FALSE(w.error().ok());
  EXPECT_NE(w.error().message().find("remote rank 1 closed the connection"), std::string::npos) << w.error();
  EXPECT_EQ(Aborts(aborts), 1);
}

TEST(Watchdog, AFailingProbeAborts) {
  std::atomic<int> aborts{0};
  Watchdog w(Fast(&aborts));
  w.Track("all_gather #3", []() -> Result<bool> { return Status(StatusCode::kInternal, "an illegal memory access"); });
  Settle(w);
  ASSERT_FALSE(w.error().ok());
  EXPECT_NE(w.error().message().find("all_gather #3 failed"), std::string::npos) << w.error();
  EXPECT_EQ(Aborts(aborts), 1);
}

}  // namespace
}  // namespace zrt
