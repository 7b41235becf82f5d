// The in-process communicator behaves like the MPI one (tests/mpi/communicator_test.cc): exact
// collectives in every dtype with counts not divisible by the group, in place, mismatched arguments
// refused on every rank (the collective kind included), split, and a rank that never arrives is an
// error, not a hang.
#include "zrt/core/communicator.h"

#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <vector>

#include "tests/support/shift_cases.h"

namespace zrt {
namespace {

class LoopbackTest : public ::testing::TestWithParam<int> {};

TEST_P(LoopbackTest, CollectivesAreExactInEveryDtype) {
  const int n = GetParam();
  ASSERT_TRUE(RunLoopbackRanks(n, [n](Communicator& c) -> Status {
    const int r = c.rank();
    EXPECT_EQ(c.size(), n);
    for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
      const size_t count = 7;  // not a multiple of the group size
      std::vector<uint16_t> h(count * static_cast<size_t>(n));
      std::vector<float> f(count * static_cast<size_t>(n));
      auto set = [&](size_t i, float x) {
        if (t == DType::kF32) f[i] = x;
        else h[i] = t == DType::kBF16 ? FloatToBf16(x) : FloatToF16(x);
      };
      auto get = [&](size_t i) { return t == DType::kF32 ? f[i] : t == DType::kBF16 ? Bf16ToFloat(h[i]) : F16ToFloat(h[i]); };
      void* buf = t == DType::kF32 ? static_cast<void*>(f.data()) : static_cast<void*>(h.data());
      for (size_t i = 0; i < count; ++i) set(i, static_cast<float>(r + 1) * static_cast<float>(i));
      RETURN_IF_ERROR(c.AllReduce(buf, buf, count, t, ReduceOp::kSum));  // in place
      for (size_t i = 0; i < count; ++i) EXPECT_EQ(get(i), static_cast<float>(n * (n + 1) / 2) * static_cast<float>(i)) << i;
      for (size_t i = 0; i < count; ++i) set(i, static_cast<float>(r));
      RETURN_IF_ERROR(c.AllReduce(buf, buf, count, t, ReduceOp::kMax));
      EXPECT_EQ(get(0), static_cast<float>(n - 1));
      // Reduce-scatter: rank r gets the average of block r.
      for (size_t i = 0; i < count * static_cast<size_t>(n); ++i) set(i, static_cast<float>(2 * r) + static_cast<float>(i / count));
      std::vector<float> out(count);
      std::vector<uint16_t> out16(count);
      void* o = t == DType::kF32 ? static_cast<void*>(out.data()) : static_cast<void*>(out16.data());
      RETURN_IF_ERROR(c.ReduceScatter(buf, o, count, t, ReduceOp::kAvg));
      const float want = static_cast<float>(n - 1) + static_cast<float>(r);
      const float got = t == DType::kF32 ? out[0] : t == DType::kBF16 ? Bf16ToFloat(out16[0]) : F16ToFloat(out16[0]);
      EXPECT_EQ(got, want);
    }
    // All-gather with the send block aliasing the receive buffer's own block, and broadcast.
    std::vector<int32_t> g(3 * static_cast<size_t>(n), -1);
    for (int i = 0; i < 3; ++i) g[static_cast<size_t>(3 * r + i)] = 10 * r + i;
    RETURN_IF_ERROR(c.AllGather(g.data() + 3 * r, g.data(), 12, DType::kBytes));
    for (int k = 0; k < 3 * n; ++k) EXPECT_EQ(g[static_cast<size_t>(k)], 10 * (k / 3) + k % 3);
    int64_t v = r == n - 1 ? 42 : 0;
    RETURN_IF_ERROR(c.Broadcast(&v, sizeof(v), DType::kBytes, n - 1));
    EXPECT_EQ(v, 42);
    return c.Barrier();
  }).ok());
}

TEST_P(LoopbackTest, MismatchedArgumentsAndCollectivesAreRefusedOnEveryRank) {
  const int n = GetParam();
  if (n == 1) GTEST_SKIP() << "needs two ranks to disagree";
  std::atomic<int> refused{0};
  ASSERT_TRUE(RunLoopbackRanks(n, [&](Communicator& c) -> Status {
    std::vector<float> buf(64, 1.0f);
    Status s = c.AllReduce(buf.data(), buf.data(), c.rank() == 0 ? 5 : 4, DType::kF32, ReduceOp::kSum);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("disagree on count"), std::string_view::npos) << s;
    s = c.rank() == 0 ? c.AllReduce(buf.data(), buf.data(), 4, DType::kF32, ReduceOp::kSum)
                      : c.ReduceScatter(buf.data(), buf.data() + 32, 4, DType::kF32, ReduceOp::kSum);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
    if (s.message().find("disagree on the collective") != std::string_view::npos) ++refused;
    float x = 1;
    RETURN_IF_ERROR(c.AllReduce(&x, &x, 1, DType::kF32, ReduceOp::kSum));  // still usable
    EXPECT_EQ(x, static_cast<float>(n));
    return Status();
  }).ok());
  EXPECT_EQ(refused.load(), n);
}

