#include "zrt/core/shard_layout.h"

#include <gtest/gtest.h>

#include <random>

#include "tests/support/reference.h"

namespace zrt {
namespace {

// Checks every invariant of a layout by brute force over pieces (O(elements covered by pieces)).
void CheckInvariants(const ShardLayout& l, const std::vector<int64_t>& numels) {
  ASSERT_EQ(l.num_tensors(), static_cast<int64_t>(numels.size()));
  ASSERT_EQ(l.padded_size() % (l.world_size() * l.alignment()), 0);
  ASSERT_EQ(l.shard_size() % l.alignment(), 0);
  ASSERT_GT(l.shard_size(), 0);
  int64_t prev_end = 0, total = 0;
  for (int64_t t = 0; t < l.num_tensors(); ++t) {
    ASSERT_EQ(l.tensor_offset(t) % l.alignment(), 0) << "tensor " << t;
    ASSERT_GE(l.tensor_offset(t), prev_end) << "tensor " << t << " overlaps its predecessor";
    ASSERT_LT(l.tensor_offset(t) - prev_end, l.alignment()) << "more padding than alignment needs";
    prev_end = l.tensor_offset(t) + numels[static_cast<size_t>(t)];
    total += numels[static_cast<size_t>(t)];
  }
  ASSERT_LE(prev_end, l.padded_size());
  ASSERT_LT(l.padded_size() - std::max<int64_t>(prev_end, 1), l.world_size() * l.alignment());
  ASSERT_EQ(l.total_numel(), total);

  // Rank pieces: ordered, inside the shard, disjoint, and together they cover each tensor exactly once.
  std::vector<int64_t> covered(numels.size(), 0);
  std::vector<int64_t> next_expected(numels.size(), 0);
  for (int r = 0; r < l.world_size(); ++r) {
    int64_t shard_cursor = 0;
    for (const ShardPiece& p : l.RankPieces(r)) {
      ASSERT_EQ(p.rank, r);
      ASSERT_GT(p.count, 0);
      ASSERT_GE(p.shard_offset, shard_cursor) << "pieces out of order or overlapping on rank " << r;
      ASSERT_LE(p.shard_offset + p.count, l.shard_size());
      ASSERT_EQ(l.shard_begin(r) + p.shard_offset, l.tensor_offset(p.tensor) + p.tensor_offset);
      // Tensors are laid out in order and ranks in order, so pieces of a tensor arrive in order.
      ASSERT_EQ(p.tensor_offset, next_expected[static_cast<size_t>(p.tensor)]) << "gap or overlap in tensor " << p.tensor;
      next_expected[static_cast<size_t>(p.tensor)] += p.count;
      covered[static_cast<size_t>(p.tensor)] += p.count;
      shard_cursor = p.shard_offset + p.count;
    }
  }
  for (size_t t = 0; t < numels.size(); ++t) ASSERT_EQ(covered[t], numels[t]) << "tensor " << t;
}

TEST(ShardLayout, SmallExampleByHand) {
  // 3 tensors of 5, 0, 6 elements, 2 ranks, alignment 4: offsets 0, 8, 8; flat end 14 -> padded 16.
  auto l = ShardLayout::Create(std::vector<int64_t>{5, 0, 6}, 2, 4);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->tensor_offset(0), 0);
  EXPECT_EQ(l->tensor_offset(1), 8);
  EXPECT_EQ(l->tensor_offset(2), 8);
  EXPECT_EQ(l->padded_size(), 16);
  EXPECT_EQ(l->shard_size(), 8);
  EXPECT_EQ(l->TensorAt(4), 0);
  EXPECT_EQ(l->TensorAt(5), -1);  // padding
  EXPECT_EQ(l->TensorAt(8), 2);   // not the empty tensor 1 sharing the offset
  EXPECT_EQ(l->TensorAt(15), -1);
  auto r0 = l->RankPieces(0);
  ASSERT_EQ(r0.size(), 1u);
  EXPECT_EQ(r0[0], (ShardPiece{0, 0, 0, 5, 0}));
  auto r1 = l->RankPieces(1);
  ASSERT_EQ(r1.size(), 1u);
  EXPECT_EQ(r1[0], (ShardPiece{2, 0, 0, 6, 1}));
  auto loc = l->Locate(2, 1, 4);
  ASSERT_EQ(loc.size(), 1u);
  EXPECT_EQ(loc[0], (ShardPiece{2, 1, 1, 3, 1}));
}

TEST(ShardLayout, TensorSplitAcrossRanks) {
  auto l = ShardLayout::Create(std::vector<int64_t>{10}, 3, 1);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->shard_size(), 4);
  auto loc = l->Locate(0, 0, 10);
  ASSERT_EQ(loc.size(), 3u);
  EXPECT_EQ(loc[0], (ShardPiece{0, 0, 0, 4, 0}));
  EXPECT_EQ(loc[1], (ShardPiece{0, 4, 0, 4, 1}));
  EXPECT_EQ(loc[2], (ShardPiece{0, 8, 0, 2, 2}));
  EXPECT_TRUE(l->Locate(0, 3, 3).empty());
  CheckInvariants(*l, {10});
}

