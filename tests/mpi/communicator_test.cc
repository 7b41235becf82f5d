// Every MPI collective against a serial reference on random data, at 1..4 ranks, with odd element
// counts, bf16/f16 (f32 accumulation), async handles, sub-group splits and mismatched arguments.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <random>

#include "zrt/core/mpi_communicator.h"
#include "tests/support/reference.h"
#include "tests/support/shift_cases.h"

namespace zrt {
namespace {

class CommTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto c = MpiCommunicator::Create(MPI_COMM_WORLD);
    ASSERT_TRUE(c.ok()) << c.status();
    comm_ = std::move(*c);
    // Same seed on every rank, so each rank can generate every other rank's input as a reference.
    uint64_t seed = testing::TestSeed();
    ASSERT_TRUE(comm_->Broadcast(&seed, sizeof(seed), DType::kBytes, 0).ok());
    seed_ = seed;
  }
  // Input of rank r for test case `tag`: deterministic from (seed, r, tag).
  std::vector<float> Input(int r, size_t n, int tag) const {
    std::mt19937_64 rng(seed_ * 1000003 + static_cast<uint64_t>(r) * 7919 + static_cast<uint64_t>(tag));
    return testing::RandomFloats(n, rng, 4.0f);
  }
  int rank() const { return comm_->rank(); }
  int size() const { return comm_->size(); }

  std::unique_ptr<MpiCommunicator> comm_;
  uint64_t seed_ = 0;
};

constexpr size_t kCounts[] = {0, 1, 7, 1001, 65537};

double Reduce(const std::vector<std::vector<float>>& in, size_t i, ReduceOp op) {
  double acc = in[0][i];
  for (size_t r = 1; r < in.size(); ++r) {
    const double v = in[r][i];
    acc = op == ReduceOp::kMax ? std::max(acc, v) : op == ReduceOp::kMin ? std::min(acc, v) : acc + v;
  }
  return op == ReduceOp::kAvg ? acc / static_cast<double>(in.size()) : acc;
}

void ExpectClose(double want, float got, double scale, const char* what, size_t i) {
  ASSERT_NEAR(got, want, 1e-6 * scale + 1e-30) << what << " element " << i;
}

TEST_F(CommTest, RankSizeBarrier) {
  int wr = 0, ws = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &wr);
  MPI_Comm_size(MPI_COMM_WORLD, &ws);
  EXPECT_EQ(rank(), wr);
  EXPECT_EQ(size(), ws);
  EXPECT_EQ(comm_->backend(), "mpi");
  EXPECT_TRUE(comm_->Barrier().ok());
}

TEST_F(CommTest, BroadcastFromEveryRoot) {
  for (int root = 0; root < size(); ++root) {
    for (size_t n : kCounts) {
      std::vector<float> buf = rank() == root ? Input(root, n, 1) : std::vector<float>(n, -1.0f);
      ASSERT_TRUE(comm_->Broadcast(buf.data(), n, DType::kF32, root).ok());
      ASSERT_EQ(buf, Input(root, n, 1));
    }
  }
}

TEST_F(CommTest, AllReduceF32AllOps) {
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
    for (size_t n : kCounts) {
      std::vector<std::vector<float>> all;
      for (int r = 0; r < size(); ++r) all.push_back(Input(r, n, 2));
      std::vector<float> out(n, std::nanf(""));
      ASSERT_TRUE(comm_->AllReduce(all[static_cast<size_t>(rank())].data(), out.data(), n, DType::kF32, op).ok());
      for (size_t i = 0; i < n; ++i) ExpectClose(Reduce(all, i, op), out[i], 4.0 * size(), "all_reduce", i);
      // In place gives the same result.
      std::vector<float> inplace = all[static_cast<size_t>(rank())];
      ASSERT_TRUE(comm_->AllReduce(inplace.data(), inplace.data(), n, DType::kF32, op).ok());
      ASSERT_EQ(inplace, out) << ReduceOpName(op);
    }
  }
}

