// Logging: levels, a rank prefix, ZRT_LOG_LEVEL (error|warn|info|debug|trace; default info).
//
//   ZRT_LOG(kInfo) << "finalized " << n << " tensors";
//   -> "[zrt r3 I layout.cc:42] finalized 7 tensors" on stderr, one write per line.
//
// The level and rank are the one piece of process-wide state in zrt (set once at start-up; atomics).
#pragma once

#include <sstream>
#include <string>
#include <string_view>

namespace zrt {

enum class LogLevel : int { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3, kTrace = 4 };

bool LogEnabled(LogLevel level);
void SetLogLevel(LogLevel level);
// Parses "error".."trace" (case-insensitive); false when unknown.
bool ParseLogLevel(std::string_view text, LogLevel* out);
// Rank shown in the prefix; negative hides it (before the communicator exists).
void SetLogRank(int rank);

namespace internal {
class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();  // writes the line
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  std::ostream& stream() { return os_; }

 private:
  std::ostringstream os_;
};
// Turns `stream << ...` into a void expression (operator& binds looser than <<), so ZRT_LOG is one
// expression: safe as the body of an unbraced if, and its operands are not evaluated when disabled.
struct LogVoidify {
  void operator&(std::ostream&) {}
};
}  // namespace internal

// The library's version and build configuration, for `zrt --version` and checkpoint manifests.

// "0.1.0"
std::string_view Version();
// "cuda=on nccl=off", what this build of the library can do.
std::string BuildFeatures();

}  // namespace zrt

#define ZRT_LOG(level)                                 \
  !::zrt::LogEnabled(::zrt::LogLevel::level)           \
      ? (void)0                                        \
      : ::zrt::internal::LogVoidify() &                \
            ::zrt::internal::LogMessage(::zrt::LogLevel::level, __FILE__, __LINE__).stream()
