// For tools that stream a checkpoint one group at a time (inspect --stats, diff, export, reshard).
#pragma once

#include <string>
#include <vector>

#include "zrt/checkpoint/format.h"
#include "zrt/core/state_view.h"

namespace zrt::ckpt {

// Group g of a checkpoint described for a layout of `shards` ranks (tensors and layout; no buffers).
Result<StateGroup> GroupForShards(const Manifest& m, int group, int shards);

// Group g loaded whole (a one-shard view), one fp32 buffer per kind: tools that stream a checkpoint
// one group at a time (inspect --stats, diff, export).
struct WholeGroup {
  StateView view;                        // one group; its layout gives each tensor's offset
  std::vector<std::vector<float>> data;  // per kind, in `kinds` order
};
Result<WholeGroup> LoadWholeGroup(const std::string& dir, const Manifest& m, int group, const std::vector<std::string>& kinds);

}  // namespace zrt::ckpt
