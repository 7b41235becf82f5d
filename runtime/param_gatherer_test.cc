// ParamGatherer on in-process ranks (1-4): a gathered group is every rank's shard in rank order; later
// steps prefetch in the order recorded in the first step, within the live-bytes bound; gathers off
// the recorded order still work; offloaded shards (a load function) are read before their all-gather;
// misuse is an error; hpZ's later gathers stay inside their secondary group.
#include "zrt/runtime/param_gatherer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "zrt/core/base.h"
#include "zrt/core/communicator.h"
#include "zrt/kernels/weight_quant.h"

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

// qwZ: every rank's shard decoded from block-quantized int8 codes. Values of mixed magnitudes (a block
// of zeros, one holding an inf), shards not a multiple of the block, prefetching over two steps, exact
// and offloaded shards, 1-4 ranks: each element within half its block's scale (plus the bf16 rounding
// of the decoded value) of the shard's, bit for bit what the codes give, the same on every rank, and
// about half the bytes moved of exact gathers; on one rank nothing moves and the gather is exact.
TEST(ParamGatherer, QuantizedGathersDecodeEveryRanksShardWithinItsBlockScale) {
  constexpr int64_t kBlock = 32;
  for (int n = 1; n <= 4; ++n) {
    for (bool offloaded : {false, true}) {
      ASSERT_TRUE(RunLoopbackRanks(n, [offloaded](Communicator& comm) -> Status {
        Fixture f(comm, offloaded);
        // Rank r's values: a slow wave times a magnitude that changes every 40 elements; rank 1's
        // group 3 has a block of zeros (elements 32..63) and an inf at element 100.
        auto value = [](int r, size_t g, int64_t i) {
          if (r == 1 && g == 3 && i >= 32 && i < 64) return 0.0f;
          if (r == 1 && g == 3 && i == 100) return std::numeric_limits<float>::infinity();
          const float mag = std::ldexp(1.0f, static_cast<int>((i / 40 + r + static_cast<int64_t>(g)) % 7) - 3);
          return mag * std::sin(0.37f * static_cast<float>(i) + static_cast<float>(r + 3 * static_cast<int>(g)));
        };
        for (size_t g = 0; g < f.shards.size(); ++g) {
          for (size_t i = 0; i < f.shards[g].size(); ++i) f.shards[g][i] = FloatToBf16(value(comm.rank(), g, static_cast<int64_t>(i)));
        }
        f.gatherer->QuantizeGathers(kBlock);
        for (int step = 0; step < 2; ++step) {
          for (int g = 0; g < 4; ++g) {
            ASSIGN_OR_RETURN(void* p, f.gatherer->Gather(g));
            const auto* full = static_cast<const uint16_t*>(p);
            const ShardLayout& l = f.layouts[static_cast<size_t>(g)];
            const int64_t S = l.shard_size();
            for (int r = 0; r < comm.size(); ++r) {
              for (int64_t b0 = 0; b0 < S; b0 += kBlock) {
                const int64_t b1 = std::min(b0 + kBlock, S);
                float amax = 0;
                bool finite = true;
                for (int64_t i = b0; i < b1; ++i) {
                  const float x = Bf16ToFloat(FloatToBf16(value(r, static_cast<size_t>(g), i)));
                  finite = finite && std::isfinite(x);
                  amax = std::max(amax, std::fabs(x));
                }
                for (int64_t i = b0; i < b1; ++i) {
                  const float x = Bf16ToFloat(FloatToBf16(value(r, static_cast<size_t>(g), i))), got = Bf16ToFloat(full[r * S + i]);
                  const std::string at = "group " + std::to_string(g) + " rank " + std::to_string(r) + " element " + std::to_string(i);
                  if (comm.size() == 1) {  // one rank gathers nothing: its shard, exact
                    EXPECT_EQ(full[r * S + i], FloatToBf16(x)) << at;
                    continue;
                  }
                  if (!finite) {
                    EXPECT_TRUE(std::isnan(got)) << at << ": a block holding inf decodes to NaN";
                    continue;
                  }
                  const auto code = static_cast<int8_t>(std::clamp(std::nearbyint(x * (amax > 0 ? 127.0f / amax : 0.0f)), -127.0f, 127.0f));
                  EXPECT_EQ(full[r * S + i], FloatToBf16(static_cast<float>(code) * (amax / 127.0f))) << at;  // (an int8 0 has no sign)
                  EXPECT_LE(std::fabs(got - x), amax / 127.0f * 0.5f * 1.0001f + std::fabs(got) * 0x1p-8f) << at;
                }
              }
            }
            // The same bits on every rank.
            uint64_t h = 1469598103934665603ull;
            for (int64_t i = 0; i < l.padded_size(); ++i) h = (h ^ full[i]) * 1099511628211ull;
            std::vector<uint64_t> all(static_cast<size_t>(comm.size()));
            RETURN_IF_ERROR(comm.AllGather(&h, all.data(), 8, DType::kBytes));
            for (uint64_t o : all) EXPECT_EQ(o, all[0]) << "group " << g << ": ranks decoded different parameters";
            RETURN_IF_ERROR(f.gatherer->Release(g));
          }
          RETURN_IF_ERROR(f.gatherer->EndStep());
        }
        EXPECT_EQ(f.gatherer->live_bytes(), 0);
        // Codes and a scale per 32 values, padded to 4 bytes: (1 + 4/32) / 2 of the bf16 bytes for large
        // shards, 0.6 for these small ones (one step's gathers, twice).
        int64_t exact = 0, quantized = 0;
        for (const ShardLayout& l : f.layouts) {
          exact += 2 * (2 * l.padded_size() * (comm.size() - 1) / comm.size());
          quantized += 2 * (AlignUp(kernels::PackedWeightBytes(l.shard_size(), kBlock), 4) * comm.size() * (comm.size() - 1) / comm.size());
        }
        EXPECT_EQ(f.gatherer->stats().gather_bytes, quantized);  // (0 on one rank)
        EXPECT_LE(quantized, exact * 6 / 10) << quantized << " of " << exact;
        return Status();
      }).ok());
    }
  }
}