TEST(ShardLayout, BadInputIsAnError) {
  EXPECT_EQ(ShardLayout::Create(std::vector<int64_t>{1}, 0, 1).status().code(), StatusCode::kInvalidArgument);
  Status a0 = ShardLayout::Create(std::vector<int64_t>{1}, 2, 0).status();
  EXPECT_EQ(a0.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(a0.message().find("alignment"), std::string_view::npos);
  EXPECT_EQ(ShardLayout::Create(std::vector<int64_t>{3, -1}, 2, 1).status().code(), StatusCode::kInvalidArgument);
  const int64_t big = int64_t{1} << 62;
  EXPECT_EQ(ShardLayout::Create(std::vector<int64_t>{big, big}, 2, 1).status().code(), StatusCode::kInvalidArgument);
  std::vector<TensorSpec> specs = {{"ok", {3}, DType::kF32}, {"bad", {-3}, DType::kF32}};
  Status s = ShardLayout::Create(specs, 2, 1).status();
  EXPECT_NE(s.message().find("bad"), std::string_view::npos) << s;
}

TEST(ShardLayout, EmptyModelAndWorldLargerThanModel) {
  auto e = ShardLayout::Create(std::vector<int64_t>{}, 4, 2);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->shard_size(), 2);
  CheckInvariants(*e, {});
  std::vector<int64_t> tiny = {1, 2};
  auto l = ShardLayout::Create(tiny, 1024, 1);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->shard_size(), 1);
  CheckInvariants(*l, tiny);
  EXPECT_TRUE(l->RankPieces(1000).empty());
}

TEST(ShardLayout, PropertyRandomTensorListsAndWorldSizes) {
  const uint64_t seed = testing::TestSeed();
  SCOPED_TRACE("ZRT_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 60; ++trial) {
    const int ntensors = static_cast<int>(rng() % 40);
    std::vector<int64_t> numels(static_cast<size_t>(ntensors));
    for (int64_t& n : numels) {
      switch (rng() % 4) {
        case 0: n = 0; break;                                    // empty
        case 1: n = static_cast<int64_t>(rng() % 5); break;      // smaller than most world sizes
        case 2: n = static_cast<int64_t>(rng() % 1000); break;
        default: n = static_cast<int64_t>(rng() % 100000); break;
      }
    }
    const int world = trial < 16 ? trial + 1 : 1 + static_cast<int>(rng() % 1024);
    const int64_t align = int64_t{1} << (rng() % 6);
    auto l = ShardLayout::Create(numels, world, align);
    ASSERT_TRUE(l.ok()) << l.status();
    SCOPED_TRACE("trial " + std::to_string(trial) + " world " + std::to_string(world) + " align " +
                 std::to_string(align));
    CheckInvariants(*l, numels);
    // Locate agrees with RankPieces and TensorAt on random ranges.
    for (int q = 0; q < 20 && ntensors > 0; ++q) {
      const int64_t t = static_cast<int64_t>(rng() % static_cast<uint64_t>(ntensors));
      const int64_t n = numels[static_cast<size_t>(t)];
      const int64_t b = n ? static_cast<int64_t>(rng() % static_cast<uint64_t>(n)) : 0;
      const int64_t e = n ? b + static_cast<int64_t>(rng() % static_cast<uint64_t>(n - b + 1)) : 0;
      int64_t cursor = b;
      for (const ShardPiece& p : l->Locate(t, b, e)) {
        ASSERT_EQ(p.tensor_offset, cursor);
        ASSERT_EQ(l->owner(l->tensor_offset(t) + p.tensor_offset), p.rank);
        ASSERT_EQ(l->TensorAt(l->tensor_offset(t) + p.tensor_offset), t);
        cursor += p.count;
      }
      ASSERT_EQ(cursor, e);
    }
  }
}

TEST(ShardLayout, ManyTinyTensorsAndOneHugeTensor) {
  std::vector<int64_t> tiny(100000, 3);
  for (int world : {1, 3, 64, 1024}) {
    auto l = ShardLayout::Create(tiny, world, 4);
    ASSERT_TRUE(l.ok());
    CheckInvariants(*l, tiny);
  }
  // One trillion-element tensor: built and queried without touching per-element memory.
  std::vector<int64_t> huge = {int64_t{1} << 40};
  auto l = ShardLayout::Create(huge, 16384, 64);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->padded_size(), int64_t{1} << 40);
  auto pieces = l->RankPieces(16383);
  ASSERT_EQ(pieces.size(), 1u);
  EXPECT_EQ(pieces[0].tensor_offset + pieces[0].count, int64_t{1} << 40);
  EXPECT_EQ(l->Locate(0, 0, int64_t{1} << 40).size(), 16384u);
}

}  // namespace
}  // namespace zrt
