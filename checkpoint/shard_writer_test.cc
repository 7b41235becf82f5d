// The shard writer: every chunk of resident and owner-read state reads back through files.h with its
// checksum, raw and compressed; raw chunks stay 4 KiB-aligned; encoder threads write the same file;
// the index is written last, so a failed fsync or rename (or a delivery that stops) leaves no index and
// no final data file; each chunk is taken once and a missing one fails the shard. The disk save's
// chunk queue: state put from another thread in parts that straddle chunks is written as it fills
// (WriteQueuedShard, the save's writer), out-of-order parts are refused, a delivery that ends early
// fails the write, a budget bounds the buffers, and a delivery waiting for buffers stops when the save
// does.
#include "zrt/checkpoint/shard_writer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <thread>

#include "tests/support/io_hooks.h"
#include "zrt/checkpoint/catalog.h"
#include "zrt/checkpoint/files.h"
#include "zrt/checkpoint/tensor_reader.h"
#include "zrt/checkpoint/codec.h"
#include "zrt/checkpoint/fs_util.h"
#include "zrt/core/quant_math.h"

namespace zrt::ckpt {
namespace {

namespace fs = std::filesystem;

// exp_avg reached through the owner (as device memory or NVMe state is): element e is -e; reads counted.
class Streamed final : public StateOwner {
 public:
  explicit Streamed(int* reads) : reads_(reads) {}
  Status Read(int, int, int64_t off, int64_t n, float* out) override {
    for (int64_t i = 0; i < n; ++i) out[i] = -static_cast<float>(off + i);
    ++*reads_;
    return Status();
  }
  Status Capture(std::shared_ptr<StateSink>) override { return FailedPreconditionError("not captured here"); }
  Status Settle() override { return Status(); }
  Status Write(int, int, int64_t, int64_t, const float*) override { return FailedPreconditionError("read only"); }
  Status Restore(const StateCounters&) override { return Status(); }

