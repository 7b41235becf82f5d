// GradBucketer on in-process ranks (1-4, 6): every rank's shard ends up the average over ranks of its
// slice of every group, whatever the bucket size (groups spanning buckets, buckets mixing groups),
// for reduce-scatter and all-reduce (stage 0), f32 and bf16 on the wire, and block-quantized (qgZ)
// within the codes' bound, at one level or two (nodes of 2 or 3 ranks); results land only at Flush.
#include "zrt/runtime/grad_bucketer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "tests/support/reference.h"
#include "zrt/core/communicator.h"
#include "zrt/kernels/weight_quant.h"

namespace zrt {
namespace {

struct Case {
  int ranks;
  int64_t bucket_bytes;
  bool all_reduce;
  DType reduce;
  int64_t quantized_block = 0;  // qgZ
  int node = 0;                 // qgZ over two levels: nodes of this many ranks
  int bits = 8;                 // qgZ's codes: int8 or int4
};

class GradBucketerTest : public ::testing::TestWithParam<Case> {};

TEST_P(GradBucketerTest, ShardsAreTheAverageOfEveryRanksSlice) {
  const Case c = GetParam();
  const uint64_t seed = testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const std::vector<std::vector<int64_t>> groups = {{5, 17}, {1}, {300, 3, 64}, {129}};
  ASSERT_TRUE(RunLoopbackRanks(c.ranks, [&](Communicator& comm) -> Status {
    CpuDevice dev;
    ASSIGN_OR_RETURN(auto compute, Compute::For(&dev, {}));
    GradBucketer::Options o;
    o.bucket_bytes = c.bucket_bytes;
    o.reduce_dtype = c.reduce;
    o.all_reduce = c.all_reduce;
    o.quantized_block = c.quantized_block;
    o.quantized_bits = c.bits;
    std::unique_ptr<Communicator> node, across;
    if (c.node > 0) {
      ASSIGN_OR_RETURN(node, comm.Split(comm.rank() / c.node, comm.rank()));
      ASSIGN_OR_RETURN(across, comm.Split(comm.rank() % c.node, comm.rank()));
      o.node = node.get();
      o.across = across.get();
    }
    ASSIGN_OR_RETURN(auto b, GradBucketer::Create(&comm, &dev, compute.get(), o));
    const int n = c.all_reduce ? 1 : comm.size();
    std::vector<ShardLayout> layouts;
    std::vector<std::vector<std::vector<float>>> grads(static_cast<size_t>(comm.size()));  // [rank][group]
    std::vector<std::vector<float>> shards;
    for (const auto& numels : groups) {
      ASSIGN_OR_RETURN(ShardLayout l, ShardLayout::Create(numels, n, 4));
      layouts.push_back(l);
      shards.emplace_back(static_cast<size_t>(c.all_reduce ? l.padded_size() : l.shard_size()), -7.0f);
    }
    // Every rank knows every rank's gradients (same seed), so it can check its own result.
    std::mt19937_64 rng(seed);
    for (int r = 0; r < comm.size(); ++r) {
      for (const ShardLayout& l : layouts) {
        auto v = testing::RandomFloats(static_cast<size_t>(l.padded_size()), rng);
        if (c.reduce == DType::kBF16) {
          for (float& x : v) x = Bf16ToFloat(FloatToBf16(x));  // exactly representable on the wire
        }
        grads[static_cast<size_t>(r)].push_back(std::move(v));
      }
    }
    for (size_t g = 0; g < groups.size(); ++g) {
      std::vector<float> mine = grads[static_cast<size_t>(comm.rank())][g];
      RETURN_IF_ERROR(b->Add(mine.data(), DType::kF32, layouts[g], shards[g].data(), DType::kF32));
      std::fill(mine.begin(), mine.end(), 1e9f);  // the bucket holds a copy: the source may change
    }
    RETURN_IF_ERROR(b->Flush());
    const int me = c.all_reduce ? 0 : comm.rank();
    // qgZ: each rank's value is off by at most half its block's scale, max |x| / (2 L) of that rank's
    // region at most (L = 127 for int8, 7 for int4; bounded here by its largest gradient anywhere), and
    // the average divides the sum.
    float quant_bound = 0;
    if (c.quantized_block > 0 && comm.size() > 1) {
      for (int r = 0; r < comm.size(); ++r) {
        float m = 0;
        for (const auto& v : grads[static_cast<size_t>(r)]) {
          for (float x : v) m = std::max(m, std::abs(x));
        }
        quant_bound += m / (2.0f * static_cast<float>(kernels::WeightQuantLevels(c.bits))) * 1.001f / static_cast<float>(comm.size());
      }
      // Two levels: each node's sum quantized again, off by half its scale, at most the node's ranks'
      // largest magnitudes (and their first errors) summed over 2 L: about the first bound again.
      if (c.node > 0) quant_bound *= 2.01f;
    }
    int differ = 0;
    for (size_t g = 0; g < groups.size(); ++g) {
      const int64_t begin = layouts[g].shard_begin(me);
      for (size_t i = 0; i < shards[g].size(); ++i) {
        float sum = 0;
        for (int r = 0; r < comm.size(); ++r) sum += grads[static_cast<size_t>(r)][g][static_cast<size_t>(begin) + i];
        float want = sum / static_cast<float>(comm.size());
        if (c.reduce == DType::kBF16) want = Bf16ToFloat(FloatToBf16(want));
        const float tol = std::abs(want) * (c.reduce == DType::kBF16 && quant_bound > 0 ? 0x1p-7f : 1e-6f) + 1e-7f +
                          quant_bound * (c.node > 0 && c.bits == 4 ? 1.15f : 1.0f);
        EXPECT_NEAR(shards[g][i], want, tol) << "group " << g << " element " << i;
        differ += shards[g][i] != want;
      }
    }
    if (quant_bound > 0) {
      EXPECT_GT(differ, 0) << "quantized reductions that are all exact: nothing was quantized";
    }
    if (comm.size() > 1) {
      EXPECT_GT(b->stats().collectives, 0);
    } else {
      EXPECT_EQ(b->stats().collectives, 0);  // one rank: nothing is reduced, nothing is sent
    }
    return Status();
  }).ok());
}

INSTANTIATE_TEST_SUITE_P(Cases, GradBucketerTest,
                         ::testing::Values(Case{1, 1 << 20, false, DType::kF32}, Case{2, 64, false, DType::kF32},
                                           Case{3, 100, false, DType::kF32}, Case{4, 1 << 20, false, DType::kF32},
                                           Case{3, 4096, false, DType::kBF16}, Case{3, 96, true, DType::kF32},
                                           Case{4, 1 << 20, true, DType::kF32}, Case{2, 64, false, DType::kF32, 16},
                                           Case{3, 4096, false, DType::kBF16, 32}, Case{4, 1 << 20, false, DType::kF32, 256},
                                           Case{1, 1 << 20, false, DType::kF32, 64}, Case{4, 64, false, DType::kF32, 16, 2},
                                           Case{6, 4096, false, DType::kBF16, 32, 3}, Case{6, 1 << 20, false, DType::kF32, 256, 2},
                                           Case{2, 64, false, DType::kF32, 16, 0, 4}, Case{3, 4096, false, DType::kBF16, 32, 0, 4},
                                           Case{4, 1 << 20, false, DType::kF32, 256, 0, 4}, Case{1, 1 << 20, false, DType::kF32, 64, 0, 4},
                                           Case{4, 64, false, DType::kF32, 16, 2, 4}, Case{6, 4096, false, DType::kBF16, 32, 3, 4}));

TEST(GradBucketer, RefusesInt4CodesInOddBlocks) {
  ASSERT_TRUE(RunLoopbackRanks(2, [](Communicator& comm) -> Status {
    CpuDevice dev;
    ASSIGN_OR_RETURN(auto compute, Compute::For(&dev, {}));
    GradBucketer::Options o;
    o.quantized_block = 17;
    o.quantized_bits = 4;
    const auto r = GradBucketer::Create(&comm, &dev, compute.get(), o);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("17"), std::string::npos) << r.status();
    o.quantized_bits = 8;  // int8 takes any block
    EXPECT_TRUE(GradBucketer::Create(&comm, &dev, compute.get(), o).ok());
    return Status();
  }).ok());
}

TEST(GradBucketer, RefusesBucketsTooSmallForTheRanks) {
  ASSERT_TRUE(RunLoopbackRanks(4, [](Communicator& comm) -> Status {
    CpuDevice dev;
    ASSIGN_OR_RETURN(auto compute, Compute::For(&dev, {}));
    GradBucketer::Options o;
    o.bucket_bytes = 8;  // two floats for four ranks
    EXPECT_EQ(GradBucketer::Create(&comm, &dev, compute.get(), o).status().code(), StatusCode::kInvalidArgument);
    return Status();
  }).ok());
}

}  // namespace
}  // namespace zrt
