// Metadata at scale: a 1-trillion-parameter, 100,000-tensor model saved by 16,384 ranks. The manifest
// stays O(tensors), one rank's index O(groups), and the plan of a reshard to 12,288 ranks is computed
// without data (bench/checkpoint reports how long that takes; timings are not asserted here).
#include <gtest/gtest.h>

#include <chrono>

#include "zrt/checkpoint/format.h"
#include "zrt/checkpoint/interchange/interchange.h"

namespace zrt::ckpt {
namespace {

Manifest Huge(int groups, int tensors_per_group, int64_t numel, int shards) {
  Manifest m;
  m.nonce = "0123456789abcdef";
  m.step = 1;
  m.world_size = m.shards = shards;
  m.stage = 3;
  for (int g = 0; g < groups; ++g) {
    GroupEntry ge;
    ge.name = "layer" + std::to_string(g);
    ge.alignment = 64;
    ge.kinds = {"master", "exp_avg", "exp_avg_sq"};
    int64_t off = 0;
    for (int t = 0; t < tensors_per_group; ++t) {
      ge.tensors.push_back({"layer" + std::to_string(g) + ".w" + std::to_string(t), {numel}, DType::kBF16, off, numel});
      off = (off + numel + 63) / 64 * 64;
    }
    m.groups.push_back(std::move(ge));
  }
  return m;
}

TEST(Scale, TrillionParameters100kTensors16kRanks) {
  const Manifest m = Huge(1000, 100, 10'000'000, 16384);  // 1000 x 100 x 1e7 = 1e12 parameters
  const std::string text = EncodeManifest(m);
  RecordProperty("manifest_bytes", static_cast<int>(text.size()));
  EXPECT_LT(text.size(), 100'000u * 160u) << "the manifest must stay O(tensors): at most ~160 bytes per tensor";
  auto back = DecodeManifest(text, "manifest.json");
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->groups.size(), 1000u);
  // One rank's index: one chunk per (group, kind) here — O(groups), independent of the world size.
  RankIndex idx;
  idx.nonce = m.nonce;
  idx.shards = m.shards;
  idx.data_file = DataFileName(77);
  auto layout = SavedLayout(*back, 0);
  ASSERT_TRUE(layout.ok()) << layout.status();
  const int64_t shard = layout->shard_size();
  for (int g = 0; g < 1000; ++g) {
    for (int k = 0; k < 3; ++k) {
      idx.chunks.push_back({g, k, 0, shard, idx.data_bytes, shard * 4, Codec::kRaw, 1});
      idx.data_bytes += shard * 4;
    }
  }
  EXPECT_LT(EncodeIndex(idx).size(), 3000u * 100u);
  // Reshard plan 16,384 -> 12,288 ranks: every element of every group read exactly once.
  const auto t0 = std::chrono::steady_clock::now();
  int64_t reads = 0, elements = 0;
  ASSERT_TRUE(PlanReshard(*back, 12288, [&](const ReshardRead& r) {
    ++reads;
    elements += r.count;
  }).ok());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  RecordProperty("plan_reads", static_cast<int>(reads));
  std::printf("manifest %zu bytes; reshard plan 16384 -> 12288 ranks: %lld reads in %.3f s\n", text.size(),
              static_cast<long long>(reads), seconds);
  int64_t real = 0;
  for (const GroupEntry& g : back->groups) real += g.tensors.back().offset + g.tensors.back().numel;
  EXPECT_EQ(elements, real);
  EXPECT_LE(reads, 1000 * (12288 + 16384));
}

TEST(Scale, PlanMatchesTheLayoutsOnSmallCases) {
  for (int old_n : {1, 3, 4, 7}) {
    for (int new_n : {1, 2, 5, 8}) {
      const Manifest m = Huge(2, 3, 37, old_n);
      auto l0 = SavedLayout(m, 0);
      ASSERT_TRUE(l0.ok());
      std::vector<int64_t> covered(2, 0);
      Status s = PlanReshard(m, new_n, [&](const ReshardRead& r) {
        // The flat element the read starts at is the same in both layouts.
        auto nl = ShardLayout::Create(std::vector<int64_t>{37, 37, 37}, new_n, 64);
        EXPECT_EQ(nl->shard_begin(r.new_rank) + r.new_offset, l0->shard_begin(r.old_rank) + r.old_offset);
        covered[static_cast<size_t>(r.group)] += r.count;
      });
      ASSERT_TRUE(s.ok());
      EXPECT_EQ(covered[0], 64 * 2 + 37) << old_n << " -> " << new_n;
    }
  }
  EXPECT_EQ(PlanReshard(Huge(1, 1, 5, 2), 0, [](const ReshardRead&) {}).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zrt::ckpt
