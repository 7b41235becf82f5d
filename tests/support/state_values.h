// Every buffer of a StateView as it is now, read from wherever it lives (host memory directly; device
// memory and NVMe swap files through the buffer's read). For tests that compare states.
#pragma once

#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "zrt/core/state_view.h"

namespace zrt::testing {

inline std::vector<std::vector<float>> ReadState(const StateView& view) {
  std::vector<std::vector<float>> out;
  for (const StateGroup& g : view.groups) {
    for (const StateBuffer& b : g.buffers) {
      std::vector<float>& v = out.emplace_back(static_cast<size_t>(b.count));
      if (b.data != nullptr) {
        std::memcpy(v.data(), b.data, v.size() * 4);
      } else if (b.count > 0) {
        EXPECT_TRUE(b.read(0, b.count, v.data()).ok()) << "reading " << g.name << " " << b.kind;
      }
    }
  }
  return out;
}

}  // namespace zrt::testing