 private:
  int* reads_;
};

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
  // master resident, exp_avg through the owner.
  StateView State() {
    StateView v;
    v.owner = &streamed_;
    v.groups.push_back({"g", {}, layout_, {{"master", DType::kF32, master_.data(), layout_.shard_size()},
                                           {"exp_avg", DType::kF32, nullptr, layout_.shard_size()}}});
    return v;
  }
  // Reads every chunk of shard 0 back through files.h (checksums checked): fn(chunk, its elements).
  // Returns the stored bytes read (-1 on a failure, reported).
  int64_t ReadBack(const std::function<void(const ChunkEntry&, const std::vector<float>&)>& fn, size_t* chunks = nullptr) {
    auto io = IoEngine::Create();
    auto cd = CheckpointDir::Open(dir_.string());
    const std::vector<ShardLayout> layouts = {layout_};
    auto idx = cd.ok() ? ReadIndex(*cd, m_, layouts, 0) : Result<RankIndex>(cd.status());
    if (!io.ok() || !idx.ok()) {
      ADD_FAILURE() << io.status() << idx.status();
      return -1;
    }
    auto f = IoFile::Open((dir_ / idx->data_file).string(), IoFile::Mode::kRead);
    if (!f.ok()) {
      ADD_FAILURE() << f.status();
      return -1;
    }
    if (chunks != nullptr) *chunks = idx->chunks.size();
    std::vector<float> out;
    std::vector<char> scratch;
    int64_t bytes = 0;
    for (size_t k = 0; k < idx->chunks.size(); ++k) {
      if (Status s = ReadChunk(**io, *f, m_, layout_, *idx, k, &out, &scratch, &bytes); !s.ok()) {
        ADD_FAILURE() << "chunk " << k << ": " << s;
        return -1;
      }
      fn(idx->chunks[k], out);
    }
    return bytes;
  }
  // The manifest becomes one of a bf16 master and q8 moments in blocks of `block`; returns the three
  // kinds' values as their owner keeps them (what their stored forms decode to).
  std::vector<std::vector<float>> CompactState(int64_t block) {
    m_.groups[0].alignment = block;
    m_.groups[0].kinds = {"master", "exp_avg", "exp_avg_sq"};
    m_.groups[0].stored = {Precision::kBF16, Precision::kQ8, Precision::kQ8};
    m_.groups[0].block = block;
    layout_ = *SavedLayout(m_, 0);
    const int64_t n = layout_.shard_size();
    EXPECT_EQ(n % block, 0);
    std::vector<std::vector<float>> kept(3, std::vector<float>(static_cast<size_t>(n), 0.0f));
    std::vector<uint8_t> codes(static_cast<size_t>(block));
    for (int64_t i = 0; i < 2500; ++i) {
      kept[0][static_cast<size_t>(i)] = Bf16ToFloat(FloatToBf16(std::sin(0.01f * static_cast<float>(i))));
      kept[1][static_cast<size_t>(i)] = 1e-3f * std::cos(0.37f * static_cast<float>(i));
      kept[2][static_cast<size_t>(i)] = 1e-6f * std::exp(-static_cast<float>(i % 300) / 20.0f);
    }
    for (int k = 1; k <= 2; ++k) {  // the moments as the optimizer keeps them: what their blocks decode to
      for (int64_t b = 0; b < n / block; ++b) {
        float* x = kept[static_cast<size_t>(k)].data() + b * block;
        const float sc = Q8EncodeBlock(x, block, k == 1, codes.data());
        for (int64_t i = 0; i < block; ++i) x[i] = Q8Value(codes[static_cast<size_t>(i)], k == 1) * sc;
      }
    }
    return kept;
  }
  StateView View(std::vector<std::vector<float>>& kept) {
    StateView v;
    v.owner = &streamed_;
    v.groups.push_back({"g", {}, layout_, {}});
    for (size_t k = 0; k < kept.size(); ++k) v.groups[0].buffers.push_back({m_.groups[0].kinds[k], DType::kF32, kept[k].data(), layout_.shard_size()});
    return v;
  }
  fs::path dir_;
  Manifest m_;
  ShardLayout layout_;
  std::vector<float> master_;
  int reads_ = 0;
  Streamed streamed_{&reads_};
};

TEST_P(ShardWriterTest, EveryChunkReadsBackWithItsChecksum) {
  auto io = IoEngine::Create();
  ASSERT_TRUE(io.ok());
  ShardWriteStats stats;
  ASSERT_TRUE(WriteShard(**io, dir_.string(), m_, 0, State(), {.compression = {GetParam(), 1}}, &stats).ok());
  EXPECT_EQ(reads_, 3);  // the buffer behind the owner, one chunk at a time
  size_t chunks = 0;
  const int64_t bytes = ReadBack([&](const ChunkEntry& c, const std::vector<float>& out) {
    if (c.codec == Codec::kRaw) {
      EXPECT_EQ(c.file_offset % 4096, 0) << c.elem_offset;
    }
    for (int64_t i = 0; i < c.elements; ++i) {
      const int64_t e = c.elem_offset + i;
      ASSERT_EQ(out[static_cast<size_t>(i)], c.kind == 0 ? master_[static_cast<size_t>(e)] : -static_cast<float>(e)) << e;
    }
  }, &chunks);
  EXPECT_EQ(chunks, 6u);
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
    Status s = WriteShard(**io, dir_.string(), m_, 0, State(), {.compression = {GetParam(), 1}});
    EXPECT_EQ(s.code(), StatusCode::kIo) << op;
    EXPECT_FALSE(fs::exists(dir_ / IndexFileName(0))) << op;
    EXPECT_FALSE(fs::exists(dir_ / DataFileName(0))) << op;
  }
}

TEST_P(ShardWriterTest, StateThatDoesNotMatchTheManifestIsRefused) {
  auto io = IoEngine::Create();
  StateView state = State();
  state.groups[0].buffers.pop_back();
  EXPECT_EQ(WriteShard(**io, dir_.string(), m_, 0, state).code(), StatusCode::kInvalidArgument);
}

