// A synthetic model state for checkpoint tests that need no engine (the checkpoint module works on
// StateView only): groups of tensors whose every element of every state kind is a known function of
// (tensor name, element, kind), laid out for any world size, rank and alignment.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "zrt/core/state_view.h"

namespace zrt::testing {

struct TensorShape {
  std::string name;
  std::vector<int64_t> shape;
};
using GroupShapes = std::vector<std::pair<std::string, std::vector<TensorShape>>>;  // group name -> tensors

// A small model with tensors whose sizes divide by nothing in particular.
inline GroupShapes SmallModel() {
  return {{"embed", {{"wte", {37, 8}}}},
          {"block0", {{"w1", {8, 33}}, {"b1", {33}}, {"w2", {33, 8}}}},
          {"head", {{"bias", {3}}}}};
}

// `salt` tells checkpoints of different steps apart.
inline float StateValue(const std::string& tensor, int64_t i, const std::string& kind, int salt = 0) {
  uint32_t h = 2166136261u;
  for (char c : tensor + "/" + kind) h = (h ^ static_cast<unsigned char>(c)) * 16777619u;
  return static_cast<float>(h % 1000) * 0.001f + static_cast<float>(i) * 0.5f + static_cast<float>(salt) * 1000.0f;
}

inline const std::vector<std::string>& StateKinds() {
  static const std::vector<std::string> kinds = {"master", "exp_avg", "exp_avg_sq"};
  return kinds;
}

// One rank's view of the synthetic state (it owns the buffers); `fill` writes the known values,
// otherwise the buffers hold a poison value.
class SyntheticState {
 public:
  SyntheticState(const GroupShapes& groups, int world, int rank, int64_t alignment, bool fill, int stage = 3, int salt = 0,
                 const std::vector<std::string>& kinds = StateKinds())
      : salt_(salt) {
    view.rank = rank;
    view.world_size = world;
    view.stage = stage;
    view.counters.step = 7;
    view.counters.loss_scale = 1024;
    for (const auto& [name, tensors] : groups) {
      StateGroup g;
      g.name = name;
      g.lr = 1e-3;
      for (const TensorShape& t : tensors) g.tensors.push_back(TensorSpec{t.name, t.shape, DType::kBF16});
      g.layout = *ShardLayout::Create(g.tensors, world, alignment);
      const int r = world == 1 ? 0 : rank;
      for (const std::string& kind : kinds) {
        auto& buf = storage_.emplace_back(static_cast<size_t>(g.layout.shard_size()), fill ? 0.0f : -12345.0f);
        if (fill) {
          for (const ShardPiece& p : g.layout.RankPieces(r)) {
            for (int64_t i = 0; i < p.count; ++i) {
              buf[static_cast<size_t>(p.shard_offset + i)] =
                  StateValue(g.tensors[static_cast<size_t>(p.tensor)].name, p.tensor_offset + i, kind, salt);
            }
          }
        }
        g.buffers.push_back({kind, DType::kF32, buf.data(), g.layout.shard_size()});
      }
      view.groups.push_back(std::move(g));
    }
  }
  SyntheticState(const SyntheticState&) = delete;

  // Every tensor element of every buffer holds its value for `salt` (only `kinds` when given; the
  // others zero); padding is zero.
  void ExpectValues(const std::vector<std::string>& kinds = StateKinds()) const { ExpectValues(salt_, kinds); }
  void ExpectValues(int salt, const std::vector<std::string>& kinds = StateKinds()) const {
    const int r = view.world_size == 1 ? 0 : view.rank;
    for (const StateGroup& g : view.groups) {
      for (const StateBuffer& b : g.buffers) {
        const bool expected = std::find(kinds.begin(), kinds.end(), b.kind) != kinds.end();
        const auto* d = static_cast<const float*>(b.data);
        std::vector<bool> real(static_cast<size_t>(b.count), false);
        for (const ShardPiece& p : g.layout.RankPieces(r)) {
          for (int64_t i = 0; i < p.count; ++i) {
            real[static_cast<size_t>(p.shard_offset + i)] = true;
            const float want = expected ? StateValue(g.tensors[static_cast<size_t>(p.tensor)].name, p.tensor_offset + i, b.kind, salt) : 0.0f;
            ASSERT_EQ(d[p.shard_offset + i], want) << g.name << "/" << b.kind << " rank " << r << " shard element " << p.shard_offset + i;
          }
        }
        for (int64_t i = 0; i < b.count; ++i) {
          if (!real[static_cast<size_t>(i)]) {
            ASSERT_EQ(d[i], 0.0f) << "padding " << g.name << "/" << b.kind << " element " << i;
          }
        }
      }
    }
  }

  StateView view;

  // Whether every element equals the values for `salt` (no gtest failure: for checking which of two
  // checkpoints was loaded).
  bool HoldsValues(int salt) const {
    const int r = view.world_size == 1 ? 0 : view.rank;
    for (const StateGroup& g : view.groups) {
      for (const StateBuffer& b : g.buffers) {
        const auto* d = static_cast<const float*>(b.data);
        for (const ShardPiece& p : g.layout.RankPieces(r)) {
          for (int64_t i = 0; i < p.count; ++i) {
            if (d[p.shard_offset + i] != StateValue(g.tensors[static_cast<size_t>(p.tensor)].name, p.tensor_offset + i, b.kind, salt)) {
              return false;
            }
          }
        }
      }
    }
    return true;
  }

 private:
  int salt_ = 0;
  std::vector<std::vector<float>> storage_;
};

}  // namespace zrt::testing
