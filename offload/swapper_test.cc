// StateSwapper: the pipeline moves every element of every region through the callback exactly once
// per Stream, for 1, 2 and 3 buffer sets, on both I/O backends; and each kind of bad input (missing
// directory, no space, budget too small, files removed, a second process, I/O errors) gives an error
// that names the path or setting.
#include "zrt/offload/swapper.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>

#include "tests/support/io_hooks.h"
#include "zrt/core/base.h"

namespace zrt {
namespace {

namespace fs = std::filesystem;

struct Param {
  IoOptions::Backend backend;
  int sets;
};

class SwapperTest : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    // One directory per test: a parameterised test's name ("Test/io_uring_sets2") made one path component.
    std::string name = std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()).substr(0, 60);
    std::replace(name.begin(), name.end(), '/', '_');
    dir_ = fs::temp_directory_path() / ("zrt_swap_" + std::to_string(::getpid()) + "_" +
                                        std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" + name);
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    IoOptions o;
    o.backend = GetParam().backend;
    o.block_bytes = 64 << 10;
    auto io = IoEngine::Create(o);
    ASSERT_TRUE(io.ok()) << io.status();
    io_ = std::move(*io);
    host_ = HostMemory::Create(0, "test.budget");
  }
  void TearDown() override { fs::remove_all(dir_); }
  Result<std::unique_ptr<StateSwapper>> Make(std::vector<SwapRegion> regions, int64_t sub_group = 4096) {
    SwapperOptions o;
    o.dir = dir_.string();
    o.sub_group_elements = sub_group;
    o.buffer_sets = GetParam().sets;
    return StateSwapper::Create(o, std::move(regions), {{"a", 4}, {"b", 4}, {"h", 2}}, io_.get(), host_.get());
  }
  fs::path dir_;
  std::unique_ptr<IoEngine> io_;
  std::unique_ptr<HostMemory> host_;
};

std::string Name(const ::testing::TestParamInfo<Param>& i) {
  return std::string(i.param.backend == IoOptions::Backend::kUring ? "io_uring" : "threads") + "_sets" + std::to_string(i.param.sets);
}

// Regions of awkward sizes: empty, one element, less than a sub-group, several sub-groups plus a tail.
const std::vector<SwapRegion> kRegions = {{"empty", 0}, {"one", 1}, {"small", 1000}, {"big", 3 * 4096 + 77}, {"exact", 8192}};

TEST_P(SwapperTest, StreamsEverySubGroupOnceAndPersistsUpdates) {
  auto s = Make(kRegions);
  ASSERT_TRUE(s.ok()) << s.status();
  StateSwapper& sw = **s;
  EXPECT_EQ(sw.sub_group_elements(), 4096);
  EXPECT_EQ(host_->used(), sw.host_bytes());
  // Initialise: write-only streams; a = region*1e6 + index, b = -a, h = 16-bit index.
  const SwapAccess write_all[] = {SwapAccess::kWrite, SwapAccess::kWrite, SwapAccess::kWrite};
  std::vector<int64_t> seen(kRegions.size(), 0);
  ASSERT_TRUE(sw.Stream(write_all, [&](const StateSwapper::Window& w) {
                  EXPECT_EQ(w.offset, seen[static_cast<size_t>(w.region)]);
                  EXPECT_LE(w.count, 4096);
                  seen[static_cast<size_t>(w.region)] += w.count;
                  for (int64_t i = 0; i < w.count; ++i) {
                    const float v = static_cast<float>(w.region * 1000000 + w.offset + i);
                    static_cast<float*>(w.data[0])[i] = v;
                    static_cast<float*>(w.data[1])[i] = -v;
                    static_cast<uint16_t*>(w.data[2])[i] = static_cast<uint16_t>(w.offset + i);
                  }
                  return Status();
                }).ok());
  for (size_t r = 0; r < kRegions.size(); ++r) EXPECT_EQ(seen[r], kRegions[r].elements);
  // Three read-modify-write passes over a and b; h read only.
  const SwapAccess rmw[] = {SwapAccess::kReadWrite, SwapAccess::kReadWrite, SwapAccess::kRead};
  for (int pass = 0; pass < 3; ++pass) {
    SwapStats st;
    ASSERT_TRUE(sw.Stream(rmw, [&](const StateSwapper::Window& w) {
                    for (int64_t i = 0; i < w.count; ++i) {
                      const float want = static_cast<float>(w.region * 1000000 + w.offset + i) + static_cast<float>(pass);
                      auto* a = static_cast<float*>(w.data[0]);
                      if (a[i] != want) return InternalError("region ", w.region, " element ", w.offset + i, ": ", a[i], " != ", want);
                      if (static_cast<uint16_t*>(w.data[2])[i] != static_cast<uint16_t>(w.offset + i)) return InternalError("h");
                      a[i] += 1;
                      static_cast<float*>(w.data[1])[i] -= 1;
                    }
                    return Status();
                  }, &st).ok());
    EXPECT_GT(st.bytes_read, 0);
    EXPECT_GT(st.bytes_written, 0);
  }
  // Random access agrees.
  std::vector<float> b(100);
  ASSERT_TRUE(sw.Read(3, 1, 4090, 100, b.data()).ok());
  for (int i = 0; i < 100; ++i) EXPECT_EQ(b[static_cast<size_t>(i)], -static_cast<float>(3 * 1000000 + 4090 + i) - 3);
  std::vector<float> in = {7, 8, 9};
  ASSERT_TRUE(sw.Write(3, 0, 12300, 3, in.data()).ok());
  std::vector<float> out(3);
  ASSERT_TRUE(sw.Read(3, 0, 12300, 3, out.data()).ok());
  EXPECT_EQ(out, in);
  EXPECT_FALSE(sw.Read(3, 0, 12300, 1000, out.data()).ok());  // past the region
}

