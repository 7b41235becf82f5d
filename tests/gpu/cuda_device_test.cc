// CudaDevice on a GPU: cached allocation (a freed buffer is reused without cudaMalloc), accounting,
// synchronous and stream-ordered copies in every direction, fills, events ordering two streams,
// device choice by local rank. Skips without a GPU.
#include "zrt/core/cuda_device.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <vector>

#include "zrt/offload/host_memory.h"
#include "tests/gpu/gpu_test_util.h"

namespace zrt {
namespace {

TEST(CudaDeviceTest, CachesAllocationsAndAccounts) {
  ZRT_REQUIRE_GPU();
  auto dev = CudaDevice::Create();
  ASSERT_TRUE(dev.ok()) << dev.status();
  void* first = nullptr;
  {
    auto b = (*dev)->Allocate(3 << 20, MemCategory::kParameters);
    ASSERT_TRUE(b.ok()) << b.status();
    first = b->data();
    EXPECT_EQ((*dev)->memory().Read().current_of(MemCategory::kParameters), 3 << 20);
  }
  EXPECT_EQ((*dev)->memory().Read().current_of(MemCategory::kParameters), 0);
  auto again = (*dev)->Allocate(3 << 20, MemCategory::kGradients);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->data(), first);  // from the cache
  EXPECT_EQ((*dev)->allocator_stats().backend_allocs, 1);
  EXPECT_EQ((*dev)->allocator_stats().hits, 1);
}

TEST(CudaDeviceTest, CopiesAndFillsInEveryDirection) {
  ZRT_REQUIRE_GPU();
  auto dev = CudaDevice::Create();
  ASSERT_TRUE(dev.ok()) << dev.status();
  const size_t n = 1 << 20;
  std::vector<float> src(n), back(n, -1);
  for (size_t i = 0; i < n; ++i) src[i] = static_cast<float>(i) * 0.5f;
  auto a = (*dev)->Allocate(n * 4, MemCategory::kOther);
  auto b = (*dev)->Allocate(n * 4, MemCategory::kOther);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE((*dev)->Copy(a->data(), src.data(), n * 4).ok());       // H2D
  ASSERT_TRUE((*dev)->Copy(b->data(), a->data(), n * 4).ok());        // D2D
  ASSERT_TRUE((*dev)->Copy(back.data(), b->data(), n * 4).ok());      // D2H
  EXPECT_EQ(back, src);
  // Async through pinned host memory on a stream; an event orders a second stream after it.
  auto host = HostMemory::Create(0, "test");
  auto pinned = host->Allocate(n * 4, MemCategory::kStaging);
  ASSERT_TRUE(pinned.ok());
  auto s1 = CudaStream::Create(), s2 = CudaStream::Create();
  auto ev = CudaEvent::Create();
  ASSERT_TRUE(s1.ok() && s2.ok() && ev.ok());
  ASSERT_TRUE((*dev)->FillAsync(a->data(), 0x3f, n * 4, *s1).ok());
  ASSERT_TRUE(ev->Record(*s1).ok());
  ASSERT_TRUE(ev->MakeWait(*s2).ok());
  ASSERT_TRUE((*dev)->CopyAsync(pinned->data(), a->data(), n * 4, *s2).ok());
  ASSERT_TRUE(s2->Synchronize().ok());
  const auto* bytes = pinned->as<unsigned char>();
  for (size_t i = 0; i < n * 4; i += 4099) ASSERT_EQ(bytes[i], 0x3f) << i;
  auto done = ev->Done();
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(*done);
}

TEST(CudaDeviceTest, DeviceFollowsTheLocalRank) {
  ZRT_REQUIRE_GPU();
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  ::setenv("OMPI_COMM_WORLD_LOCAL_RANK", "3", 1);
  EXPECT_EQ(CudaDevice::LocalRank(), 3);
  auto dev = CudaDevice::Create();
  ::unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
  ASSERT_TRUE(dev.ok()) << dev.status();
  EXPECT_EQ((*dev)->ordinal(), 3 % count);
  EXPECT_FALSE(CudaDevice::Create(count).ok());
}

}  // namespace
}  // namespace zrt
