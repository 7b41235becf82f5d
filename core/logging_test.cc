#include "zrt/core/logging.h"

#include <gtest/gtest.h>

namespace zrt {
namespace {

TEST(Logging, LevelsParseAndFilter) {
  LogLevel l;
  ASSERT_TRUE(ParseLogLevel("DEBUG", &l));
  EXPECT_EQ(l, LogLevel::kDebug);
  ASSERT_TRUE(ParseLogLevel("warning", &l));
  EXPECT_EQ(l, LogLevel::kWarn);
  EXPECT_FALSE(ParseLogLevel("loud", &l));
  SetLogLevel(LogLevel::kWarn);
  EXPECT_TRUE(LogEnabled(LogLevel::kError));
  EXPECT_FALSE(LogEnabled(LogLevel::kInfo));
  int evaluated = 0;
  ZRT_LOG(kDebug) << (++evaluated);  // disabled: the stream expression is not evaluated
  EXPECT_EQ(evaluated, 0);
}

TEST(Logging, LineHasRankLevelAndLocation) {
  SetLogLevel(LogLevel::kInfo);
  SetLogRank(3);
  ::testing::internal::CaptureStderr();
  ZRT_LOG(kInfo) << "hello " << 42;
  const std::string out = ::testing::internal::GetCapturedStderr();
  SetLogRank(-1);
  EXPECT_NE(out.find("[zrt r3 I logging_test.cc:"), std::string::npos) << out;
  EXPECT_NE(out.find("] hello 42\n"), std::string::npos) << out;
}

}  // namespace
}  // namespace zrt