// A stream absent from a region (0 bytes: no file bytes, a null window) and one storing an element
// per 64 of the region's (q8 scales): sub-groups are whole multiples of 4096 x 64 elements, each unit
// lands where its elements are, and random access takes whole units only.
TEST_P(SwapperTest, AbsentStreamsAndOneElementPerBlock) {
  const int64_t per = 64, n = 600 * 1024;  // 3 sub-groups of 256K elements (the last one short)
  SwapRegion dense{"dense", n, {4, 0, 2}, {1, 1, per}};  // "b" absent, "h" one 2-byte element per 64
  SwapRegion plain{"plain", 5000, {4, 4, 2}, {}};
  auto s = Make({dense, plain});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->sub_group_elements(), 4096 * per);
  EXPECT_EQ((*s)->RegionBytes(0, 1), 0u);
  EXPECT_EQ((*s)->RegionBytes(0, 2), static_cast<size_t>(AlignUp(n / per * 2, 4096)));
  const std::vector<SwapAccess> write(3, SwapAccess::kWrite);
  int windows = 0;
  ASSERT_TRUE((*s)->Stream(write, [&](const StateSwapper::Window& w) {
    ++windows;
    if (w.region == 0) {
      EXPECT_EQ(w.data[1], nullptr) << "an absent stream has no window";
      EXPECT_EQ(w.offset % (4096 * per), 0);
      for (int64_t i = 0; i < w.count / per; ++i) static_cast<uint16_t*>(w.data[2])[i] = static_cast<uint16_t>((w.offset / per + i) * 7);
      for (int64_t i = 0; i < w.count; ++i) static_cast<float*>(w.data[0])[i] = static_cast<float>(w.offset + i);
    }
    return Status();
  }).ok());
  EXPECT_EQ(windows, 4);
  std::vector<uint16_t> h(10);
  ASSERT_TRUE((*s)->Read(0, 2, 300 * per, 10 * per, h.data()).ok());
  for (int i = 0; i < 10; ++i) EXPECT_EQ(h[static_cast<size_t>(i)], static_cast<uint16_t>((300 + i) * 7)) << i;
  std::vector<float> a(3);
  ASSERT_TRUE((*s)->Read(0, 0, 262143, 3, a.data()).ok());
  EXPECT_EQ(a, (std::vector<float>{262143, 262144, 262145}));
  EXPECT_EQ((*s)->Read(0, 2, 10, per, h.data()).code(), StatusCode::kInvalidArgument) << "not a whole unit";
  EXPECT_EQ((*s)->Read(0, 1, 0, 4, h.data()).code(), StatusCode::kInvalidArgument) << "absent";
  SwapRegion odd{"odd", 100, {4, 4, 2}, {1, 1, 64}};  // 100 elements are not whole blocks of 64
  EXPECT_EQ(Make({odd}).status().code(), StatusCode::kInvalidArgument);
}