// Each chunk once, where chunks are; a shard missing one is refused at Finish, naming it.
TEST_P(ShardWriterTest, ChunksAreTakenOnceAndEveryOneIsNeeded) {
  auto io = IoEngine::Create();
  ASSERT_TRUE(io.ok());
  auto w = ShardWriter::Open(**io, dir_.string(), m_, 0, {.compression = {GetParam(), 1}});
  ASSERT_TRUE(w.ok()) << w.status();
  const float* data = master_.data();
  EXPECT_EQ((*w)->Write(0, 0, 512, 1024, data).code(), StatusCode::kInvalidArgument) << "not at a chunk";
  EXPECT_EQ((*w)->Write(0, 2, 0, 1024, data).code(), StatusCode::kInvalidArgument) << "no such kind";
  auto w2 = ShardWriter::Open(**io, dir_.string(), m_, 0, {.compression = {GetParam(), 1}});
  ASSERT_TRUE(w2.ok());
  ASSERT_TRUE((*w2)->Write(0, 0, 0, 1024, data).ok());
  EXPECT_EQ((*w2)->Write(0, 0, 0, 1024, data).code(), StatusCode::kInvalidArgument) << "twice";
  auto w3 = ShardWriter::Open(**io, dir_.string(), m_, 0, {.compression = {GetParam(), 1}});
  ASSERT_TRUE(w3.ok());
  int released = 0;
  for (int k = 0; k < 2; ++k) {
    for (int64_t e = 0; e < 2048; e += 1024) ASSERT_TRUE((*w3)->Write(0, k, e, 1024, data + e, [&] { ++released; }).ok());
  }
  Status s = (*w3)->Finish();
  EXPECT_EQ(s.code(), StatusCode::kInternal) << s;
  EXPECT_NE(s.message().find("chunk at element 2048 was never written"), std::string::npos) << s;
  EXPECT_EQ(released, 4) << "every chunk given back";
  EXPECT_FALSE(fs::exists(dir_ / IndexFileName(0)));
}

std::string Slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST_P(ShardWriterTest, EncoderThreadsWriteTheSameFile) {
  auto io = IoEngine::Create();
  ASSERT_TRUE(io.ok());
  const fs::path a = dir_ / "a", b = dir_ / "b";
  fs::create_directories(a);
  fs::create_directories(b);
  ASSERT_TRUE(WriteShard(**io, a.string(), m_, 0, State(), {.compression = {GetParam(), 1}}).ok());
  ThreadPool encoders(3, "test-enc");
  ASSERT_TRUE(WriteShard(**io, b.string(), m_, 0, State(), {.compression = {GetParam(), 1}, .encoders = &encoders}).ok());
  EXPECT_EQ(Slurp(a / DataFileName(0)), Slurp(b / DataFileName(0)));
  EXPECT_EQ(Slurp(a / IndexFileName(0)), Slurp(b / IndexFileName(0)));
}

