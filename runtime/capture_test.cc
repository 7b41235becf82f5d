// The optimizer store's capture (runtime/capture.h), the one way a snapshot of the state is taken:
// for every placement (device memory, host memory, NVMe, with a frozen slot beside), what a sink
// receives is the state as it was when Capture was called, though an Update follows at once; the
// Update waits window by window for only what it is about to change, and tells the sink what it
// waited; a sink that fails ends its own capture only; Settle delivers NVMe state at once; a store
// destroyed with a capture still owed closes it with an error.
#include "zrt/runtime/optimizer_store.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "zrt/core/communicator.h"

namespace zrt {
namespace {

namespace fs = std::filesystem;

// Receives a capture: every part kept (checked: in order of offset per buffer, once), optionally slow
// or failing at its `fail_at`-th Put.
class RecordingSink final : public StateSink {
 public:
  RecordingSink(std::vector<std::vector<int64_t>> counts, std::chrono::microseconds delay = {}, int fail_at = -1)
      : delay_(delay), fail_at_(fail_at) {
    open_.store(true);
    for (auto& g : counts) {
      auto& v = data_.emplace_back();
      for (int64_t n : g) v.emplace_back(static_cast<size_t>(n), -7.0f);
      next_.emplace_back(g.size(), 0);
    }
  }
  Status Put(int g, int b, int64_t offset, int64_t n, const float* data) override {
    while (!open_.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::this_thread::sleep_for(delay_);
    std::lock_guard<std::mutex> lock(mu_);
    if (++puts_ == fail_at_) return DataLossError("sink failure");
    EXPECT_FALSE(closed_);
    int64_t& next = next_.at(static_cast<size_t>(g)).at(static_cast<size_t>(b));
    EXPECT_EQ(offset, next) << "group " << g << " buffer " << b;
    next = offset + n;
    std::copy(data, data + n, data_[static_cast<size_t>(g)][static_cast<size_t>(b)].begin() + offset);
    return Status();
  }
  void Waited(double seconds) override {
    std::lock_guard<std::mutex> lock(mu_);
    waited_ += seconds;
  }
  void Close(const Status& status) override {
    std::lock_guard<std::mutex> lock(mu_);
    EXPECT_FALSE(closed_) << "closed twice";
    closed_ = true;
    status_ = status;
  }
  // Whether every kind of group g's elements [0, end) was put.
  bool Has(int g, int64_t end) {
    std::lock_guard<std::mutex> lock(mu_);
    for (int64_t n : next_[static_cast<size_t>(g)]) {
      if (n < end) return false;
    }
    return true;
  }
  bool closed() {
    std::lock_guard<std::mutex> lock(mu_);
    return closed_;
  }
  Status status() {
    std::lock_guard<std::mutex> lock(mu_);
    return status_;
  }
  double waited() {
    std::lock_guard<std::mutex> lock(mu_);
    return waited_;
  }
  const std::vector<std::vector<std::vector<float>>>& data() const { return data_; }
  std::atomic<bool> open_;  // false: Put waits until it is set

 private:
  std::mutex mu_;
  std::chrono::microseconds delay_;
  int fail_at_, puts_ = 0;
  std::vector<std::vector<std::vector<float>>> data_;
  std::vector<std::vector<int64_t>> next_;
  bool closed_ = false;
  Status status_;
  double waited_ = 0;
};

struct Placement {
  const char* name;
  OffloadTarget optimizer, params;
  bool device_host_accessible;
};
const Placement kPlacements[] = {
    {"device", OffloadTarget::kNone, OffloadTarget::kNone, true},
    {"device_not_host_accessible", OffloadTarget::kNone, OffloadTarget::kNone, false},
    {"host", OffloadTarget::kHost, OffloadTarget::kNone, true},
    {"host_params_host", OffloadTarget::kHost, OffloadTarget::kHost, false},
    {"nvme", OffloadTarget::kNvme, OffloadTarget::kNone, true},
    {"nvme_params_nvme", OffloadTarget::kNvme, OffloadTarget::kNvme, true},
};

// One rank's store: two trainable slots (the first larger than a capture window) and a frozen one.
class Store {
 public:
  static constexpr int64_t kBig = (int64_t{1} << 20) * 2 + 777;  // three capture windows
  Store(Communicator& comm, const Placement& p, const fs::path& dir) : device_(p.device_host_accessible), host_(HostMemory::Create(0, "budget")) {
    shards_ = {kBig, 5000, 3001};
    compute_ = *Compute::For(&device_, {});
    host_compute_ = *Compute::For(host_.get(), {});
    OptimizerStore::Options o;
    o.offload.optimizer = p.optimizer;
    o.offload.params = p.params;
    o.offload.nvme_dir = dir.string();
    o.offload.sub_group_elements = 1 << 18;
    o.rank = comm.rank();
    auto s = OptimizerStore::Create(&comm, &device_, compute_.get(), host_.get(), host_compute_.get(), o);
    EXPECT_TRUE(s.ok()) << s.status();
    store_ = std::move(*s);
    std::vector<OptimizerStore::Group> groups;
    for (size_t g = 0; g < shards_.size(); ++g) {
      const auto n = static_cast<size_t>(shards_[g]);
      const bool frozen = g == 2;
      OptimizerStore::Group sg{"g" + std::to_string(g), DType::kBF16, DType::kF32, shards_[g], frozen, nullptr, nullptr, {}};
      if (!frozen) {
        grads_.push_back(*device_.Allocate(n * 4, MemCategory::kGradients));
        sg.grads = grads_.back().data();
      }
      if (!store_->holds_params()) {
        params_.push_back(*device_.Allocate(n * 2, MemCategory::kParameters));
        sg.params = params_.back().data();
      }
      sg.init = [g](int64_t off, int64_t count, float* out) {
        for (int64_t i = 0; i < count; ++i) out[i] = 0.25f * static_cast<float>(g) + 1e-3f * static_cast<float>((off + i) % 1000);
      };
      groups.push_back(std::move(sg));
    }
    Status init = store_->Init(std::move(groups));
    EXPECT_TRUE(init.ok()) << init;
  }
  OptimizerStore& operator*() { return *store_; }
  OptimizerStore* operator->() { return store_.get(); }
  void Destroy() { store_.reset(); }

