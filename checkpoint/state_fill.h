// Filling a StateBuffer (one rank's shard of one state kind) from somewhere else: the checkpoint
// loader and the safetensors loader.
#pragma once

#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "zrt/core/state_view.h"

namespace zrt::ckpt {

// Buffer `buffer` of view group `group`: resident state is filled in place (one window, the view
// settled first by the caller); other state (device memory, NVMe, a cast) through a bounded bounce
// buffer written back window by window (StateView::Write). `fill(w0, w1, base)` writes elements
// [w0, w1) of the shard at `base` (element w0), which arrives zeroed: what it leaves alone (padding,
// missing kinds) stays zero.
inline Status FillStateBuffer(const StateView& view, int group, int buffer,
                              const std::function<Status(int64_t w0, int64_t w1, float* base)>& fill) {
  constexpr int64_t kWindow = int64_t{1} << 22;
  const StateBuffer& b = view.groups[static_cast<size_t>(group)].buffers[static_cast<size_t>(buffer)];
  const int64_t window = b.resident() ? std::max<int64_t>(b.count, 1) : kWindow;
  std::vector<float> bounce(b.resident() ? 0 : static_cast<size_t>(std::min(window, b.count)));
  for (int64_t w0 = 0; w0 < b.count; w0 += window) {
    const int64_t w1 = std::min(b.count, w0 + window);
    float* base = b.resident() ? static_cast<float*>(b.data) + w0 : bounce.data();
    std::memset(base, 0, static_cast<size_t>(w1 - w0) * 4);
    RETURN_IF_ERROR(fill(w0, w1, base));
    if (!b.resident()) {
      RETURN_IF_ERROR(view.Write(group, buffer, w0, w1 - w0, base), "loading ", b.kind, " of group '", view.groups[static_cast<size_t>(group)].name, "'");
    }
  }
  return Status();
}

}  // namespace zrt::ckpt