// The state arrives from another thread in parts of 700 elements (straddling chunks of 1024), the
// save's writer taking each chunk as it fills, with and without encoders and a budget of the fewest
// buffers; out-of-order parts are refused; a delivery that ends early fails the write and leaves no
// index.
TEST_P(ShardWriterTest, QueuedStateIsWrittenAsItFills) {
  auto io = IoEngine::Create();
  ASSERT_TRUE(io.ok());
  const int64_t n = layout_.shard_size();
  std::vector<float> avg(static_cast<size_t>(n));
  for (size_t i = 0; i < avg.size(); ++i) avg[i] = 0.5f - static_cast<float>(i % 13);
  ThreadPool encoders(2, "test-enc");
  CpuDevice host;
  for (ThreadPool* enc : {static_cast<ThreadPool*>(nullptr), &encoders}) {
    for (bool complete : {true, false}) {
      fs::remove_all(dir_);
      fs::create_directories(dir_);
      ChunkQueue queue({{{n}, {n}}}, m_.chunk_elements, 1, &host, {});
      std::thread owner([&] {
        for (int64_t off = 0; off < n; off += 1000) ASSERT_TRUE(queue.Put(0, 0, off, std::min<int64_t>(1000, n - off), master_.data() + off).ok());
        const int64_t upto = complete ? n : n - 5;
        for (int64_t off = 0; off < upto; off += 700) {
          EXPECT_TRUE(queue.Put(0, 1, off, std::min<int64_t>(700, upto - off), avg.data() + off).ok());
        }
        EXPECT_EQ(queue.Put(0, 1, 3, 1, avg.data()).code(), StatusCode::kInvalidArgument);  // out of order
        queue.Close(Status());
        // After the end: refused (FailedPrecondition, or the writer's error if it already stopped the delivery).
        EXPECT_FALSE(queue.Put(0, 1, upto, 1, avg.data()).ok());
      });
      Status s = WriteQueuedShard(**io, dir_.string(), m_, 0, queue, {.compression = {GetParam(), 1}, .encoders = enc});
      owner.join();
      EXPECT_LE(queue.peak_bytes(), 4 * m_.chunk_elements * 4) << "the budget's least: the kinds + 2 chunks";
      if (!complete) {
        EXPECT_FALSE(s.ok());
        EXPECT_NE(s.message().find("ended at element"), std::string::npos) << s;
        EXPECT_FALSE(fs::exists(dir_ / IndexFileName(0)));
        continue;
      }
      ASSERT_TRUE(s.ok()) << s;
      EXPECT_GT(ReadBack([&](const ChunkEntry& c, const std::vector<float>& out) {
        const std::vector<float>& want = c.kind == 0 ? master_ : avg;
        ASSERT_EQ(0, std::memcmp(out.data(), want.data() + c.elem_offset, static_cast<size_t>(c.elements) * 4)) << c.elem_offset;
      }), 0);
      EXPECT_EQ(queue.TakeBuffers().size(), 4u) << "every buffer is kept for the next save";
    }
  }
}