TEST_F(CommTest, AllReduceHalfTypesAccumulateInF32) {
  for (DType t : {DType::kBF16, DType::kF16}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
      const size_t n = 1001;
      std::vector<std::vector<float>> all;  // inputs already representable in t
      for (int r = 0; r < size(); ++r) {
        auto v = Input(r, n, 3);
        for (float& x : v) {
          x = t == DType::kBF16 ? Bf16ToFloat(FloatToBf16(x)) : F16ToFloat(FloatToF16(x));
        }
        all.push_back(v);
      }
      std::vector<uint16_t> in(n), out(n);
      for (size_t i = 0; i < n; ++i) StoreFromFloat(in.data(), static_cast<int64_t>(i), t, all[static_cast<size_t>(rank())][i]);
      ASSERT_TRUE(comm_->AllReduce(in.data(), out.data(), n, t, op).ok());
      for (size_t i = 0; i < n; ++i) {
        const double want = Reduce(all, i, op);
        const float got = LoadAsFloat(out.data(), static_cast<int64_t>(i), t);
        // One rounding at the end: within half a unit in the last place of t (plus f32 sum noise).
        const double ulp = std::abs(want) * (t == DType::kBF16 ? 1.0 / 128 : 1.0 / 1024) + 1e-6;
        ASSERT_NEAR(got, want, ulp) << DTypeName(t) << " " << ReduceOpName(op) << " element " << i;
      }
    }
  }
}

// 16-bit sums carry 16-bit values on the wire and are exactly the rank-order f32 sum rounded once,
// the same bits on every rank (an all-reduce of a count the group does not divide, in place too).
TEST_F(CommTest, HalfTypeSumsAreTheRankOrderF32SumRoundedOnceOnEveryRank) {
  for (DType t : {DType::kBF16, DType::kF16}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{1001}}) {
        std::vector<std::vector<uint16_t>> all(static_cast<size_t>(size()), std::vector<uint16_t>(n * static_cast<size_t>(size())));
        for (int r = 0; r < size(); ++r) {
          const auto v = Input(r, n * static_cast<size_t>(size()), 3);
          for (size_t i = 0; i < v.size(); ++i) all[static_cast<size_t>(r)][i] = t == DType::kBF16 ? FloatToBf16(v[i]) : FloatToF16(v[i]);
        }
        auto want = [&](size_t i) {
          float sum = 0;
          for (int r = 0; r < size(); ++r) sum += LoadAsFloat(all[static_cast<size_t>(r)].data(), static_cast<int64_t>(i), t);
          if (op == ReduceOp::kAvg) sum /= static_cast<float>(size());
          return t == DType::kBF16 ? FloatToBf16(sum) : FloatToF16(sum);
        };
        std::vector<uint16_t> mine = all[static_cast<size_t>(rank())];
        ASSERT_TRUE(comm_->AllReduce(mine.data(), mine.data(), n, t, op).ok());  // in place: the first n
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(mine[i], want(i)) << DTypeName(t) << " all_reduce element " << i;
        std::vector<uint16_t> part(n);
        ASSERT_TRUE(comm_->ReduceScatter(all[static_cast<size_t>(rank())].data(), part.data(), n, t, op).ok());
        for (size_t i = 0; i < n; ++i) {
          ASSERT_EQ(part[i], want(static_cast<size_t>(rank()) * n + i)) << DTypeName(t) << " reduce_scatter element " << i;
        }
      }
    }
  }
}

