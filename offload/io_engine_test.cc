// One conformance suite that both I/O backends pass (../shared/STYLE.md item 11): random offsets and
// sizes with aligned and unaligned buffers, concurrency, large split requests, injected short
// transfers, EAGAIN, ENOSPC and EIO, end of file, missing files.
#include "zrt/offload/io_engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

#include "tests/support/io_hooks.h"
#include "tests/support/reference.h"

namespace zrt {
namespace {

namespace fs = std::filesystem;

struct AlignedBuf {
  explicit AlignedBuf(size_t n) : size(n) { p = static_cast<char*>(std::aligned_alloc(kIoAlignment, (n / kIoAlignment + 1) * kIoAlignment)); }
  ~AlignedBuf() { std::free(p); }
  char* p;
  size_t size;
};

class IoEngineTest : public ::testing::TestWithParam<IoOptions::Backend> {
 protected:
  void SetUp() override {
    // One directory per test: a parameterised test's name ("Test/io_uring") made one path component.
    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::replace(name.begin(), name.end(), '/', '_');
    dir_ = fs::temp_directory_path() / ("zrt_io_" + std::to_string(::getpid()) + "_" + name);
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  Result<std::unique_ptr<IoEngine>> Engine(IoOptions o = {}, IoHooks* hooks = nullptr) {
    o.backend = GetParam();
    return IoEngine::Create(o, hooks);
  }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

std::string Name(const ::testing::TestParamInfo<IoOptions::Backend>& i) {
  return i.param == IoOptions::Backend::kUring ? "io_uring" : "threads";
}

TEST_P(IoEngineTest, BackendIsTheOneAskedFor) {
  auto e = Engine();
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ((*e)->backend(), GetParam() == IoOptions::Backend::kUring ? "io_uring" : "threads");
}

TEST_P(IoEngineTest, RandomOffsetsAndSizesRoundTrip) {
  std::mt19937_64 rng(testing::TestSeed());
  IoOptions o;
  o.block_bytes = 64 << 10;  // small blocks: most requests split
  o.queue_depth = 8;
  auto e = Engine(o);
  ASSERT_TRUE(e.ok()) << e.status();
  auto f = IoFile::Open(Path("data"), IoFile::Mode::kCreate);
  ASSERT_TRUE(f.ok()) << f.status();
  const size_t file_size = 3 << 20;
  std::vector<char> model(file_size, 0);
  AlignedBuf zero(file_size);
  std::memset(zero.p, 0, file_size);
  ASSERT_TRUE((*e)->WriteSync(*f, zero.p, file_size, 0).ok());
  for (int i = 0; i < 60; ++i) {
    const bool aligned = rng() % 2;
    size_t len = 1 + rng() % (300 << 10);
    int64_t off = static_cast<int64_t>(rng() % (file_size - len));
    if (aligned) {
      off = off / 4096 * 4096;
      len = std::max<size_t>(4096, len / 4096 * 4096);
    }
    AlignedBuf buf(len + 1);
    char* p = aligned ? buf.p : buf.p + 1;  // unaligned buffers go through the buffered descriptor
    for (size_t k = 0; k < len; ++k) p[k] = static_cast<char>(rng());
    ASSERT_TRUE((*e)->WriteSync(*f, p, len, off).ok()) << "write " << len << " at " << off;
    std::memcpy(model.data() + off, p, len);
  }
  AlignedBuf back(file_size);
  ASSERT_TRUE((*e)->ReadSync(*f, back.p, file_size, 0).ok());
  ASSERT_EQ(0, std::memcmp(back.p, model.data(), file_size));
  // Unaligned read of an odd range.
  std::vector<char> part(12345);
  ASSERT_TRUE((*e)->ReadSync(*f, part.data(), part.size(), 777).ok());
  ASSERT_EQ(0, std::memcmp(part.data(), model.data() + 777, part.size()));
  ASSERT_TRUE(std::move(*f).Close().ok());
}

TEST_P(IoEngineTest, ConcurrentReadsAndWritesFromManyThreads) {
  IoOptions o;
  o.queue_depth = 4;  // fewer slots than requests: submitters must wait
  o.block_bytes = 16 << 10;
  auto e = Engine(o);
  ASSERT_TRUE(e.ok());
  auto f = IoFile::Open(Path("conc"), IoFile::Mode::kCreate);
  ASSERT_TRUE(f.ok());
  constexpr int kThreads = 4;
  constexpr size_t kRegion = 256 << 10;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      AlignedBuf w(kRegion), r(kRegion);
      for (int round = 0; round < 5; ++round) {
        std::memset(w.p, t * 16 + round, kRegion);
        if (!(*e)->WriteSync(*f, w.p, kRegion, static_cast<int64_t>(t * kRegion)).ok()) failures++;
        if (!(*e)->ReadSync(*f, r.p, kRegion, static_cast<int64_t>(t * kRegion)).ok()) failures++;
        if (std::memcmp(w.p, r.p, kRegion) != 0) failures++;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  // Many outstanding handles at once, waited out of order.
  std::vector<IoHandle> hs;
  AlignedBuf big(kThreads * kRegion);
  for (int t = kThreads - 1; t >= 0; --t) {
    auto h = (*e)->Read(*f, big.p + t * kRegion, kRegion, static_cast<int64_t>(t * kRegion));
    ASSERT_TRUE(h.ok());
    hs.push_back(std::move(*h));
  }
  for (auto& h : hs) ASSERT_TRUE(h.Wait().ok());
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(big.p[t * kRegion], static_cast<char>(t * 16 + 4));
}

TEST_P(IoEngineTest, ReadingPastTheEndIsDataLossNamingTheFile) {
  auto e = Engine();
  auto f = IoFile::Open(Path("short"), IoFile::Mode::kCreate);
  ASSERT_TRUE(f.ok());
  std::vector<char> data(1000, 'x');
  ASSERT_TRUE((*e)->WriteSync(*f, data.data(), data.size(), 0).ok());
  std::vector<char> back(2000);
  Status s = (*e)->ReadSync(*f, back.data(), back.size(), 0);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("short"), std::string_view::npos) << s;
  EXPECT_NE(s.message().find("offset 1000"), std::string_view::npos) << s;
  (void)(*e)->ReadSync(*f, back.data(), 10, 0);  // clears the sticky error report
}

TEST_P(IoEngineTest, MissingFileAndBadArguments) {
  auto f = IoFile::Open(Path("nope/none"), IoFile::Mode::kRead);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kNotFound);
  EXPECT_NE(f.status().message().find("nope/none"), std::string_view::npos);
  auto e = Engine();
  auto g = IoFile::Open(Path("x"), IoFile::Mode::kCreate);
  char c = 0;
  EXPECT_EQ((*e)->Write(*g, &c, 1, -5).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*e)->Write(*g, nullptr, 1, 0).status().code(), StatusCode::kInvalidArgument);
  IoOptions bad;
  bad.queue_depth = 0;
  EXPECT_EQ(IoEngine::Create(bad).status().code(), StatusCode::kInvalidArgument);
}

TEST_P(IoEngineTest, ShortTransfersAndEagainAreRetried) {
  std::atomic<int> calls{0};
  IoOptions o;
  o.block_bytes = 64 << 10;
  testing::FnIoHooks hooks;
  hooks.transfer = [&](bool, const std::string&, int64_t, size_t* len) {
    const int k = calls++;
    if (k % 5 == 4) return EAGAIN;
    if (*len > 1) *len = *len / 3 + 1;  // always a short transfer
    return 0;
  };
  auto e = Engine(o, &hooks);
  auto f = IoFile::Open(Path("short_io"), IoFile::Mode::kCreate);
  ASSERT_TRUE(f.ok());
  AlignedBuf w(1 << 20), r(1 << 20);
  for (size_t i = 0; i < w.size; ++i) w.p[i] = static_cast<char>(i * 7);
  ASSERT_TRUE((*e)->WriteSync(*f, w.p, w.size, 0).ok());
  ASSERT_TRUE((*e)->ReadSync(*f, r.p, r.size, 0).ok());
  EXPECT_EQ(0, std::memcmp(w.p, r.p, w.size));
  EXPECT_GT(calls.load(), 40);
}

TEST_P(IoEngineTest, EnospcAndEioFailTheRequestNamingFileAndOffsetOnlyThatRequest) {
  IoOptions o;
  o.block_bytes = 64 << 10;
  o.queue_depth = 2;  // a request of 8 blocks waits for space: its blocks are submitted in batches
  testing::FnIoHooks hooks;
  hooks.transfer = [](bool write, const std::string&, int64_t offset, size_t*) {
    if (write && offset >= (256 << 10)) return ENOSPC;
    if (!write && offset >= (128 << 10)) return EIO;
    return 0;
  };
  auto e = Engine(o, &hooks);
  auto f = IoFile::Open(Path("full"), IoFile::Mode::kCreate);
  ASSERT_TRUE(f.ok());
  AlignedBuf w(512 << 10);
  std::memset(w.p, 1, w.size);
  Status s = (*e)->WriteSync(*f, w.p, w.size, 0);
  EXPECT_EQ(s.code(), StatusCode::kIo) << s;
  EXPECT_NE(s.message().find("No space left on device"), std::string_view::npos) << s;
  EXPECT_NE(s.message().find("full"), std::string_view::npos) << s;
  EXPECT_NE(s.message().find("offset"), std::string_view::npos) << s;
  // The error belongs to that request (its handle reported it): the next request is unaffected.
  EXPECT_TRUE((*e)->WriteSync(*f, w.p, 4096, 0).ok());
  AlignedBuf r(256 << 10);
  Status rs = (*e)->ReadSync(*f, r.p, r.size, 0);
  EXPECT_EQ(rs.code(), StatusCode::kIo) << rs;
  EXPECT_NE(rs.message().find("Input/output error"), std::string_view::npos) << rs;
  EXPECT_TRUE((*e)->ReadSync(*f, r.p, 4096, 0).ok());
}

TEST_P(IoEngineTest, FileOpsAskTheHooks) {
  testing::FnIoHooks hooks;
  hooks.file_op = [](std::string_view op, const std::string& path) {
    return op == "fsync" && path.ends_with("bad") ? EIO : 0;
  };
  auto e = Engine({}, &hooks);
  auto good = IoFile::Open(Path("good"), IoFile::Mode::kCreate), bad = IoFile::Open(Path("bad"), IoFile::Mode::kCreate);
  ASSERT_TRUE(good.ok() && bad.ok());
  EXPECT_TRUE((*e)->Sync(*good).ok());
  Status s = (*e)->Sync(*bad);
  EXPECT_EQ(s.code(), StatusCode::kIo) << s;
  EXPECT_NE(s.message().find("fsync"), std::string_view::npos) << s;
  EXPECT_TRUE((*e)->FileOp("rename", Path("bad")).ok());
}

// A ring whose completions can no longer be waited for must not leave requests hanging or the reaper
// spinning: everything in flight fails, the engine stays failed, and it can still be destroyed.
TEST(IoEngineUring, RingThatStopsDeliveringCompletionsFailsEverythingAndStaysFailed) {
  testing::FnIoHooks hooks;
  std::atomic<bool> fail{false};
  std::atomic<int> waits{0};
  hooks.ring_wait = [&] {
    if (!fail.load()) return 0;
    ++waits;
    return EBADF;
  };
  IoOptions o;
  o.backend = IoOptions::Backend::kUring;
  auto e = IoEngine::Create(o, &hooks);
  ASSERT_TRUE(e.ok()) << e.status();
  const fs::path dir = fs::temp_directory_path() / ("zrt_io_ring_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto f = IoFile::Open((dir / "x").string(), IoFile::Mode::kCreate);
  ASSERT_TRUE(f.ok());
  AlignedBuf w(1 << 20);
  std::memset(w.p, 3, w.size);
  ASSERT_TRUE((*e)->WriteSync(*f, w.p, w.size, 0).ok());
  fail = true;
  // The reaper may be inside a wait that started before the failure: a write's completion lets it
  // see the next (failing) waits; then every block still in flight fails.
  Status s = (*e)->WriteSync(*f, w.p, w.size, 0);
  for (int i = 0; i < 20 && s.ok(); ++i) s = (*e)->WriteSync(*f, w.p, w.size, 0);
  EXPECT_FALSE(s.ok());
  Status later = (*e)->WriteSync(*f, w.p, 4096, 0);
  EXPECT_EQ(later.code(), StatusCode::kIo) << later;
  EXPECT_NE(later.message().find("unusable"), std::string_view::npos) << later;
  const int w1 = waits.load();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(waits.load(), w1) << "the reaper keeps waiting on a broken ring";
  e->reset();
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Backends, IoEngineTest,
                         ::testing::Values(IoOptions::Backend::kUring, IoOptions::Backend::kThreads), Name);

}  // namespace
}  // namespace zrt
