#include "zrt/checkpoint/options.h"

#include <gtest/gtest.h>

#include "zrt/core/json_reader.h"

namespace zrt::ckpt {
namespace {

TEST(CheckpointOptionsJson, EveryFieldIsRead) {
  auto j = ParseJson(R"({"root": "/ckpt", "chunk_elements": 4096, "keep_last": 2, "keep_every": 1000, "writer_nice": 10, "writer_threads": 3, "staging_budget_bytes": 268435456,
                         "compression": {"codec": "bg+zstd", "level": 3},
                         "io": {"backend": "uring", "queue_depth": 16, "block_bytes": 262144, "threads": 3}})", "test");
  ASSERT_TRUE(j.ok());
  auto o = CheckpointOptionsFromJson(*j);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->root, "/ckpt");
  EXPECT_EQ(o->chunk_elements, 4096);
  EXPECT_EQ(o->keep_last, 2);
  EXPECT_EQ(o->keep_every, 1000);
  EXPECT_EQ(o->writer_nice, 10);
  EXPECT_EQ(o->writer_threads, 3);
  EXPECT_EQ(o->staging_budget_bytes, int64_t{268435456});
  EXPECT_EQ(o->compression.codec, Codec::kByteGroupZstd);
  EXPECT_EQ(o->compression.level, 3);
  EXPECT_EQ(o->io.backend, IoOptions::Backend::kUring);
  EXPECT_EQ(o->io.queue_depth, 16);
  EXPECT_EQ(o->io.block_bytes, 262144);
  EXPECT_EQ(o->io.threads, 3);
  EXPECT_FALSE(o->memory.has_value());  // no "memory": no tier
  j = ParseJson(R"({"memory": {"dir": "/dev/shm/x", "replicate": false, "ranks_per_node": 8, "budget_bytes": 1048576}})", "test");
  ASSERT_TRUE(j.ok());
  o = CheckpointOptionsFromJson(*j);
  ASSERT_TRUE(o.ok()) << o.status();
  ASSERT_TRUE(o->memory.has_value());
  EXPECT_EQ(o->memory->dir, "/dev/shm/x");
  EXPECT_FALSE(o->memory->replicate);
  EXPECT_EQ(o->memory->ranks_per_node, 8);
  EXPECT_EQ(o->memory->budget_bytes, 1048576);
  j = ParseJson(R"({"memory": {}})", "test");
  o = CheckpointOptionsFromJson(*j);
  ASSERT_TRUE(o.ok() && o->memory.has_value() && o->memory->dir == "/dev/shm");
}

TEST(CheckpointOptionsJson, UnknownKeysAndBadValuesAreRefusedWithTheirPath) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"keep": 2})", "checkpoint.keep"},
      {R"({"compression": {"codec": "lz4"}})", "checkpoint.compression.codec"},
      {R"({"compression": {"level": 3, "threads": 2}})", "checkpoint.compression.threads"},
      {R"({"chunk_elements": 1000})", "checkpoint.chunk_elements: must be a positive multiple of 1024"},
      {R"({"keep_last": -1})", "checkpoint.keep_last"},
      {R"({"root": 7})", "checkpoint.root: expected a string"},
      {R"({"memory": {"budget": 1}})", "checkpoint.memory.budget"},
      {R"({"memory": {"ranks_per_node": -1}})", "checkpoint.memory.ranks_per_node: must be >= 0"},
      {R"({"memory": {"dir": ""}})", "checkpoint.memory.dir: must not be empty"},
  };
  for (const auto& [text, want] : cases) {
    auto j = ParseJson(text, "test");
    ASSERT_TRUE(j.ok()) << text;
    auto o = CheckpointOptionsFromJson(*j);
    ASSERT_FALSE(o.ok()) << text;
    EXPECT_NE(o.status().message().find(want), std::string_view::npos) << text << " -> " << o.status();
  }
}

}  // namespace
}  // namespace zrt::ckpt