// A save spread over a shard's replicas: three writers, each its part (format.h PartPlan), one of
// them fed by a queue that passes the other parts' chunks over; the parts' chunks tile the shard once,
// every data file is cut to its chunks after its reservation, and the checkpoint reads back whole
// through the TensorReader and verifies in full. A missing part, a part's index under another part's
// name and a writer given another part's chunk are each refused, naming the part.
TEST_P(ShardWriterTest, ASpreadSaveWritesEachChunkOnceAcrossItsParts) {
  auto io = IoEngine::Create();
  ASSERT_TRUE(io.ok());
  Manifest m = m_;
  m.world_size = 3;
  m.parts = 3;
  const std::vector<ShardLayout> layouts = {layout_};
  const PartPlan plan(m, layouts);
  const int64_t n = layout_.shard_size();
  std::vector<float> avg(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) avg[static_cast<size_t>(i)] = -static_cast<float>(i);  // what Streamed gives
  ASSERT_TRUE(WriteShard(**io, dir_.string(), m, 0, State(), {.compression = {GetParam(), 1}, .part = 0}).ok());
  ASSERT_TRUE(WriteShard(**io, dir_.string(), m, 0, State(), {.compression = {GetParam(), 1}, .part = 2}).ok());
  {  // part 1 through the save's queue, fed the whole shard
    CpuDevice host;
    std::vector<std::vector<std::vector<char>>> keep(1, std::vector<std::vector<char>>(2));
    for (int k = 0; k < 2; ++k) {
      for (int64_t c = 0; c * m.chunk_elements < n; ++c) keep[0][static_cast<size_t>(k)].push_back(plan.part(0, k, c) == 1);
    }
    ChunkQueue queue({{{n}, {n}}}, m.chunk_elements, 0, &host, {}, keep);
    std::thread owner([&] {
      EXPECT_TRUE(queue.Put(0, 0, 0, n, master_.data()).ok());
      for (int64_t off = 0; off < n; off += 700) EXPECT_TRUE(queue.Put(0, 1, off, std::min<int64_t>(700, n - off), avg.data() + off).ok());
      queue.Close(Status());
    });
    const Status s = WriteQueuedShard(**io, dir_.string(), m, 0, queue, {.compression = {GetParam(), 1}, .part = 1});
    owner.join();
    ASSERT_TRUE(s.ok()) << s;
  }
  {
    std::ofstream(dir_ / "manifest.json") << EncodeManifest(m);
  }
  auto cd = CheckpointDir::Open(dir_.string());
  ASSERT_TRUE(cd.ok());
  auto parts = ReadShardIndexes(*cd, m, layouts, 0);
  ASSERT_TRUE(parts.ok()) << parts.status();
  ASSERT_EQ(parts->size(), 3u);
  size_t chunks = 0;
  for (int p = 0; p < 3; ++p) {
    const RankIndex& idx = (*parts)[static_cast<size_t>(p)];
    EXPECT_EQ(idx.data_file, DataFileName(0, p, 3));
    EXPECT_EQ(static_cast<int64_t>(fs::file_size(dir_ / idx.data_file)), idx.data_bytes) << "the reservation is cut to the chunks";
    EXPECT_FALSE(idx.chunks.empty()) << "part " << p;
    for (const ChunkEntry& c : idx.chunks) EXPECT_EQ(plan.part(c.group, c.kind, c.elem_offset / m.chunk_elements), p);
    chunks += idx.chunks.size();
  }
  EXPECT_EQ(chunks, 6u);
  std::vector<std::string> problems;
  ASSERT_TRUE(CheckComplete(dir_.string(), VerifyLevel::kFull, &problems).ok());
  EXPECT_TRUE(problems.empty()) << problems.front();
  auto reader = TensorReader::Open(dir_.string());
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<float> got(2500);
  ASSERT_TRUE((*reader)->Read("t", "master", 0, 2500, got.data()).ok());
  EXPECT_EQ(0, std::memcmp(got.data(), master_.data(), 2500 * 4));
  ASSERT_TRUE((*reader)->Read("t", "exp_avg", 0, 2500, got.data()).ok());
  EXPECT_EQ(0, std::memcmp(got.data(), avg.data(), 2500 * 4));
  reader->reset();
  EXPECT_EQ(ReadIndex(*cd, m, layouts, 0).status().code(), StatusCode::kDataLoss) << "one index of a spread shard";
  // Part 2's index under part 1's name: refused; part 1 missing: the checkpoint is incomplete.
  fs::rename(dir_ / IndexFileName(0, 1, 3), dir_ / "saved");
  fs::copy_file(dir_ / IndexFileName(0, 2, 3), dir_ / IndexFileName(0, 1, 3));
  auto swapped = ReadShardIndexes(*cd, m, layouts, 0);
  EXPECT_EQ(swapped.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(swapped.status().message().find("part 1"), std::string_view::npos) << swapped.status();
  fs::remove(dir_ / IndexFileName(0, 1, 3));
  problems.clear();
  ASSERT_TRUE(CheckComplete(dir_.string(), VerifyLevel::kMetadata, &problems).ok());
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("part 1 did not finish"), std::string::npos) << problems[0];
  // A writer of part 0 given part 2's chunk, and a part the manifest does not have.
  fs::create_directories(dir_ / "x");
  auto w = ShardWriter::Open(**io, (dir_ / "x").string(), m, 0, {.part = 0});
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)->Write(0, 1, 2048, n - 2048, avg.data() + 2048).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ShardWriter::Open(**io, (dir_ / "x").string(), m, 0, {.part = 3}).status().code(), StatusCode::kInvalidArgument);
}