TEST_F(CommTest, ReduceScatterF32AndBf16OddCounts) {
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
    for (size_t n : kCounts) {  // n = elements per rank block
      const size_t total = n * static_cast<size_t>(size());
      std::vector<std::vector<float>> all;
      for (int r = 0; r < size(); ++r) all.push_back(Input(r, total, 4));
      std::vector<float> out(n, std::nanf(""));
      ASSERT_TRUE(comm_->ReduceScatter(all[static_cast<size_t>(rank())].data(), out.data(), n, DType::kF32, op).ok());
      for (size_t i = 0; i < n; ++i) {
        ExpectClose(Reduce(all, static_cast<size_t>(rank()) * n + i, op), out[i], 4.0 * size(), "reduce_scatter", i);
      }
      std::vector<uint16_t> in16(total), out16(n);
      for (size_t i = 0; i < total; ++i) in16[i] = FloatToBf16(all[static_cast<size_t>(rank())][i]);
      ASSERT_TRUE(comm_->ReduceScatter(in16.data(), out16.data(), n, DType::kBF16, op).ok());
      for (size_t i = 0; i < n; ++i) {
        double want = 0;
        for (int r = 0; r < size(); ++r) {
          want += Bf16ToFloat(FloatToBf16(all[static_cast<size_t>(r)][static_cast<size_t>(rank()) * n + i]));
        }
        if (op == ReduceOp::kAvg) want /= size();
        ASSERT_NEAR(Bf16ToFloat(out16[i]), want, std::abs(want) / 128 + 1e-6) << i;
      }
    }
  }
}

TEST_F(CommTest, AllGatherTypesAndInPlace) {
  for (size_t n : kCounts) {
    const size_t total = n * static_cast<size_t>(size());
    std::vector<float> out(total, std::nanf(""));
    auto mine = Input(rank(), n, 5);
    ASSERT_TRUE(comm_->AllGather(mine.data(), out.data(), n, DType::kF32).ok());
    for (int r = 0; r < size(); ++r) {
      auto want = Input(r, n, 5);
      ASSERT_TRUE(std::equal(want.begin(), want.end(), out.begin() + static_cast<ptrdiff_t>(r * n))) << "block " << r;
    }
    // In place: this rank's block already sits in the output.
    std::vector<float> inplace(total, 0.0f);
    std::copy(mine.begin(), mine.end(), inplace.begin() + static_cast<ptrdiff_t>(static_cast<size_t>(rank()) * n));
    ASSERT_TRUE(comm_->AllGather(inplace.data() + static_cast<size_t>(rank()) * n, inplace.data(), n, DType::kF32).ok());
    ASSERT_EQ(inplace, out);
    // Raw bytes (odd count) and bf16.
    std::vector<uint8_t> b(n + 3, static_cast<uint8_t>(rank() + 1)), bout((n + 3) * static_cast<size_t>(size()));
    ASSERT_TRUE(comm_->AllGather(b.data(), bout.data(), n + 3, DType::kBytes).ok());
    for (size_t i = 0; i < bout.size(); ++i) ASSERT_EQ(bout[i], i / (n + 3) + 1);
  }
}

TEST_F(CommTest, AsyncHandlesOverlapAndCompleteOutOfOrder) {
  const size_t n = 4099;
  std::vector<std::vector<float>> a, g;
  for (int r = 0; r < size(); ++r) {
    a.push_back(Input(r, n, 6));
    g.push_back(Input(r, n, 7));
  }
  std::vector<float> ar(n), ag(n * static_cast<size_t>(size()));
  std::vector<uint16_t> bf_in(n), bf_out(n);
  for (size_t i = 0; i < n; ++i) bf_in[i] = FloatToBf16(a[static_cast<size_t>(rank())][i]);
  auto h1 = comm_->AllReduceAsync(a[static_cast<size_t>(rank())].data(), ar.data(), n, DType::kF32, ReduceOp::kSum);
  auto h2 = comm_->AllGatherAsync(g[static_cast<size_t>(rank())].data(), ag.data(), n, DType::kF32);
  auto h3 = comm_->AllReduceAsync(bf_in.data(), bf_out.data(), n, DType::kBF16, ReduceOp::kSum);
  ASSERT_TRUE(h1.ok() && h2.ok() && h3.ok());
  // Poll the gather until done, then wait the others in reverse order.
  for (;;) {
    auto done = h2->Test();
    ASSERT_TRUE(done.ok());
    if (*done) break;
  }
  EXPECT_FALSE(h2->pending());
  ASSERT_TRUE(h3->Wait().ok());
  ASSERT_TRUE(h1->Wait().ok());
  ASSERT_TRUE(h1->Wait().ok());  // idempotent
  for (size_t i = 0; i < n; ++i) ExpectClose(Reduce(a, i, ReduceOp::kSum), ar[i], 4.0 * size(), "async", i);
  for (int r = 0; r < size(); ++r) {
    ASSERT_TRUE(std::equal(g[static_cast<size_t>(r)].begin(), g[static_cast<size_t>(r)].end(),
                           ag.begin() + static_cast<ptrdiff_t>(static_cast<size_t>(r) * n)));
  }
  for (size_t i = 0; i < n; ++i) ASSERT_NEAR(Bf16ToFloat(bf_out[i]), ar[i], std::abs(ar[i]) / 64 + 0.05);
}

