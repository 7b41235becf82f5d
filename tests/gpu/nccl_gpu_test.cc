// NcclCommunicator on GPUs, one rank per GPU (mpirun -np N with N <= GPUs; CI has none: skipped):
// collectives on device buffers in f32/bf16/f16 against exact expected values, host buffers through
// staging, ordering against the compute stream with no host synchronisation, splits, mismatched
// arguments, and the watchdog turning a stuck collective into an error instead of a hang.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "zrt/core/cuda_status.h"
#include "tests/gpu/nccl_fixture.h"
#include "tests/gpu/spin.h"

namespace zrt {
namespace {

using testing::DeviceArray;

class NcclTest : public testing::NcclFixture {
 protected:
  // This rank's GPU.
  CudaDevice* dev() { return gpu_.get(); }
};

TEST_F(NcclTest, CollectivesOnDeviceBuffersAreExact) {
  const size_t n = 1000003;  // not divisible by any world size > 1
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(DTypeName(t));
    const size_t es = DTypeSize(t);
    // Small integers: every sum is exact in every dtype, whatever the order.
    std::vector<char> host(n * es * static_cast<size_t>(size()));
    for (size_t i = 0; i < n * static_cast<size_t>(size()); ++i) StoreFromFloat(host.data(), static_cast<int64_t>(i), t, static_cast<float>((i + static_cast<size_t>(rank())) % 7));
    auto in = dev()->Allocate(host.size(), MemCategory::kCommunication);
    auto out = dev()->Allocate(host.size(), MemCategory::kCommunication);
    ASSERT_TRUE(in.ok() && out.ok());
    ASSERT_TRUE(dev()->Copy(in->data(), host.data(), host.size()).ok());

    auto expect_sum = [&](size_t i) {
      float s = 0;
      for (int r = 0; r < size(); ++r) s += static_cast<float>((i + static_cast<size_t>(r)) % 7);
      return s;
    };
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
      auto h = nccl_->AllReduceAsync(in->data(), out->data(), n, t, op);
      ASSERT_TRUE(h.ok()) << h.status();
      ASSERT_TRUE(h->Wait().ok());
      std::vector<char> got(n * es);
      ASSERT_TRUE(dev()->Copy(got.data(), out->data(), got.size()).ok());
      for (size_t i = 0; i < n; i += 9973) {
        float want = expect_sum(i);
        if (op == ReduceOp::kMax) {
          want = 0;
          for (int r = 0; r < size(); ++r) want = std::max(want, static_cast<float>((i + static_cast<size_t>(r)) % 7));
        }
        ASSERT_EQ(LoadAsFloat(got.data(), static_cast<int64_t>(i), t), want) << ReduceOpName(op) << " at " << i;
      }
    }
    // Reduce-scatter (sum) of size() blocks of n: rank r gets block r.
    ASSERT_TRUE(nccl_->ReduceScatter(in->data(), out->data(), n, t, ReduceOp::kSum).ok());
    std::vector<char> got(n * es);
    ASSERT_TRUE(dev()->Copy(got.data(), out->data(), got.size()).ok());
    for (size_t i = 0; i < n; i += 7919) {
      ASSERT_EQ(LoadAsFloat(got.data(), static_cast<int64_t>(i), t), expect_sum(static_cast<size_t>(rank()) * n + i)) << i;
    }
    // All-gather: block r comes from rank r.
    ASSERT_TRUE(nccl_->AllGather(in->data(), out->data(), n, t).ok());
    std::vector<char> all(host.size());
    ASSERT_TRUE(dev()->Copy(all.data(), out->data(), all.size()).ok());
    for (int r = 0; r < size(); ++r) {
      for (size_t i = 0; i < n; i += 7919) {
        ASSERT_EQ(LoadAsFloat(all.data(), static_cast<int64_t>(static_cast<size_t>(r) * n + i), t),
                  static_cast<float>((i + static_cast<size_t>(r)) % 7)) << "block " << r << " at " << i;
      }
    }
    // Broadcast from the last rank, in place.
    ASSERT_TRUE(nccl_->Broadcast(in->data(), n, t, size() - 1).ok());
    ASSERT_TRUE(dev()->Copy(got.data(), in->data(), got.size()).ok());
    for (size_t i = 0; i < n; i += 7919) {
      ASSERT_EQ(LoadAsFloat(got.data(), static_cast<int64_t>(i), t), static_cast<float>((i + static_cast<size_t>(size() - 1)) % 7));
    }
  }
  // Average (f32; 1/N is exact for powers of two, so compare with a tolerance).
  std::vector<float> v(4096, static_cast<float>(rank() + 1));
  DeviceArray<float> d(v);
  ASSERT_TRUE(nccl_->AllReduce(d.get(), d.get(), v.size(), DType::kF32, ReduceOp::kAvg).ok());
  ASSERT_EQ(cudaStreamSynchronize(dev()->stream()), cudaSuccess);
  for (float x : d.Download()) ASSERT_NEAR(x, (size() + 1) / 2.0f, 1e-5f);
}

TEST_F(NcclTest, HostBuffersAreStaged) {
  std::vector<float> v = {1.0f * static_cast<float>(rank()), 2, 3};
  ASSERT_TRUE(nccl_->AllReduce(v.data(), v.data(), v.size(), DType::kF32, ReduceOp::kSum).ok());
  EXPECT_EQ(v[0], static_cast<float>(size() * (size() - 1) / 2));
  EXPECT_EQ(v[2], 3.0f * static_cast<float>(size()));
  ASSERT_TRUE(nccl_->Barrier().ok());
  int64_t id = rank() == 0 ? 424242 : 0;
  ASSERT_TRUE(nccl_->Broadcast(&id, sizeof(id), DType::kBytes, 0).ok());
  EXPECT_EQ(id, 424242);
  // AgreeOnStatus (the engine's and the checkpointer's control messages) over NCCL.
  const Status s = AgreeOnStatus(nccl_.get(), rank() == size() - 1 ? Status(StatusCode::kIo, "disk full") : Status());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("disk full"), std::string::npos) << s;
}

