// Every buffer of a StateView as it is now, read from wherever it lives (host memory directly; device
// memory, NVMe swap files and frozen parameters through the view's owner). For tests that compare states.
#pragma once

#include <vector>

#include <gtest/gtest.h>

#include "zrt/core/state_view.h"

namespace zrt::testing {

inline std::vector<std::vector<float>> ReadState(const StateView& view) {
  std::vector<std::vector<float>> out;
  for (size_t g = 0; g < view.groups.size(); ++g) {
    for (size_t b = 0; b < view.groups[g].buffers.size(); ++b) {
      const StateBuffer& buf = view.groups[g].buffers[b];
      std::vector<float>& v = out.emplace_back(static_cast<size_t>(buf.count));
      Status s = view.Read(static_cast<int>(g), static_cast<int>(b), 0, buf.count, v.data());
      EXPECT_TRUE(s.ok()) << "reading " << view.groups[g].name << " " << buf.kind << ": " << s;
    }
  }
  return out;
}

}  // namespace zrt::testing