TEST_P(ShardWriterTest, ADeliveryWaitingForBuffersStopsWithTheSave) {
  const int64_t n = 200 * m_.chunk_elements;  // far more than the budget's chunks
  std::vector<float> big(static_cast<size_t>(n), 1.0f);
  CpuDevice host;
  ChunkQueue queue({{{n}}}, m_.chunk_elements, 16 * m_.chunk_elements * 4, &host, {});
  Status put;
  std::thread owner([&] { put = queue.Put(0, 0, 0, n, big.data()); });  // no writer takes chunks
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(queue.closed());
  EXPECT_EQ(queue.peak_bytes(), 16 * m_.chunk_elements * 4) << "the budget, and no more";
  queue.Stop(IoError("disk full"));
  owner.join();
  EXPECT_EQ(put.code(), StatusCode::kIo) << put;
  EXPECT_EQ(queue.Next(true).status().code(), StatusCode::kIo);
}

// Compact kinds (format.h Precision) are stored as their owner keeps them: bf16 master, q8 moments of
// 64-element blocks; every chunk reads back bit for bit from fewer bytes; a value the form cannot hold
// fails the save naming it; a corrupt scale is caught by its checksum and, with the checksum forged
// to match, by the form's own rules, naming the chunk.
// A save's manifest records each kind's precision from its buffer's StateFormat, and refuses a form
// the format does not hold (a q8 code signed otherwise than its kind's, blocks of two sizes).
TEST_P(ShardWriterTest, TheManifestTakesEachBuffersFormatAndRefusesOnesTheFormatDoesNotHold) {
  std::vector<std::vector<float>> kept = CompactState(64);
  StateView v = View(kept);
  auto& b = v.groups[0].buffers;
  b[0].format = {Precision::kBF16, false, 0};
  b[1].format = StateFormat::Of(Precision::kQ8, "exp_avg", 64);
  b[2].format = StateFormat::Of(Precision::kQ8, "exp_avg_sq", 64);
  auto m = ManifestFor(v, {}, 4096, "00ff00ff12345678");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->groups[0].stored, (std::vector<Precision>{Precision::kBF16, Precision::kQ8, Precision::kQ8}));
  EXPECT_EQ(m->groups[0].block, 64);
  EXPECT_EQ(m->groups[0].format(1), b[1].format);
  for (const auto& [buffer, bad] : {std::pair{1, StateFormat{Precision::kQ8, false, 64}}, std::pair{2, StateFormat{Precision::kQ8, true, 64}},
                                    std::pair{2, StateFormat{Precision::kQ8, false, 32}}, std::pair{0, StateFormat{Precision::kBF16, false, 64}}}) {
    StateView w = View(kept);
    for (size_t k = 0; k < 3; ++k) w.groups[0].buffers[k].format = b[k].format;
    w.groups[0].buffers[static_cast<size_t>(buffer)].format = bad;
    const auto r = ManifestFor(w, {}, 4096, "00ff00ff12345678");
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << "buffer " << buffer;
  }
}

