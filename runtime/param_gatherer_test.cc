// ParamGatherer on in-process ranks (1-4): a gathered group is every rank's shard in rank order; later
// steps prefetch in the order recorded in the first step, within the live-bytes bound; gathers off
// the recorded order still work; offloaded shards (a load function) are read before their all-gather;
// misuse is an error.
#include "zrt/runtime/param_gatherer.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "zrt/core/communicator.h"

namespace zrt {
namespace {

// Element i of group g's shard on rank r.
uint16_t Value(int r, size_t g, int64_t i) { return FloatToBf16(static_cast<float>(r * 1000 + static_cast<int>(g) * 100) + static_cast<float>(i)); }

struct Fixture {
  Fixture(Communicator& c, bool offloaded) : comm(c), pool(&dev, MemCategory::kStaging), load_pool(&dev, MemCategory::kStaging) {
    for (int64_t n : {7, 64, 1, 300}) layouts.push_back(*ShardLayout::Create(std::vector<int64_t>{n, 5}, c.size(), 8));
    for (size_t g = 0; g < layouts.size(); ++g) {
      auto& s = shards.emplace_back(static_cast<size_t>(layouts[g].shard_size()));
      for (size_t i = 0; i < s.size(); ++i) s[i] = Value(c.rank(), g, static_cast<int64_t>(i));
    }
    std::vector<ParamGatherer::GroupRef> refs;
    for (size_t g = 0; g < layouts.size(); ++g) {
      ParamGatherer::GroupRef ref{shards[g].data(), DType::kBF16, &layouts[g], "g" + std::to_string(g), {}, 0};
      if (offloaded) {  // "read from disk": a copy, done at once
        ref.shard = nullptr;
        ref.load_bytes = (shards[g].size() * 2 + 4095) / 4096 * 4096;
        ref.load = [this, g](void* dst) -> Result<IoHandle> {
          ++loads;
          std::memcpy(dst, shards[g].data(), shards[g].size() * 2);
          return IoHandle();
        };
      }
      refs.push_back(std::move(ref));
    }
    gatherer = std::make_unique<ParamGatherer>(&c, &pool, &load_pool, nullptr, int64_t{1} << 20, 2);
    gatherer->SetGroups(std::move(refs));
  }
  void ExpectGathered(size_t g, const void* p) {
    const auto* full = static_cast<const uint16_t*>(p);
    const int64_t S = layouts[g].shard_size();
    for (int r = 0; r < comm.size(); ++r) {
      for (int64_t i = 0; i < S; ++i) ASSERT_EQ(full[r * S + i], Value(r, g, i)) << "group " << g << " rank " << r << " element " << i;
    }
  }
  Communicator& comm;
  CpuDevice dev;
  BufferPool pool, load_pool;
  std::vector<ShardLayout> layouts;
  std::vector<std::vector<uint16_t>> shards;
  std::unique_ptr<ParamGatherer> gatherer;
  int loads = 0;
};

class ParamGathererTest : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(ParamGathererTest, GathersEveryRanksShardAndPrefetchesInTheRecordedOrder) {
  const auto [ranks, offloaded] = GetParam();
  ASSERT_TRUE(RunLoopbackRanks(ranks, [offloaded](Communicator& comm) -> Status {
    Fixture f(comm, offloaded);
    ParamGatherer& pg = *f.gatherer;
    const int64_t collectives_per_step = 4;
    for (int step = 0; step < 3; ++step) {
      for (int g : {2, 0, 3, 1}) {  // the model's order, not the registration order
        ASSIGN_OR_RETURN(void* p, pg.Gather(g));
        f.ExpectGathered(static_cast<size_t>(g), p);
        EXPECT_TRUE(pg.gathered(g));
        EXPECT_LE(pg.live_bytes(), int64_t{1} << 20);
        RETURN_IF_ERROR(pg.Release(g));
      }
      RETURN_IF_ERROR(pg.EndStep());
      EXPECT_EQ(pg.live_bytes(), 0);
      // Every gather is one all-gather: prefetches replace gathers, they never add any.
      EXPECT_EQ(pg.stats().collectives, collectives_per_step * (step + 1));
    }
    if (offloaded) {
      EXPECT_EQ(f.loads, 12);
    }
    // Off the recorded order: still correct (just not prefetched).
    ASSIGN_OR_RETURN(void* p3, pg.Gather(3));
    f.ExpectGathered(3, p3);
    ASSIGN_OR_RETURN(void* p1, pg.Gather(1));
    f.ExpectGathered(1, p1);
    RETURN_IF_ERROR(pg.Release(1));
    RETURN_IF_ERROR(pg.Release(3));
    EXPECT_EQ(pg.Release(3).code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(pg.Gather(4).status().code(), StatusCode::kNotFound);
    return pg.EndStep();
  }).ok());
}

INSTANTIATE_TEST_SUITE_P(Ranks, ParamGathererTest,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4), ::testing::Bool()));

TEST(ParamGatherer, PrefetchStaysWithinTheLiveBytesBound) {
  ASSERT_TRUE(RunLoopbackRanks(2, [](Communicator& comm) -> Status {
    Fixture f(comm, false);
    // Room for the largest group gathered plus nothing else: no prefetch can start.
    const int64_t largest = f.layouts[3].padded_size() * 2;
    f.gatherer = std::make_unique<ParamGatherer>(&comm, &f.pool, &f.load_pool, nullptr, largest, 3);
    std::vector<ParamGatherer::GroupRef> refs;
    for (size_t g = 0; g < f.layouts.size(); ++g) refs.push_back({f.shards[g].data(), DType::kBF16, &f.layouts[g], "g", {}, 0});
    f.gatherer->SetGroups(std::move(refs));
    for (int step = 0; step < 2; ++step) {
      for (int g = 0; g < 4; ++g) {
        ASSIGN_OR_RETURN(void* p, f.gatherer->Gather(g));
        f.ExpectGathered(static_cast<size_t>(g), p);
        EXPECT_LE(f.gatherer->live_bytes(), std::max(largest, f.layouts[static_cast<size_t>(g)].padded_size() * 2));
        RETURN_IF_ERROR(f.gatherer->Release(g));
      }
      RETURN_IF_ERROR(f.gatherer->EndStep());
    }
    return Status();
  }).ok());
}

}  // namespace
}  // namespace zrt
