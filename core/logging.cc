#include "zrt/core/logging.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <string>

namespace zrt {
namespace {

int InitialLevel() {
  LogLevel level = LogLevel::kInfo;
  if (const char* env = std::getenv("ZRT_LOG_LEVEL"); env != nullptr && !ParseLogLevel(env, &level)) {
    static constexpr char kMsg[] = "[zrt] ignoring unknown ZRT_LOG_LEVEL (expected error|warn|info|debug|trace)\n";
    (void)!write(STDERR_FILENO, kMsg, sizeof(kMsg) - 1);
  }
  return static_cast<int>(level);
}

std::atomic<int>& LevelVar() {
  static std::atomic<int> level{InitialLevel()};
  return level;
}
std::atomic<int> g_rank{-1};

}  // namespace

bool LogEnabled(LogLevel level) { return static_cast<int>(level) <= LevelVar().load(std::memory_order_relaxed); }
void SetLogLevel(LogLevel level) { LevelVar().store(static_cast<int>(level), std::memory_order_relaxed); }
void SetLogRank(int rank) { g_rank.store(rank, std::memory_order_relaxed); }

bool ParseLogLevel(std::string_view text, LogLevel* out) {
  std::string t(text);
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return std::tolower(c); });
  static constexpr std::pair<const char*, LogLevel> kNames[] = {
      {"error", LogLevel::kError}, {"warn", LogLevel::kWarn},   {"warning", LogLevel::kWarn},
      {"info", LogLevel::kInfo},   {"debug", LogLevel::kDebug}, {"trace", LogLevel::kTrace}};
  for (const auto& [name, level] : kNames) {
    if (t == name) {
      *out = level;
      return true;
    }
  }
  return false;
}

namespace internal {

LogMessage::LogMessage(LogLevel level, const char* file, int line) {
  static constexpr char kLetters[] = "EWIDT";
  const char* base = std::strrchr(file, '/');
  os_ << "[zrt ";
  if (const int rank = g_rank.load(std::memory_order_relaxed); rank >= 0) os_ << 'r' << rank << ' ';
  os_ << kLetters[static_cast<int>(level)] << ' ' << (base ? base + 1 : file) << ':' << line << "] ";
}

LogMessage::~LogMessage() {
  os_ << '\n';
  const std::string s = std::move(os_).str();
  (void)!write(STDERR_FILENO, s.data(), s.size());  // one write: lines from ranks/threads stay whole
}

}  // namespace internal
}  // namespace zrt
