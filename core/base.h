// Two helpers every module needs and none should write again: rounding up to an alignment, and a
// steady clock in seconds (for durations and stall accounting). Internal: not installed.
#pragma once

#include <chrono>
#include <cstdint>

namespace zrt {

// x rounded up to a multiple of `alignment` (> 0).
constexpr int64_t AlignUp(int64_t x, int64_t alignment) { return (x + alignment - 1) / alignment * alignment; }

// Seconds on the steady clock (an arbitrary epoch: differences only).
inline double SteadySeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace zrt
