// WriteShard: every chunk of resident and streamed (read-function) state reads back through
// files.h with its checksum, raw and compressed; raw chunks stay 4 KiB-aligned; the index is written
// last, so a failed fsync or rename leaves no index and no final data file.
#include "zrt/checkpoint/shard_writer.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "tests/support/io_hooks.h"
#include "zrt/checkpoint/files.h"
#include "zrt/checkpoint/fs_util.h"

namespace zrt::ckpt {
namespace {

namespace fs = std::filesystem;

class ShardWriterTest : public ::testing::TestWithParam<Codec> {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("zrt_shard_" + std::to_string(::getpid()) + "_" + std::string(CodecName(GetParam())).substr(0, 2));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    m_.nonce = "00000000deadbeef";
    m_.step = 3;
    m_.chunk_elements = 1024;
    m_.groups.push_back({"g", 0, 0, 4, {{"t", {2500}, DType::kF32, 0, 2500}}, {"master", "exp_avg"}});
    layout_ = *SavedLayout(m_, 0);
    master_.resize(static_cast<size_t>(layout_.shard_size()));
    for (size_t i = 0; i < master_.size(); ++i) master_[i] = static_cast<float>(i % 97) * 0.25f;  // compressible
  }
  void TearDown() override { fs::remove_all(dir_); }
  ShardState State() {
    StateBuffer streamed{"exp_avg", DType::kF32, nullptr, layout_.shard_size(), {}, {}};
    streamed.read = [this](int64_t off, int64_t n, void* out) {
      float* f = static_cast<float*>(out);
      for (int64_t i = 0; i < n; ++i) f[i] = -static_cast<float>(off + i);
      ++reads_;
      return Status();
    };
    return {{{"master", DType::kF32, master_.data(), layout_.shard_size()}, std::move(streamed)}};
  }
  fs::path dir_;
  Manifest m_;
  ShardLayout layout_;
  std::vector<float> master_;
  int reads_ = 0;
};

TEST_P(ShardWriterTest, EveryChunkReadsBackWithItsChecksum) {
  auto io = IoEngine::Create();
  ASSERT_TRUE(io.ok());
  ShardWriteStats stats;
  ASSERT_TRUE(WriteShard(**io, dir_.string(), m_, 0, State(), {GetParam(), 1}, &stats).ok());
  EXPECT_EQ(reads_, 3);  // the streamed buffer, one chunk at a time
  auto cd = CheckpointDir::Open(dir_.string());
  ASSERT_TRUE(cd.ok()) << cd.status();
  const std::vector<ShardLayout> layouts = {layout_};
  auto idx = ReadIndex(*cd, m_, layouts, 0);
  ASSERT_TRUE(idx.ok()) << idx.status();
  EXPECT_EQ(idx->chunks.size(), 6u);
  auto f = IoFile::Open((dir_ / idx->data_file).string(), IoFile::Mode::kRead);
  ASSERT_TRUE(f.ok());
  std::vector<float> out;
  std::vector<char> scratch;
  int64_t bytes = 0;
  for (size_t k = 0; k < idx->chunks.size(); ++k) {
    const ChunkEntry& c = idx->chunks[k];
    if (c.codec == Codec::kRaw) {
      EXPECT_EQ(c.file_offset % 4096, 0) << k;
    }
    ASSERT_TRUE(ReadChunk(**io, *f, m_, layout_, *idx, k, &out, &scratch, &bytes).ok()) << k;
    for (int64_t i = 0; i < c.elements; ++i) {
      const int64_t e = c.elem_offset + i;
      ASSERT_EQ(out[static_cast<size_t>(i)], c.kind == 0 ? master_[static_cast<size_t>(e)] : -static_cast<float>(e)) << k;
    }
  }
  EXPECT_EQ(bytes, stats.stored_bytes);
  if (GetParam() != Codec::kRaw) {
    EXPECT_LT(stats.stored_bytes, 2 * layout_.shard_size() * 4);
  }
}

TEST_P(ShardWriterTest, AFailedFsyncOrRenameLeavesNoIndex) {
  for (const char* op : {"fsync", "rename"}) {
    testing::FnIoHooks hooks;
    hooks.file_op = [op](std::string_view o, const std::string& path) { return o == op && path.ends_with(".data.tmp") ? EIO : 0; };
    auto io = IoEngine::Create({}, &hooks);
    ASSERT_TRUE(io.ok());
    Status s = WriteShard(**io, dir_.string(), m_, 1, State(), {GetParam(), 1});
    EXPECT_EQ(s.code(), StatusCode::kIo) << op;
    EXPECT_FALSE(fs::exists(dir_ / IndexFileName(1))) << op;
    EXPECT_FALSE(fs::exists(dir_ / DataFileName(1))) << op;
  }
}

TEST_P(ShardWriterTest, StateThatDoesNotMatchTheManifestIsRefused) {
  auto io = IoEngine::Create();
  ShardState state = State();
  state[0].pop_back();
  EXPECT_EQ(WriteShard(**io, dir_.string(), m_, 0, state, {}).code(), StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Codecs, ShardWriterTest, ::testing::Values(Codec::kRaw, Codec::kZstd, Codec::kByteGroupZstd),
                         [](const ::testing::TestParamInfo<Codec>& i) {
                           return i.param == Codec::kRaw ? "raw" : i.param == Codec::kZstd ? "zstd" : "bg_zstd";
                         });

}  // namespace
}  // namespace zrt::ckpt
