#include "zrt/core/status.h"

#include <gtest/gtest.h>
#include <mpi.h>

#include <cerrno>

namespace zrt {
namespace {

Status Fails() { return IoError("disk on fire"); }
Status Propagates() {
  RETURN_IF_ERROR(Fails(), "writing chunk ", 17);
  return Status();
}
Result<int> Half(int x) {
  if (x % 2) return InvalidArgumentError(x, " is odd");
  return x / 2;
}
Result<int> Quarter(int x) {
  ASSIGN_OR_RETURN(int h, Half(x), "first half of ", x);
  ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

TEST(Status, OkByDefault) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kOk);
  EXPECT_EQ(s.ToString(), "OK");
  EXPECT_TRUE(s.WithContext("ignored").ok());
}

TEST(Status, ContextIsPrependedOnlyOnError) {
  Status s = Propagates();
  EXPECT_EQ(s.code(), StatusCode::kIo);
  EXPECT_EQ(s.message(), "writing chunk 17: disk on fire");
  EXPECT_EQ(s.ToString(), "IO: writing chunk 17: disk on fire");
}

TEST(Status, ResultCarriesValueOrError) {
  Result<int> ok = Quarter(8);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, 2);
  Result<int> bad = Quarter(6);  // 6/2 = 3 is odd: error from the second ASSIGN_OR_RETURN, no context
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "3 is odd");
  Result<int> bad2 = Quarter(5);
  EXPECT_EQ(bad2.status().message(), "first half of 5: 5 is odd");
  EXPECT_EQ(bad2.status().code(), StatusCode::kInvalidArgument);
}

TEST(Status, ResultFromOkStatusIsAnInternalError) {
  Result<int> r{Status()};
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
}

TEST(Status, MoveOnlyValues) {
  Result<std::unique_ptr<int>> r = std::make_unique<int>(7);
  ASSERT_TRUE(r.ok());
  std::unique_ptr<int> p = std::move(r).value();
  EXPECT_EQ(*p, 7);
}

TEST(Result, ValueOfAnErrorAbortsPrintingTheStatus) {
  Result<int> r = NotFoundError("no tensor 'w7' in /ckpt/step-3");
  EXPECT_DEATH((void)r.value(), "value\\(\\) of an error Result: NOT_FOUND: no tensor 'w7' in /ckpt/step-3");
  EXPECT_DEATH((void)*Result<std::string>(IoError("disk gone")), "IO: disk gone");
}

TEST(Status, ErrnoMapping) {
  EXPECT_EQ(ErrnoStatus(ENOENT, "open /x").code(), StatusCode::kNotFound);
  EXPECT_EQ(ErrnoStatus(EEXIST, "").code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(ErrnoStatus(ENOMEM, "").code(), StatusCode::kOutOfMemory);
  EXPECT_EQ(ErrnoStatus(EINVAL, "").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ErrnoStatus(EAGAIN, "").code(), StatusCode::kUnavailable);
  Status s = ErrnoStatus(ENOSPC, "writing /ckpt/a.tmp");
  EXPECT_EQ(s.code(), StatusCode::kIo);
  EXPECT_NE(s.message().find("/ckpt/a.tmp"), std::string_view::npos);
  EXPECT_NE(s.message().find("No space left on device"), std::string_view::npos);
}

TEST(Status, MpiMappingWithoutInit) {
  // Before MPI_Init the text cannot be looked up (Open MPI aborts), but the code still maps.
  EXPECT_TRUE(MpiStatus(MPI_SUCCESS, "x").ok());
  Status s = MpiStatus(MPI_ERR_COUNT, "all_reduce");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message().substr(0, 12), "all_reduce: ");
}

TEST(Status, CodeNames) {
  for (StatusCode c : {StatusCode::kInvalidArgument, StatusCode::kNotFound, StatusCode::kAlreadyExists,
                       StatusCode::kDataLoss, StatusCode::kIo, StatusCode::kOutOfMemory, StatusCode::kUnavailable,
                       StatusCode::kFailedPrecondition, StatusCode::kInternal}) {
    EXPECT_NE(StatusCodeName(c), "UNKNOWN");
    EXPECT_EQ(Status(c, "m").code(), c);
  }
}

}  // namespace
}  // namespace zrt