TEST_P(LoopbackTest, ShiftMovesEachRanksBytesDistanceAway) {
  const int n = GetParam();
  ASSERT_TRUE(RunLoopbackRanks(n, [n](Communicator& c) -> Status {
    const int r = c.rank();
    for (int d : {0, 1, -1, n + 2}) {
      const int from = ((r - d) % n + n) % n;
      std::vector<char> out(static_cast<size_t>(100 + r), static_cast<char>(r)), in(static_cast<size_t>(100 + from), -1);
      RETURN_IF_ERROR(c.Shift(out.data(), out.size(), in.data(), in.size(), d));
      for (char x : in) EXPECT_EQ(x, static_cast<char>(from)) << "distance " << d;
    }
    if (n > 1) {  // a receive of the wrong size is refused
      std::vector<char> buf(16);
      Status s = c.Shift(buf.data(), 16, buf.data(), r == 0 ? 8 : 16, 1);
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;  // on every rank
    }
    return Status();
  }).ok());
}

TEST_P(LoopbackTest, ShiftVMovesEachRanksPiecesDistanceAway) {
  ASSERT_TRUE(RunLoopbackRanks(GetParam(), [](Communicator& c) { return testing::ShiftVCases(c); }).ok());
}

TEST_P(LoopbackTest, AllToAllSendsEachRankItsBlock) {
  ASSERT_TRUE(RunLoopbackRanks(GetParam(), [](Communicator& c) { return testing::AllToAllCases(c); }).ok());
}

TEST_P(LoopbackTest, SplitGroupsByColorOrderedByKey) {
  const int n = GetParam();
  ASSERT_TRUE(RunLoopbackRanks(n, [n](Communicator& c) -> Status {
    const int r = c.rank();
    // Odd and even ranks, reversed by key; the last rank leaves (negative color) when n > 2.
    const int color = n > 2 && r == n - 1 ? -1 : r % 2;
    ASSIGN_OR_RETURN(auto sub, c.Split(color, -r));
    if (color < 0) {
      EXPECT_EQ(sub, nullptr);
      return Status();
    }
    EXPECT_NE(sub, nullptr);
    int members = 0;
    for (int k = 0; k < n; ++k) members += (n > 2 && k == n - 1) ? 0 : (k % 2 == color);
    EXPECT_EQ(sub->size(), members);
    float one = 1;
    RETURN_IF_ERROR(sub->AllReduce(&one, &one, 1, DType::kF32, ReduceOp::kSum));
    EXPECT_EQ(one, static_cast<float>(members));
    int32_t top = r;
    RETURN_IF_ERROR(sub->Broadcast(&top, sizeof(top), DType::kBytes, 0));  // new rank 0: the highest old rank
    EXPECT_GE(top, r);
    return Status();
  }).ok());
}

TEST(Loopback, ARankThatNeverArrivesIsAnErrorNotAHang) {
  Status s = RunLoopbackRanks(3, [](Communicator& c) -> Status {
    if (c.rank() == 1) return Status();  // returns early: never enters the collective
    float x = 1;
    return c.AllReduce(&x, &x, 1, DType::kF32, ReduceOp::kSum);
  }, std::chrono::milliseconds(200));
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("did a rank return early"), std::string_view::npos) << s;
}

INSTANTIATE_TEST_SUITE_P(Ranks, LoopbackTest, ::testing::Values(1, 2, 3, 4));

}  // namespace
}  // namespace zrt
