#include "zrt/core/json_reader.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "zrt/core/dtype.h"

namespace zrt {
namespace {

Result<DType> ParseFloating(std::string_view s) {
  ASSIGN_OR_RETURN(DType t, ParseDType(s));
  if (t == DType::kBytes) return InvalidArgumentError("bytes is not floating");
  return t;
}

TEST(JsonReader, ReadsTypedFieldsAndKeepsDefaultsForAbsentKeys) {
  auto j = ParseJson(R"({"a": true, "n": 7, "big": 9007199254740993, "x": 0.5, "s": "hi", "t": "bf16",
                         "child": {"k": -3}})", "test");
  ASSERT_TRUE(j.ok()) << j.status();
  auto r = JsonReader::Object(*j, "cfg");
  ASSERT_TRUE(r.ok());
  bool a = false;
  int n = 0, absent = 42;
  int64_t big = 0;
  double x = 0, int_as_double = 0;
  std::string s;
  DType t = DType::kF32;
  EXPECT_TRUE(r->Read("a", &a).ok());
  EXPECT_TRUE(r->Read("n", &n).ok());
  EXPECT_TRUE(r->Read("big", &big).ok());
  EXPECT_TRUE(r->Read("x", &x).ok());
  EXPECT_TRUE(r->Read("s", &s).ok());
  EXPECT_TRUE(r->Read<DType>("t", &t, ParseFloating).ok());
  EXPECT_TRUE(r->Read("absent", &absent).ok());
  auto c = r->Child("child");
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->Read("k", &int_as_double).ok());  // an integer is a number
  EXPECT_TRUE(c->Finish().ok());
  EXPECT_TRUE(r->Finish().ok());
  EXPECT_TRUE(a);
  EXPECT_EQ(n, 7);
  EXPECT_EQ(big, 9007199254740993);  // exact: not through double
  EXPECT_EQ(x, 0.5);
  EXPECT_EQ(s, "hi");
  EXPECT_EQ(t, DType::kBF16);
  EXPECT_EQ(absent, 42);
  EXPECT_EQ(int_as_double, -3);
}

TEST(JsonReader, EveryErrorNamesThePath) {
  auto j = ParseJson(R"({"engine": {"stage": 1.5, "name": 3, "flag": "yes", "small": 3000000000, "huge": 18446744073709551615,
                         "dtype": "int8", "inner": {"typo": 1}, "nan": "x", "arr": [1]}})", "test");
  ASSERT_TRUE(j.ok());
  auto root = JsonReader::Object(*j, "");
  ASSERT_TRUE(root.ok());
  auto e = root->Child("engine");
  ASSERT_TRUE(e.ok());
  int i = 0;
  int64_t i64 = 0;
  bool b = false;
  double d = 0;
  std::string s;
  DType t = DType::kF32;
  auto expect = [](const Status& st, const char* text) {
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find(text), std::string_view::npos) << st;
  };
  expect(e->Read("stage", &i), "engine.stage: expected an integer, got 1.5");
  expect(e->Read("name", &s), "engine.name: expected a string");
  expect(e->Read("flag", &b), "engine.flag: expected true or false");
  expect(e->Read("small", &i), "engine.small: 3000000000 is out of range");
  expect(e->Read("huge", &i64), "engine.huge: 18446744073709551615 is too large");
  expect(e->Read<DType>("dtype", &t, ParseFloating), "engine.dtype");
  expect(e->Read("nan", &d), "engine.nan: expected a number");
  expect(e->Child("arr").status(), "engine.arr: expected an object");
  auto inner = e->Child("inner");
  ASSERT_TRUE(inner.ok());
  expect(inner->Finish(), "unknown configuration key(s): engine.inner.typo");
  EXPECT_EQ(i, 0);  // failed reads change nothing
  EXPECT_TRUE(e->Finish().ok());  // every key was asked for
  expect(JsonReader::Object(nlohmann::json::array(), "top").status(), "top: expected an object");
}

TEST(JsonReader, UnknownKeysAreListedAll) {
  auto j = ParseJson(R"({"stage": 1, "stgae": 2, "bucket_byts": 3})", "test");
  ASSERT_TRUE(j.ok());
  auto r = JsonReader::Object(*j, "engine");
  ASSERT_TRUE(r.ok());
  int stage = 0;
  ASSERT_TRUE(r->Read("stage", &stage).ok());
  Status s = r->Finish();
  EXPECT_NE(s.message().find("engine.stgae"), std::string_view::npos) << s;
  EXPECT_NE(s.message().find("engine.bucket_byts"), std::string_view::npos) << s;
}

TEST(JsonReader, SyntaxErrorsNameTheFileAndOffset) {
  const std::string path = ::testing::TempDir() + "/zrt_json_reader_test.json";
  {
    std::ofstream(path) << "{\"stage\": 2,\n \"x\": }";
  }
  auto j = ReadJsonFile(path);
  ASSERT_FALSE(j.ok());
  EXPECT_NE(j.status().message().find(path), std::string_view::npos) << j.status();
  EXPECT_NE(j.status().message().find("at byte"), std::string_view::npos) << j.status();
  EXPECT_EQ(ReadJsonFile(path + ".missing").status().code(), StatusCode::kNotFound);
  std::remove(path.c_str());
  EXPECT_FALSE(ParseJson("", "empty").ok());
  EXPECT_FALSE(ParseJson("{\"a\": 1} trailing", "trailing").ok());
}

}  // namespace
}  // namespace zrt