TEST_P(SwapperTest, FilesAreScratchAndTheDirectoryIsExclusive) {
  const fs::path rank_dir = dir_ / "zrt-swap.rank0";
  fs::create_directories(rank_dir);
  std::ofstream(rank_dir / "9.stale.swp") << "left by a killed process";
  {
    auto s = Make(kRegions);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_FALSE(fs::exists(rank_dir / "9.stale.swp"));
    EXPECT_EQ(fs::file_size((*s)->file_path(3, 0)), 13u * 4096);  // 12365 * 4 B padded to whole 4 KiB blocks
    auto second = Make(kRegions);
    ASSERT_FALSE(second.ok());
    EXPECT_NE(second.status().message().find("in use by another live process"), std::string::npos) << second.status();
  }
  EXPECT_FALSE(fs::exists(rank_dir));  // the destructor removed everything
}

// The swap files hold the model's state: their directory is the user's alone (0700, files 0600), and a
// directory of their name that another user owns (as root) or that others may write is refused.
TEST_P(SwapperTest, TheSwapDirectoryIsTheUsersAlone) {
  const fs::path rank_dir = dir_ / "zrt-swap.rank0";
  auto mode = [](const fs::path& p) {
    struct stat st {};
    EXPECT_EQ(::lstat(p.c_str(), &st), 0) << p;
    return st.st_mode & 07777;
  };
  {
    auto s = Make(kRegions);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(mode(rank_dir), 0700u);
    int files = 0;
    for (const auto& f : fs::directory_iterator(rank_dir)) {
      EXPECT_EQ(mode(f.path()), 0600u) << f.path();
      ++files;
    }
    EXPECT_GT(files, 1);
  }
  for (bool other_user : {false, true}) {
    if (other_user && ::geteuid() != 0) continue;  // needs root to make another user's directory
    fs::create_directories(rank_dir);
    std::ofstream(rank_dir / "0.master.swp") << "planted";
    if (other_user) {
      ASSERT_EQ(::chown(rank_dir.c_str(), 65534, 65534), 0);
    } else {
      fs::permissions(rank_dir, fs::perms::all);
    }
    auto s = Make(kRegions);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), StatusCode::kFailedPrecondition) << s.status();
    EXPECT_NE(s.status().message().find("offload.nvme_dir: " + rank_dir.string() + " is "), std::string::npos) << s.status();
    EXPECT_EQ(fs::file_size(rank_dir / "0.master.swp"), 7u);  // nothing there used, nothing removed
    fs::remove_all(rank_dir);
  }
}

TEST_P(SwapperTest, BadInputNamesThePathOrSetting) {
  {
    SwapperOptions o;
    o.dir = (dir_ / "missing").string();
    auto s = StateSwapper::Create(o, kRegions, {{"a", 4}}, io_.get(), host_.get());
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.status().message().find(o.dir), std::string::npos) << s.status();
    EXPECT_NE(s.status().message().find("offload.nvme_dir"), std::string::npos) << s.status();
  }
  {  // no space: more than the filesystem has
    auto s = Make({{"huge", int64_t{1} << 52}});
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.status().message().find("no space"), std::string::npos) << s.status();
    EXPECT_NE(s.status().message().find("zrt-swap.rank0"), std::string::npos) << s.status();
  }
  {  // a file removed underneath: the next Stream says which
    auto s = Make(kRegions);
    ASSERT_TRUE(s.ok()) << s.status();
    const std::string victim = (*s)->file_path(2, 1);
    fs::remove(victim);
    const SwapAccess rmw[] = {SwapAccess::kReadWrite, SwapAccess::kReadWrite, SwapAccess::kRead};
    Status st = (*s)->Stream(rmw, [](const StateSwapper::Window&) { return Status(); });
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find(victim), std::string::npos) << st;
  }
}

TEST_P(SwapperTest, BudgetTooSmallForOneSubGroup) {
  auto small = HostMemory::Create(100 << 10, "offload.host_budget_bytes");
  SwapperOptions o;
  o.dir = dir_.string();
  o.sub_group_elements = 16384;  // 16384 * 4 B * 3 sets = 192 KiB
  o.buffer_sets = 3;
  auto s = StateSwapper::Create(o, kRegions, {{"a", 4}}, io_.get(), small.get());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("offload.host_budget_bytes"), std::string::npos) << s.status();
  EXPECT_NE(s.status().message().find("offload.sub_group_elements"), std::string::npos) << s.status();
  EXPECT_EQ(small->used(), 0);
  // Derived sub-group size: the largest multiple of 4096 that fits (8192 * 4 B * 3 = 96 KiB).
  o.sub_group_elements = 0;
  auto d = StateSwapper::Create(o, kRegions, {{"a", 4}}, io_.get(), small.get());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)->sub_group_elements(), 8192);
  EXPECT_LE((*d)->host_bytes(), 100 << 10);
}