// hpZ: a group's first gather in a step is the whole gather (exact, or qwZ's decoded values) and keeps
// the rank's slice; its later gathers in the step (here: a backward in reverse order) come from the
// slices of its P-rank group, bit for bit the same, moving (P - 1) / P of the parameters inside the
// group and reading no offloaded shard; EndStep and DropSecondary make the next gather whole again.
TEST(ParamGatherer, HpzLaterGathersInAStepComeFromTheSecondaryGroupBitForBit) {
  for (const auto& [ranks, p] : {std::pair{4, 2}, std::pair{6, 2}, std::pair{6, 3}}) {
    for (bool offloaded : {false, true}) {
      for (int64_t quant : {int64_t{0}, int64_t{32}}) {
        SCOPED_TRACE(std::to_string(ranks) + " ranks, groups of " + std::to_string(p) + (offloaded ? ", offloaded" : "") +
                     (quant > 0 ? ", qwZ" : ""));
        ASSERT_TRUE(RunLoopbackRanks(ranks, [&, p = p](Communicator& comm) -> Status {
          Fixture f(comm, offloaded);
          ASSIGN_OR_RETURN(std::unique_ptr<Communicator> node, comm.Split(comm.rank() / p, comm.rank()));
          CpuDevice dev;
          if (quant > 0) f.gatherer->QuantizeGathers(quant);
          f.gatherer->SecondaryShards(node.get(), &dev);
          int64_t slices = 0, secondary = 0;
          for (const ShardLayout& l : f.layouts) {
            slices += l.padded_size() / p * 2;
            secondary += l.padded_size() * 2 * (p - 1) / p;
          }
          int64_t forward = -1;  // the forward's gather bytes per step
          for (int step = 0; step < 3; ++step) {
            const CommStats before = f.gatherer->stats();
            const int loads = f.loads;
            std::vector<std::vector<uint16_t>> first(4);
            for (int g : {2, 0, 3, 1}) {
              ASSIGN_OR_RETURN(void* x, f.gatherer->Gather(g));
              if (quant == 0) f.ExpectGathered(static_cast<size_t>(g), x);
              first[static_cast<size_t>(g)].assign(static_cast<const uint16_t*>(x),
                                                    static_cast<const uint16_t*>(x) + f.layouts[static_cast<size_t>(g)].padded_size());
              RETURN_IF_ERROR(f.gatherer->Release(g));
            }
            for (int g : {1, 3, 0, 2}) {
              ASSIGN_OR_RETURN(void* x, f.gatherer->Gather(g));
              EXPECT_EQ(0, std::memcmp(x, first[static_cast<size_t>(g)].data(), first[static_cast<size_t>(g)].size() * 2)) << "group " << g;
              RETURN_IF_ERROR(f.gatherer->Release(g));
            }
            RETURN_IF_ERROR(f.gatherer->EndStep());
            // (A step's prefetches may start the backward's first gathers during the forward.)
            EXPECT_EQ(f.loads - loads, offloaded ? 4 : 0) << "no shard read for a gather inside the secondary group";
            const int64_t moved = f.gatherer->stats().gather_bytes - before.gather_bytes,
                          inside = f.gatherer->stats().secondary_gather_bytes - before.secondary_gather_bytes;
            EXPECT_EQ(inside, secondary) << "step " << step << ": every backward gather inside the secondary group";
            if (forward < 0) forward = moved - inside;
            EXPECT_EQ(moved - inside, forward) << "step " << step << ": the forward's gathers, whole";
            EXPECT_GT(forward, 0);
          }
          EXPECT_EQ(f.gatherer->secondary_bytes(), slices);
          // After EndStep, and after DropSecondary, the next gather goes whole.
          for (bool drop : {false, true}) {
            const int64_t before = f.gatherer->stats().secondary_gather_bytes;
            ASSIGN_OR_RETURN(void* x, f.gatherer->Gather(1));
            (void)x;
            RETURN_IF_ERROR(f.gatherer->Release(1));
            if (drop) f.gatherer->DropSecondary();
            ASSIGN_OR_RETURN(x, f.gatherer->Gather(1));
            if (quant == 0) f.ExpectGathered(1, x);
            RETURN_IF_ERROR(f.gatherer->Release(1));
            EXPECT_EQ(f.gatherer->stats().secondary_gather_bytes - before, drop ? 0 : f.layouts[1].padded_size() * 2 * (p - 1) / p);
            RETURN_IF_ERROR(f.gatherer->EndStep());
          }
          EXPECT_EQ(f.gatherer->live_bytes(), 0);
          return Status();
        }).ok());
      }
    }
  }
}

}  // namespace
}  // namespace zrt