TEST_F(CommTest, SplitIntoSubGroups) {
  // Even and odd ranks, ordered by descending rank through the key.
  auto sub = comm_->Split(rank() % 2, -rank());
  ASSERT_TRUE(sub.ok()) << sub.status();
  ASSERT_NE(*sub, nullptr);
  Communicator& c = **sub;
  const int members = (size() - rank() % 2 + 1) / 2;
  EXPECT_EQ(c.size(), members);
  // Sub-rank 0 is the highest world rank of the same parity.
  int highest = rank();
  while (highest + 2 < size()) highest += 2;
  EXPECT_EQ(c.rank(), (highest - rank()) / 2);
  float v = static_cast<float>(rank());
  ASSERT_TRUE(c.AllReduce(&v, &v, 1, DType::kF32, ReduceOp::kSum).ok());
  float want = 0;
  for (int r = rank() % 2; r < size(); r += 2) want += static_cast<float>(r);
  EXPECT_EQ(v, want);
  // A negative color leaves a rank out.
  auto partial = comm_->Split(rank() == 0 ? -1 : 0, 0);
  ASSERT_TRUE(partial.ok());
  EXPECT_EQ(*partial == nullptr, rank() == 0);
  if (*partial) {
    EXPECT_EQ((*partial)->size(), size() - 1);
  }
}

TEST_F(CommTest, ShiftSendsToTheRankDistanceAwayWithPerRankSizes) {
  // Sizes differ per rank (rank r sends 1000 * (r + 1) + 3 bytes); every distance, negative ones too.
  auto bytes_of = [](int r) { return static_cast<size_t>(1000 * (r + 1) + 3); };
  for (int d : {0, 1, -1, 2, size() + 1}) {
    const int to = ((rank() + d) % size() + size()) % size(), from = ((rank() - d) % size() + size()) % size();
    std::vector<char> out(bytes_of(rank())), in(bytes_of(from), 0);
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<char>(rank() * 31 + i * 7);
    ASSERT_TRUE(comm_->Shift(out.data(), out.size(), in.data(), in.size(), d).ok()) << "distance " << d;
    for (size_t i = 0; i < in.size(); ++i) ASSERT_EQ(in[i], static_cast<char>(from * 31 + i * 7)) << "distance " << d << " byte " << i;
    (void)to;
  }
  // Nothing to send or receive on some ranks: 0 bytes both ways.
  std::vector<char> buf(8, 1);
  ASSERT_TRUE(comm_->Shift(buf.data(), 0, buf.data(), 0, 1).ok());
  // Async, overlapping an all-reduce.
  std::vector<char> out(65537, static_cast<char>(rank())), in(65537, -1);
  auto h = comm_->ShiftAsync(out.data(), out.size(), in.data(), in.size(), 1);
  ASSERT_TRUE(h.ok()) << h.status();
  float v = 1;
  ASSERT_TRUE(comm_->AllReduce(&v, &v, 1, DType::kF32, ReduceOp::kSum).ok());
  ASSERT_TRUE(h->Wait().ok());
  EXPECT_EQ(in[65536], static_cast<char>((rank() - 1 + size()) % size()));
  if (size() > 1) {
    // Sizes that disagree are an error on every rank, never a truncation or an overrun; and ranks that
    // disagree on the distance are refused on every rank.
    Status s = comm_->Shift(out.data(), 16, in.data(), rank() == 0 ? 8 : 16, 1);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
    if (rank() == 0) {
      EXPECT_NE(s.message().find("expects 8"), std::string_view::npos) << s;
    }
    s = comm_->Shift(out.data(), 0, in.data(), 0, rank() == 0 ? 1 : 2);
    if (size() > 2) {
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
    }
    ASSERT_TRUE(comm_->Barrier().ok());
  }
}

