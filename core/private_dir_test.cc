#include "zrt/core/private_dir.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

namespace zrt {
namespace {

namespace fs = std::filesystem;

class PrivateDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = fs::temp_directory_path() / ("zrt_private_" + std::to_string(::getpid()));
    fs::remove_all(base_);
    fs::create_directories(base_);
    fs::permissions(base_, fs::perms::all | fs::perms::sticky_bit);  // like /dev/shm: the user's choice, not checked
  }
  void TearDown() override { fs::remove_all(base_); }
  static unsigned Mode(const fs::path& p) {
    struct stat st {};
    EXPECT_EQ(::lstat(p.c_str(), &st), 0) << p;
    return st.st_mode & 07777;
  }
  static void ExpectRefused(const Status& s, const fs::path& dir, const std::string& why) {
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
    EXPECT_NE(s.message().find("memory tier: " + dir.string() + " " + why), std::string_view::npos) << s;
    EXPECT_NE(s.message().find("refused"), std::string_view::npos) << s;
  }
  fs::path base_;
};

TEST_F(PrivateDirTest, WhatIsCreatedIsTheUsersAlone) {
  const fs::path d = base_ / "job" / "rank-00000" / "own";
  ASSERT_TRUE(MakePrivateDirs(base_, d, "memory tier").ok());
  for (const fs::path& p : {base_ / "job", base_ / "job" / "rank-00000", d}) EXPECT_EQ(Mode(p), 0700u) << p;
  EXPECT_EQ(Mode(base_), 01777u);  // the base existed: left as it is
  ASSERT_TRUE(MakePrivateDirs(base_, d, "memory tier").ok());  // again: all there, all fine
  // A base that does not exist is created private too, and so is every missing ancestor.
  const fs::path fresh = base_ / "made" / "here";
  ASSERT_TRUE(MakePrivateDirs(fresh, fresh / "job", "memory tier").ok());
  EXPECT_EQ(Mode(base_ / "made"), 0700u);
  EXPECT_EQ(Mode(fresh), 0700u);
  // A directory of ours that others may only read (an older version's 0755) is still used.
  fs::create_directories(base_ / "old" / "rank-00000");
  fs::permissions(base_ / "old", fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec | fs::perms::others_read | fs::perms::others_exec);
  EXPECT_TRUE(MakePrivateDirs(base_, base_ / "old" / "rank-00000", "memory tier").ok());
}

TEST_F(PrivateDirTest, ADirectoryOthersMayWriteIsRefusedAtAnyDepth) {
  for (const char* which : {"job", "job/rank-00000"}) {
    SCOPED_TRACE(which);
    fs::remove_all(base_ / "job");
    fs::create_directories(base_ / "job" / "rank-00000");
    fs::permissions(base_ / which, fs::perms::all);  // 0777
    ExpectRefused(MakePrivateDirs(base_, base_ / "job" / "rank-00000" / "own", "memory tier"), base_ / which, "is writable by others (mode 0777)");
    EXPECT_FALSE(fs::exists(base_ / "job" / "rank-00000" / "own"));  // nothing made below a refused one
    fs::permissions(base_ / which, fs::perms::owner_all | fs::perms::group_all);  // 0770
    ExpectRefused(MakePrivateDirs(base_, base_ / "job" / "rank-00000" / "own", "memory tier"), base_ / which, "is writable by its group (mode 0770)");
  }
}

TEST_F(PrivateDirTest, ALinkOrAFileInPlaceOfADirectoryIsRefused) {
  fs::create_directories(base_ / "elsewhere");
  fs::create_directory_symlink(base_ / "elsewhere", base_ / "job");
  ExpectRefused(MakePrivateDirs(base_, base_ / "job" / "own", "memory tier"), base_ / "job", "is a symbolic link");
  EXPECT_FALSE(fs::exists(base_ / "elsewhere" / "own"));
  fs::remove(base_ / "job");
  std::ofstream(base_ / "job") << "x";
  Status s = MakePrivateDirs(base_, base_ / "job" / "own", "memory tier");
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find((base_ / "job").string()), std::string_view::npos) << s;
}

// Another local user pre-creates the directory (its name is predictable), so that they could read
// the snapshots or replace them: it is refused, whatever its mode.
TEST_F(PrivateDirTest, AnotherUsersDirectoryIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to create a directory owned by another user";
  fs::create_directories(base_ / "job");
  ASSERT_EQ(::chown((base_ / "job").c_str(), 65534, 65534), 0);  // nobody
  fs::permissions(base_ / "job", fs::perms::owner_all);  // 0700, theirs
  ExpectRefused(MakePrivateDirs(base_, base_ / "job" / "own", "memory tier"), base_ / "job", "is owned by uid 65534, not by this user (uid 0)");
  EXPECT_FALSE(fs::exists(base_ / "job" / "own"));
}

}  // namespace
}  // namespace zrt