TEST_P(SwapperTest, IoErrorMidStreamIsReportedAndBuffersAreIdle) {
  IoOptions io;
  io.backend = GetParam().backend;
  std::atomic<int> writes{0};  // the hook runs on I/O threads
  testing::FnIoHooks hooks;
  hooks.transfer = [&](bool write, const std::string&, int64_t, size_t*) { return write && ++writes == 5 ? EIO : 0; };
  auto eng = IoEngine::Create(io, &hooks);
  ASSERT_TRUE(eng.ok());
  SwapperOptions o;
  o.dir = dir_.string();
  o.sub_group_elements = 4096;
  o.buffer_sets = GetParam().sets;
  auto s = StateSwapper::Create(o, kRegions, {{"a", 4}}, eng->get(), host_.get());
  ASSERT_TRUE(s.ok()) << s.status();
  const SwapAccess w[] = {SwapAccess::kWrite};
  Status st = (*s)->Stream(w, [](const StateSwapper::Window&) { return Status(); });
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("zrt-swap.rank0"), std::string::npos) << st;
  // A callback error stops the stream too, with its message.
  writes = -1000;
  auto fail_region3 = [](const StateSwapper::Window& win) {
    return win.region == 3 ? InvalidArgumentError("callback failed") : Status();
  };
  Status cb = (*s)->Stream(w, fail_region3);
  EXPECT_NE(cb.message().find("callback failed"), std::string::npos) << cb;
}

TEST_P(SwapperTest, DirectoriesOfRanksTheJobNoLongerHasAreRemovedUnlessLive) {
  // A 4-rank job's leftovers (killed), one of them still held by a live process; the job comes back
  // on 2 ranks.
  for (int r : {2, 3}) {
    fs::create_directories(dir_ / ("zrt-swap.rank" + std::to_string(r)));
    std::ofstream(dir_ / ("zrt-swap.rank" + std::to_string(r)) / "0.master.swp") << "stale";
  }
  SwapperOptions live;
  live.dir = dir_.string();
  live.rank = 5;  // another job's rank, alive (its lock is held)
  live.sub_group_elements = 4096;
  auto other = StateSwapper::Create(live, kRegions, {{"a", 4}}, io_.get(), host_.get());
  ASSERT_TRUE(other.ok()) << other.status();
  SwapperOptions o;
  o.dir = dir_.string();
  o.rank = 1;
  o.world_size = 2;
  o.sub_group_elements = 4096;
  auto s = StateSwapper::Create(o, kRegions, {{"a", 4}}, io_.get(), host_.get());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_FALSE(fs::exists(dir_ / "zrt-swap.rank2"));
  EXPECT_FALSE(fs::exists(dir_ / "zrt-swap.rank3"));
  EXPECT_TRUE(fs::exists(dir_ / "zrt-swap.rank5")) << "a live process's directory was removed";
  EXPECT_TRUE(fs::exists(dir_ / "zrt-swap.rank1"));
}

TEST(HostMemoryTest, PageAlignedBudgetedAndAccounted) {
  auto host = HostMemory::Create(1 << 20, "offload.host_budget_bytes");
  EXPECT_EQ(host->budget(), 1 << 20);
  auto a = host->Allocate(600 << 10, MemCategory::kOptimizerState);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data()) % kIoAlignment, 0u);  // page-aligned whatever was asked
  EXPECT_EQ(host->used(), 600 << 10);
  EXPECT_EQ(host->memory().Read().current_of(MemCategory::kOptimizerState), 600 << 10);
  EXPECT_FALSE(host->Fits(500 << 10));
  auto b = host->Allocate(500 << 10, MemCategory::kStaging);  // past the budget: refused, nothing taken
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("offload.host_budget_bytes"), std::string::npos) << b.status();
  EXPECT_EQ(host->used(), 600 << 10);
  a->Reset();  // freed memory goes back to the budget
  EXPECT_EQ(host->used(), 0);
  EXPECT_TRUE(host->Allocate(1 << 20, MemCategory::kStaging).ok());
  auto unbounded = HostMemory::Create(0, "x");
  EXPECT_TRUE(unbounded->Fits(int64_t{1} << 50));
  EXPECT_FALSE(unbounded->pinned() && unbounded->name() != "host (pinned)");
}

INSTANTIATE_TEST_SUITE_P(Backends, SwapperTest,
                         ::testing::Values(Param{IoOptions::Backend::kUring, 3}, Param{IoOptions::Backend::kThreads, 3},
                                           Param{IoOptions::Backend::kUring, 2}, Param{IoOptions::Backend::kUring, 1}),
                         Name);

}  // namespace
}  // namespace zrt