TEST_F(NcclTest, CollectivesFollowTheComputeStreamWithoutHostWaits) {
  // The compute stream: a long kernel, then the input is written; the all-reduce must see the write.
  const size_t n = 1 << 20;
  auto buf = dev()->Allocate(n * 4, MemCategory::kCommunication);
  ASSERT_TRUE(buf.ok());
  float* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(&pinned, n * 4), cudaSuccess);
  for (size_t i = 0; i < n; ++i) pinned[i] = 1.0f;
  ASSERT_TRUE(dev()->Fill(buf->data(), 0, n * 4).ok());
  ASSERT_EQ(testing::LaunchSpinCycles(200'000'000, dev()->stream()), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(buf->data(), pinned, n * 4, cudaMemcpyHostToDevice, dev()->stream()), cudaSuccess);
  auto h = nccl_->AllReduceAsync(buf->data(), buf->data(), n, DType::kF32, ReduceOp::kSum);
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_TRUE(h->Wait().ok());  // orders the compute stream; the host does not block
  ASSERT_EQ(cudaMemcpyAsync(pinned, buf->data(), n * 4, cudaMemcpyDeviceToHost, dev()->stream()), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(dev()->stream()), cudaSuccess);
  for (size_t i = 0; i < n; i += 4099) ASSERT_EQ(pinned[i], static_cast<float>(size())) << i;
  cudaFreeHost(pinned);
}

TEST_F(NcclTest, SplitsIntoSubGroups) {
  auto sub = nccl_->Split(rank() % 2, -rank());  // reversed order inside each group
  ASSERT_TRUE(sub.ok()) << sub.status();
  ASSERT_NE(*sub, nullptr);
  const int members = (size() + 1 - rank() % 2) / 2;
  EXPECT_EQ((*sub)->size(), members);
  EXPECT_EQ((*sub)->backend(), "nccl");
  float x = static_cast<float>(rank());
  ASSERT_TRUE((*sub)->AllReduce(&x, &x, 1, DType::kF32, ReduceOp::kSum).ok());
  float want = 0;
  for (int r = rank() % 2; r < size(); r += 2) want += static_cast<float>(r);
  EXPECT_EQ(x, want);
  auto none = nccl_->Split(rank() == 0 ? -1 : 0, 0);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(*none == nullptr, rank() == 0);
}

TEST_F(NcclTest, MismatchedArgumentsAreAnErrorOnEveryRank) {
  if (size() < 2) GTEST_SKIP() << "needs two ranks (two GPUs)";
  auto buf = dev()->Allocate(64 * 4, MemCategory::kCommunication);
  ASSERT_TRUE(buf.ok());
  auto h = nccl_->AllReduceAsync(buf->data(), buf->data(), rank() == 0 ? 16 : 32, DType::kF32, ReduceOp::kSum);
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.status().message().find("disagree on count"), std::string::npos) << h.status();
  ASSERT_TRUE(nccl_->AllReduce(buf->data(), buf->data(), 64, DType::kF32, ReduceOp::kSum).ok());  // still usable
}

TEST_F(NcclTest, AStuckCollectiveTimesOutInsteadOfHanging) {
  auto c = NcclCommunicator::Create(mpi_.get(), dev(), {.timeout_seconds = 0.5});
  ASSERT_TRUE(c.ok()) << c.status();
  int* flag = nullptr;
  ASSERT_EQ(cudaHostAlloc(&flag, sizeof(int), cudaHostAllocMapped), cudaSuccess);
  *flag = 0;
  int* dflag = nullptr;
  ASSERT_EQ(cudaHostGetDevicePointer(&dflag, flag, 0), cudaSuccess);
  auto buf = dev()->Allocate(1024 * 4, MemCategory::kCommunication);
  ASSERT_TRUE(buf.ok());
  // The compute stream is held up, so the collective (which waits for it) cannot finish.
  ASSERT_EQ(testing::LaunchSpinUntil(dflag, dev()->stream()), cudaSuccess);
  (*c)->set_check_args(false);
  auto h = (*c)->AllReduceAsync(buf->data(), buf->data(), 1024, DType::kF32, ReduceOp::kSum);
  ASSERT_TRUE(h.ok()) << h.status();
  for (int i = 0; i < 100 && (*c)->error().ok(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const Status err = (*c)->error();
  ASSERT_FALSE(err.ok()) << "no timeout after 5 s";
  EXPECT_NE(err.message().find("all_reduce #"), std::string::npos) << err;
  EXPECT_NE(err.message().find("rank " + std::to_string(rank())), std::string::npos) << err;
  EXPECT_FALSE(h->Wait().ok());
  *flag = 1;  // let the compute stream go
  ASSERT_EQ(cudaStreamSynchronize(dev()->stream()), cudaSuccess);
  // Sticky: the aborted communicator refuses further work with the same message.
  auto again = (*c)->AllReduceAsync(buf->data(), buf->data(), 1024, DType::kF32, ReduceOp::kSum);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().message(), err.message());
  c->reset();
  cudaFreeHost(flag);
  // The first communicator is unaffected.
  float x = 1;
  ASSERT_TRUE(nccl_->AllReduce(&x, &x, 1, DType::kF32, ReduceOp::kSum).ok());
  EXPECT_EQ(x, static_cast<float>(size()));
}

}  // namespace
}  // namespace zrt
