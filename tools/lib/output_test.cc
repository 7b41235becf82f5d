#include "tools/lib/output.h"

#include <cerrno>
#include <csignal>
#include <fcntl.h>
#include <ostream>
#include <string>
#include <thread>

#include <gtest/gtest.h>
#include <unistd.h>

namespace zrt::tools {
namespace {

// SIGPIPE ignored for the test's lifetime, as zrt's main does.
class OutputTest : public ::testing::Test {
 protected:
  void SetUp() override { previous_ = std::signal(SIGPIPE, SIG_IGN); }
  void TearDown() override { std::signal(SIGPIPE, previous_); }
  void (*previous_)(int) = SIG_DFL;
};

TEST_F(OutputTest, WritesEverythingThroughAPipeReadConcurrently) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  std::string got;
  std::thread reader([&] {
    char buf[1000];  // small reads: the writer sees partial progress and a full pipe
    for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) got.append(buf, static_cast<size_t>(n));
  });
  std::string want;
  {
    FdOutput out(fds[1], 4096);
    std::ostream os(&out);
    for (int i = 0; i < 50000; ++i) {
      os << "line " << i << "\n";
      want += "line " + std::to_string(i) + "\n";
    }
    EXPECT_TRUE(os.good());
    EXPECT_EQ(FinishOutput(out, 0), 0);
    EXPECT_EQ(out.error(), 0);
  }
  ::close(fds[1]);
  reader.join();
  ::close(fds[0]);
  EXPECT_EQ(got, want);
}

TEST_F(OutputTest, AClosedPipeEndsTheOutputQuietlyWith141) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  ::close(fds[0]);  // the reader is gone before the first byte
  FdOutput out(fds[1], 256);
  std::ostream os(&out);
  for (int i = 0; i < 10000; ++i) os << "more output than the buffer holds " << i << "\n";  // no SIGPIPE, no throw
  EXPECT_FALSE(os.good());  // the command's further `<<` are no-ops
  EXPECT_EQ(out.error(), EPIPE);
  EXPECT_EQ(FinishOutput(out, 0), 141);
  EXPECT_EQ(FinishOutput(out, 1), 1) << "a command's own failure wins over a cut output";
  ::close(fds[1]);
}

TEST_F(OutputTest, AClosedPipeIsSeenAtTheFinalFlushToo) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  ::close(fds[0]);
  FdOutput out(fds[1]);
  std::ostream os(&out);
  os << "one short line\n";  // stays in the buffer until FinishOutput flushes it
  EXPECT_TRUE(os.good());
  EXPECT_EQ(FinishOutput(out, 0), 141);
  ::close(fds[1]);
}

TEST_F(OutputTest, AFullDiskIsAnErrorNotAQuietEnd) {
  const int fd = ::open("/dev/full", O_WRONLY);
  if (fd < 0) GTEST_SKIP() << "no /dev/full here";
  FdOutput out(fd, 64);
  std::ostream os(&out);
  os << std::string(1000, 'x');
  EXPECT_EQ(out.error(), ENOSPC);
  testing::internal::CaptureStderr();
  EXPECT_EQ(FinishOutput(out, 0), 1);
  EXPECT_NE(testing::internal::GetCapturedStderr().find("No space left on device"), std::string::npos);
  ::close(fd);
}

}  // namespace
}  // namespace zrt::tools