TEST_P(ShardWriterTest, CompactKindsAreStoredAsKeptAndReadBackBitForBit) {
  const int64_t block = 64;
  std::vector<std::vector<float>> kept = CompactState(block);
  const int64_t n = layout_.shard_size();
  StateView v = View(kept);
  auto io = IoEngine::Create();
  ASSERT_TRUE(io.ok());
  ShardWriteStats stats;
  ASSERT_TRUE(WriteShard(**io, dir_.string(), m_, 0, v, {.compression = {GetParam(), 1}}, &stats).ok());
  const int64_t form = 2 * n + 2 * (n + 4 * (n / block));  // against 12 n for f32
  if (GetParam() == Codec::kRaw) {
    EXPECT_EQ(stats.stored_bytes, form);
  }
  EXPECT_LE(stats.stored_bytes, form);
  ReadBack([&](const ChunkEntry& c, const std::vector<float>& out) {
    EXPECT_EQ(0, std::memcmp(out.data(), kept[static_cast<size_t>(c.kind)].data() + c.elem_offset, static_cast<size_t>(c.elements) * 4))
        << "kind " << c.kind << " at " << c.elem_offset;
  });

  // A value its form cannot hold: the save fails, naming the group, kind and place.
  kept[0][17] = 0.1f;
  fs::remove_all(dir_);
  fs::create_directories(dir_);
  Status s = WriteShard(**io, dir_.string(), m_, 0, v, {.compression = {GetParam(), 1}});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("group 'g' master"), std::string::npos) << s;
  kept[0][17] = 0.0f;
  fs::remove_all(dir_);
  fs::create_directories(dir_);
  ASSERT_TRUE(WriteShard(**io, dir_.string(), m_, 0, v, {.compression = {GetParam(), 1}}).ok());
  if (GetParam() != Codec::kRaw) return;  // the forgeries below edit raw stored forms

  // exp_avg_sq's first chunk: a scale set to NaN. Its checksum catches it; with the checksum (and the
  // index's) forged to match, the q8 form's rules do.
  const fs::path index_path = dir_ / IndexFileName(0), data_path = dir_ / DataFileName(0);
  std::ifstream in(index_path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  RankIndex idx = *DecodeIndex(text, "index");
  const auto c = std::find_if(idx.chunks.begin(), idx.chunks.end(), [](const ChunkEntry& e) { return e.kind == 2 && e.elem_offset == 0; });
  ASSERT_NE(c, idx.chunks.end());
  std::vector<char> bytes(static_cast<size_t>(c->stored_bytes));
  {
    std::fstream f(data_path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(c->file_offset);
    f.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    const float nan = std::nanf("");
    std::memcpy(bytes.data() + c->elements + 4 * 3, &nan, 4);  // block 3's scale
    f.seekp(c->file_offset);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  auto read_error = [&]() -> std::string {
    auto f = IoFile::Open(data_path.string(), IoFile::Mode::kRead);
    auto cd = CheckpointDir::Open(dir_.string());
    const std::vector<ShardLayout> layouts = {layout_};
    auto ri = ReadIndex(*cd, m_, layouts, 0);
    if (!f.ok() || !ri.ok()) return std::string(f.ok() ? ri.status().message() : f.status().message());
    std::vector<float> out;
    std::vector<char> scratch;
    int64_t read = 0;
    const size_t k = static_cast<size_t>(c - idx.chunks.begin());
    Status st = ReadChunk(**io, *f, m_, layout_, *ri, k, &out, &scratch, &read);
    EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st;
    return std::string(st.message());
  };
  std::string e = read_error();
  EXPECT_NE(e.find("checksum mismatch"), std::string::npos) << e;
  EXPECT_NE(e.find("exp_avg_sq, elements 0.."), std::string::npos) << e;
  c->xxh3 = Checksum(bytes.data(), bytes.size());
  {
    std::ofstream out(index_path, std::ios::trunc);
    out << EncodeIndex(idx);
  }
  e = read_error();
  EXPECT_NE(e.find("q8 block 3: scale nan"), std::string::npos) << e;
  EXPECT_NE(e.find("exp_avg_sq, elements 0.."), std::string::npos) << e;
}

// The save's queue takes compact parts as their owner keeps them (bf16 values; q8 codes and scales)
// in parts of 192 elements straddling chunks of 1024, and f32 values of a compact kind, which it
// encodes: the files are byte for byte those written from the values, only the values' part was
// encoded, and the staging holds stored bytes. A part stored otherwise than the checkpoint stores its
// kind, a q8 part off its blocks and a value its form cannot hold are refused, naming the place.
TEST_P(ShardWriterTest, AQueueTakesCompactPartsAsStored) {
  const int64_t block = 64, n_part = 192;
  std::vector<std::vector<float>> kept = CompactState(block);
  const int64_t n = layout_.shard_size();
  StateView v = View(kept);
  auto io = IoEngine::Create();
  ASSERT_TRUE(io.ok());
  const fs::path a = dir_ / "a", b = dir_ / "b";
  fs::create_directories(a);
  fs::create_directories(b);
  ASSERT_TRUE(WriteShard(**io, a.string(), m_, 0, v, {.compression = {GetParam(), 1}}).ok());
  std::vector<uint16_t> master(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) master[static_cast<size_t>(i)] = FloatToBf16(kept[0][static_cast<size_t>(i)]);
  std::vector<uint8_t> codes(static_cast<size_t>(n));
  std::vector<float> scales(static_cast<size_t>(n / block));
  for (int64_t q = 0; q < n / block; ++q) {
    scales[static_cast<size_t>(q)] = Q8EncodeBlock(kept[1].data() + q * block, block, true, codes.data() + q * block);
  }
  CpuDevice host;
  const std::vector<ShardLayout> layouts = {layout_};
  ChunkQueue queue(QueuedKinds(m_, layouts), m_.chunk_elements, 1, &host, {});
  std::thread owner([&] {
    EXPECT_EQ(queue.PutStored(0, 1, 0, n_part, StateFormat{Precision::kBF16, false, 0}, master.data(), nullptr).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(queue.PutStored(0, 1, 0, n_part, StateFormat{Precision::kQ8, false, block}, codes.data(), scales.data()).code(), StatusCode::kInvalidArgument)
        << "exp_avg's codes are signed";
    EXPECT_EQ(queue.PutStored(0, 1, 0, 100, StateFormat{Precision::kQ8, true, block}, codes.data(), scales.data()).code(), StatusCode::kInvalidArgument);
    std::vector<float> bad(kept[0].begin(), kept[0].begin() + n_part);
    bad[5] = 0.1f;
    const Status s = queue.Put(0, 0, 0, n_part, bad.data());
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("at element 0"), std::string::npos) << s;
    for (int64_t off = 0; off < n; off += n_part) {
      const int64_t m = std::min(n_part, n - off);
      EXPECT_TRUE(queue.PutStored(0, 0, off, m, StateFormat{Precision::kBF16, false, 0}, master.data() + off, nullptr).ok());
      EXPECT_TRUE(queue.PutStored(0, 1, off, m, StateFormat{Precision::kQ8, true, block}, codes.data() + off, scales.data() + off / block).ok());
      EXPECT_TRUE(queue.Put(0, 2, off, m, kept[2].data() + off).ok());
    }
    queue.Close(Status());
  });
  const Status s = WriteQueuedShard(**io, b.string(), m_, 0, queue, {.compression = {GetParam(), 1}});
  owner.join();
  ASSERT_TRUE(s.ok()) << s;
  // The same chunks, byte for byte (their checksums), in the order they filled.
  auto chunks = [](const fs::path& d) {
    std::vector<std::tuple<int, int, int64_t, int64_t, int64_t, Codec, uint64_t>> c;
    const Result<RankIndex> idx = DecodeIndex(Slurp(d / IndexFileName(0)), "index");
    EXPECT_TRUE(idx.ok()) << idx.status();
    if (!idx.ok()) return c;
    for (const ChunkEntry& e : idx->chunks) {
      c.emplace_back(e.group, e.kind, e.elem_offset, e.elements, e.stored_bytes, e.codec, e.xxh3);
    }
    return c;
  };
  EXPECT_EQ(chunks(a), chunks(b));
  EXPECT_EQ(fs::file_size(a / DataFileName(0)), fs::file_size(b / DataFileName(0)));
  EXPECT_EQ(queue.encoded_elements(), n) << "exp_avg_sq only, which came as values";
  EXPECT_LE(queue.peak_bytes(), 5 * 2 * m_.chunk_elements) << "the kinds + 2 of the largest stored chunk (bf16)";
}

INSTANTIATE_TEST_SUITE_P(Codecs, ShardWriterTest, ::testing::Values(Codec::kRaw, Codec::kZstd, Codec::kByteGroupZstd),
                         [](const ::testing::TestParamInfo<Codec>& i) {
                           return i.param == Codec::kRaw ? "raw" : i.param == Codec::kZstd ? "zstd" : "bg_zstd";
                         });

}  // namespace
}  // namespace zrt::ckpt