TEST_F(CommTest, ShiftVChecksEveryPieceAtOnceAndMovesThemAll) {
  const Status s = testing::ShiftVCases(*comm_);
  EXPECT_TRUE(s.ok()) << s;
}

TEST_F(CommTest, AllToAllSendsEachRankItsBlock) {
  const Status s = testing::AllToAllCases(*comm_);
  EXPECT_TRUE(s.ok()) << s;
}

TEST_F(CommTest, MismatchedArgumentsAreAnErrorOnEveryRank) {
  if (size() == 1) GTEST_SKIP() << "needs two ranks to disagree";
  std::vector<float> buf(64, 1.0f);
  const size_t n = rank() == size() - 1 ? 17 : 16;
  Status s = comm_->AllReduce(buf.data(), buf.data(), n, DType::kF32, ReduceOp::kSum);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("count"), std::string_view::npos) << s;
  const DType t = rank() == 0 ? DType::kBF16 : DType::kF32;
  s = comm_->AllGather(buf.data(), buf.data() + 32, 4, t);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("dtype"), std::string_view::npos) << s;
  // The same count, dtype and op, but another collective: refused too (it would hang or corrupt).
  if (rank() == 0) {
    s = comm_->AllReduce(buf.data(), buf.data(), 4, DType::kF32, ReduceOp::kSum);
  } else {
    s = comm_->ReduceScatter(buf.data(), buf.data() + 32, 4, DType::kF32, ReduceOp::kSum);
  }
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("disagree on the collective"), std::string_view::npos) << s;
  EXPECT_NE(s.message().find(rank() == 0 ? "this rank all_reduce" : "this rank reduce_scatter"), std::string_view::npos) << s;
  // The communicator is still usable afterwards.
  float v = 1.0f;
  ASSERT_TRUE(comm_->AllReduce(&v, &v, 1, DType::kF32, ReduceOp::kSum).ok());
  EXPECT_EQ(v, static_cast<float>(size()));
}

TEST_F(CommTest, LocalBadArgumentsAreRejectedBeforeCommunicating) {
  float x = 0;
  EXPECT_EQ(comm_->Broadcast(&x, 1, DType::kF32, size()).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(comm_->AllReduce(&x, &x, 1, DType::kBytes, ReduceOp::kSum).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(comm_->ReduceScatter(&x, &x, 1, DType::kF32, ReduceOp::kMax).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(comm_->AllReduce(nullptr, &x, 1, DType::kF32, ReduceOp::kSum).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(comm_->AllGather(&x, &x, size_t{1} << 31, DType::kF32).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(comm_->Barrier().ok());
}

TEST_F(CommTest, MpiErrorCodesMapToStatusWithText) {
  Status s = MpiStatus(MPI_ERR_TRUNCATE, "gather");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_GT(s.message().size(), std::string_view("gather: MPI error 15").size() - 4) << s;
  EXPECT_EQ(MpiStatus(MPI_ERR_NO_MEM, "").code(), StatusCode::kOutOfMemory);
}

TEST_F(CommTest, WrapsAnExistingCommunicator) {
  auto self = MpiCommunicator::Create(MPI_COMM_SELF);
  ASSERT_TRUE(self.ok());
  EXPECT_EQ((*self)->size(), 1);
  float v = 3;
  ASSERT_TRUE((*self)->AllReduce(&v, &v, 1, DType::kF32, ReduceOp::kSum).ok());
  EXPECT_EQ(v, 3);
  EXPECT_EQ(MpiCommunicator::Create(MPI_COMM_NULL).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zrt