  // Every buffer's counts, for a sink.
  std::vector<std::vector<int64_t>> Counts() {
    std::vector<std::vector<int64_t>> c;
    for (size_t g = 0; g < shards_.size(); ++g) c.emplace_back(store_->StateBuffers(static_cast<int>(g)).size(), shards_[g]);
    return c;
  }
  // Every buffer as it is now.
  std::vector<std::vector<std::vector<float>>> Now() {
    std::vector<std::vector<std::vector<float>>> out;
    for (size_t g = 0; g < shards_.size(); ++g) {
      auto& v = out.emplace_back();
      const size_t kinds = store_->StateBuffers(static_cast<int>(g)).size();
      for (size_t k = 0; k < kinds; ++k) {
        auto& b = v.emplace_back(static_cast<size_t>(shards_[g]));
        EXPECT_TRUE(store_->Read(static_cast<int>(g), static_cast<int>(k), 0, shards_[g], b.data()).ok());
      }
    }
    return out;
  }
  // One update that changes every element; `before(window)` runs first in each window.
  Status Update(const std::function<void(const OptimizerStore::Window&)>& before = {}) {
    return store_->Update([&](const OptimizerStore::Window& w) -> Status {
      if (before) before(w);
      for (int64_t i = 0; i < w.count; ++i) {
        w.master[i] += 1.0f;
        w.exp_avg[i] += 2.0f;
        w.exp_avg_sq[i] += 3.0f;
      }
      return w.compute->Cast(w.master, DType::kF32, w.params, DType::kBF16, w.count);
    });
  }

