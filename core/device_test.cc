#include "zrt/core/device.h"

#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

namespace zrt {
namespace {

TEST(CpuDevice, AllocatesAlignedAndAccounts) {
  CpuDevice dev;
  {
    auto a = dev.Allocate(1000, MemCategory::kParameters);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data()) % 64, 0u);
    auto b = dev.Allocate(8192, MemCategory::kStaging, 4096);
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data()) % 4096, 0u);
    auto snap = dev.memory().Read();
    EXPECT_EQ(snap.current_of(MemCategory::kParameters), 1000);
    EXPECT_EQ(snap.current_of(MemCategory::kStaging), 8192);
    EXPECT_EQ(snap.total_current, 9192);
    // Moving transfers ownership; the moved-from handle frees nothing.
    DeviceBuffer moved = std::move(*a);
    EXPECT_EQ(moved.size(), 1000u);
    EXPECT_EQ(dev.memory().Read().total_current, 9192);
    moved.Reset();
    EXPECT_EQ(dev.memory().Read().current_of(MemCategory::kParameters), 0);
  }
  auto snap = dev.memory().Read();
  EXPECT_EQ(snap.total_current, 0);
  EXPECT_EQ(snap.total_peak, 9192);
  EXPECT_EQ(snap.peak_of(MemCategory::kStaging), 8192);
  dev.memory().ResetPeaks();
  EXPECT_EQ(dev.memory().Read().total_peak, 0);
  EXPECT_NE(snap.ToString().find("parameters"), std::string::npos);
}

TEST(CpuDevice, CopyFillAndZeroSize) {
  CpuDevice dev;
  auto a = dev.Allocate(64, MemCategory::kOther);
  auto b = dev.Allocate(64, MemCategory::kOther);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(dev.Fill(a->data(), 0xab, 64).ok());
  ASSERT_TRUE(dev.Copy(b->data(), a->data(), 64).ok());
  EXPECT_EQ(b->as<uint8_t>()[63], 0xab);
  auto z = dev.Allocate(0, MemCategory::kOther);
  ASSERT_TRUE(z.ok());
  EXPECT_TRUE(z->empty());
  EXPECT_EQ(dev.Copy(nullptr, a->data(), 4).code(), StatusCode::kInvalidArgument);
}

TEST(CpuDevice, BadAlignmentAndHugeAllocationAreErrors) {
  CpuDevice dev;
  EXPECT_EQ(dev.Allocate(16, MemCategory::kOther, 48).status().code(), StatusCode::kInvalidArgument);
  auto huge = dev.Allocate(size_t{1} << 62, MemCategory::kOptimizerState);
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), StatusCode::kOutOfMemory);
  EXPECT_NE(huge.status().message().find("optimizer_state"), std::string_view::npos);
  EXPECT_EQ(dev.memory().Read().total_current, 0);
}

TEST(MemoryTracker, ConcurrentUpdatesBalance) {
  MemoryTracker t;
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&t] {
      for (int k = 0; k < 10000; ++k) {
        t.Add(MemCategory::kGradients, 16);
        t.Sub(MemCategory::kGradients, 16);
      }
    });
  }
  for (auto& th : threads) th.join();
  auto s = t.Read();
  EXPECT_EQ(s.current_of(MemCategory::kGradients), 0);
  EXPECT_GE(s.peak_of(MemCategory::kGradients), 16);
  EXPECT_LE(s.peak_of(MemCategory::kGradients), 64);
}

TEST(FormatBytes, Units) {
  EXPECT_EQ(FormatBytes(17), "17 B");
  EXPECT_EQ(FormatBytes(1536), "1.50 KiB");
  EXPECT_EQ(FormatBytes(int64_t{3} << 30), "3.00 GiB");
}

}  // namespace
}  // namespace zrt