 private:
  CpuDevice device_;
  std::unique_ptr<HostMemory> host_;
  std::unique_ptr<Compute> compute_, host_compute_;
  std::vector<int64_t> shards_;
  std::vector<DeviceBuffer> grads_, params_;
  std::unique_ptr<OptimizerStore> store_;  // last: goes first
};

class CaptureTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("zrt_capture_" + std::to_string(::getpid()) + "_" + std::to_string(GetParam()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  const Placement& placement() const { return kPlacements[GetParam()]; }
  bool nvme() const { return placement().optimizer == OffloadTarget::kNvme; }
  // Runs fn on one in-process rank (the swapped store agrees on its outcomes).
  void OneRank(const std::function<void(Communicator&)>& fn) {
    Status s = RunLoopbackRanks(1, [&](Communicator& comm) -> Status {
      fn(comm);
      return Status();
    });
    ASSERT_TRUE(s.ok()) << s;
  }
  fs::path dir_;
};

TEST_P(CaptureTest, TheSinkGetsTheStateAsItWasThoughAnUpdateFollowsAtOnce) {
  OneRank([&](Communicator& comm) {
    Store store(comm, placement(), dir_);
    ASSERT_TRUE(store.Update().ok());
    const auto before = store.Now();
    auto sink = std::make_shared<RecordingSink>(store.Counts());
    ASSERT_TRUE(store->Capture(sink).ok());
    ASSERT_TRUE(store.Update().ok());  // at once: its windows wait for the capture (NVMe: hands it over)
    ASSERT_TRUE(store->Settle().ok());
    ASSERT_TRUE(sink->closed());
    ASSERT_TRUE(sink->status().ok()) << sink->status();
    EXPECT_TRUE(sink->data() == before) << placement().name << ": the capture is not the state at the call";
    EXPECT_NE(store.Now(), before) << "the update did change the state";
  });
}

// A slow sink: each window of the update starts once every kind of it was put, and before the whole
// capture is (training waits only for the part it is about to change); the wait is the sink's.
TEST_P(CaptureTest, TheUpdateWaitsWindowByWindowForWhatItChanges) {
  if (nvme()) GTEST_SKIP() << "NVMe state is handed over by the update itself";
  OneRank([&](Communicator& comm) {
    Store store(comm, placement(), dir_);
    auto sink = std::make_shared<RecordingSink>(store.Counts(), std::chrono::milliseconds(4));
    sink->open_ = false;  // nothing is put until the update has certainly begun
    ASSERT_TRUE(store->Capture(sink).ok());
    std::atomic<bool> updating{false};
    std::thread opener([&] {
      while (!updating.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      sink->open_ = true;
    });
    int windows = 0, early = 0;
    updating = true;
    const Status updated = store.Update([&](const OptimizerStore::Window& w) {
      ++windows;
      EXPECT_TRUE(sink->Has(w.group, w.offset + w.count)) << "group " << w.group << " window at " << w.offset << " before it was captured";
      early += sink->closed() ? 0 : 1;
    });
    opener.join();
    ASSERT_TRUE(updated.ok()) << updated;
    EXPECT_GE(windows, 4) << "the update worked in windows while the capture ran";
    EXPECT_GT(early, 0) << "every window waited for the whole capture";
    ASSERT_TRUE(store->Settle().ok());
    EXPECT_TRUE(sink->status().ok()) << sink->status();
    EXPECT_GT(sink->waited(), 0.0) << "the update's wait was not told to the sink";
    EXPECT_GT(store->TakeCaptureWait(), 0.0);
  });
}

// Two captures at once, the first failing at its second part: it is closed with its error, the other
// is whole, and the update is not affected.
TEST_P(CaptureTest, AFailingSinkEndsItsOwnCaptureOnly) {
  OneRank([&](Communicator& comm) {
    Store store(comm, placement(), dir_);
    const auto before = store.Now();
    auto bad = std::make_shared<RecordingSink>(store.Counts(), std::chrono::microseconds(0), 2);
    auto good = std::make_shared<RecordingSink>(store.Counts());
    ASSERT_TRUE(store->Capture(bad).ok());
    ASSERT_TRUE(store->Capture(good).ok());
    ASSERT_TRUE(store.Update().ok());
    ASSERT_TRUE(store->Settle().ok());
    ASSERT_TRUE(bad->closed() && good->closed());
    EXPECT_EQ(bad->status().code(), StatusCode::kDataLoss) << bad->status();
    ASSERT_TRUE(good->status().ok()) << good->status();
    EXPECT_TRUE(good->data() == before);
  });
}

// NVMe state owed to a capture is streamed at once by Settle (a save that cannot wait for the next
// step), and a write (a load) gets there only after every capture has what it was owed.
TEST_P(CaptureTest, SettleDeliversNowAndAWriteWaitsForEveryCapture) {
  OneRank([&](Communicator& comm) {
    Store store(comm, placement(), dir_);
    const auto before = store.Now();
    auto sink = std::make_shared<RecordingSink>(store.Counts(), std::chrono::microseconds(200));
    ASSERT_TRUE(store->Capture(sink).ok());
    const std::vector<float> twos(static_cast<size_t>(Store::kBig), 2.0f);
    ASSERT_TRUE(store->Write(0, 0, 0, Store::kBig, twos.data()).ok());
    ASSERT_TRUE(sink->closed()) << "the write did not wait for the capture";
    ASSERT_TRUE(sink->status().ok()) << sink->status();
    EXPECT_TRUE(sink->data() == before);
  });
}

// A store destroyed while a capture still waits for its state closes it with an error (a save then
// fails instead of waiting forever); one whose capture is running finishes it first.
TEST_P(CaptureTest, ADestroyedStoreClosesWhatItStillOwes) {
  OneRank([&](Communicator& comm) {
    Store store(comm, placement(), dir_);
    const auto before = store.Now();
    auto sink = std::make_shared<RecordingSink>(store.Counts(), std::chrono::microseconds(100));
    ASSERT_TRUE(store->Capture(sink).ok());
    store.Destroy();
    ASSERT_TRUE(sink->closed());
    if (nvme()) {
      EXPECT_EQ(sink->status().code(), StatusCode::kFailedPrecondition) << sink->status();
    } else {
      ASSERT_TRUE(sink->status().ok()) << sink->status();
      EXPECT_TRUE(sink->data() == before);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Placements, CaptureTest, ::testing::Range(0, static_cast<int>(std::size(kPlacements))),
                         [](const ::testing::TestParamInfo<int>& i) { return std::string(kPlacements[i.param].name); });

}  // namespace
}  // namespace zrt
