#include "zrt/checkpoint/format.h"

#include <gtest/gtest.h>

#include <random>

#include <xxhash.h>

#include "zrt/checkpoint/codec.h"
#include "tests/support/reference.h"

namespace zrt::ckpt {
namespace {

Manifest Sample() {
  Manifest m;
  m.nonce = "00ff00ff12345678";
  m.step = 1200;
  m.world_size = 4;
  m.shards = 4;
  m.stage = 3;
  m.zrt_version = "0.1.0";
  m.trainer_state = {{"data_position", 12345}, {"rng", "abc"}};
  m.engine_state = {{"lr", 3e-4}, {"lr_schedule", {{"kind", "cosine"}}}};
  GroupEntry g;
  g.name = "layer0";
  g.lr = 1e-3;
  g.alignment = 4;
  g.kinds = {"master", "exp_avg", "exp_avg_sq"};
  g.tensors = {{"w", {3, 5}, DType::kBF16, 0, 15}, {"b", {5}, DType::kBF16, 16, 5}};
  m.groups.push_back(g);
  return m;
}

TEST(Format, EngineStateIsOptionalAndMustBeAnObject) {
  nlohmann::json j = nlohmann::json::parse(EncodeManifest(Sample()));
  j["engine"].erase("state");  // a checkpoint written before it existed
  auto old = DecodeManifest(internal::Seal(j), "manifest.json");
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_TRUE(old->engine_state.is_object() && old->engine_state.empty());
  j["engine"]["state"] = "lr=3";
  auto bad = DecodeManifest(internal::Seal(j), "manifest.json");
  EXPECT_EQ(bad.status().code(), StatusCode::kDataLoss) << bad.status();
  EXPECT_NE(bad.status().message().find("engine.state"), std::string_view::npos) << bad.status();
}

TEST(Format, ManifestRoundTripAndLayout) {
  const Manifest m = Sample();
  const std::string text = EncodeManifest(m);
  auto back = DecodeManifest(text, "manifest.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->step, 1200);
  EXPECT_EQ(back->trainer_state["data_position"], 12345);
  EXPECT_EQ(back->engine_state, m.engine_state);
  ASSERT_EQ(back->groups.size(), 1u);
  EXPECT_EQ(back->groups[0].tensors[1].name, "b");
  EXPECT_EQ(back->groups[0].tensors[0].dtype, DType::kBF16);
  auto l = SavedLayout(*back, 0);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->tensor_offset(1), 16);
}

TEST(Format, CorruptionIsDetectedAndNamed) {
  std::string text = EncodeManifest(Sample());
  // Change one digit of the step: valid JSON, wrong checksum.
  std::string flipped = text;
  flipped[flipped.find("1200")] = '7';
  auto s = DecodeManifest(flipped, "/ck/step-1/manifest.json");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(s.status().message().find("/ck/step-1/manifest.json"), std::string_view::npos);
  EXPECT_NE(s.status().message().find("checksum"), std::string_view::npos);
  EXPECT_FALSE(DecodeManifest(text.substr(0, text.size() / 2), "m").ok());  // truncated
  EXPECT_FALSE(DecodeManifest("garbage{", "m").ok());
  EXPECT_FALSE(DecodeManifest("", "m").ok());
  // Offsets that disagree with the layout are refused.
  Manifest bad = Sample();
  bad.groups[0].tensors[1].offset = 15;
  auto dec = DecodeManifest(EncodeManifest(bad), "m");
  EXPECT_EQ(dec.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(dec.status().message().find("offsets disagree"), std::string_view::npos) << dec.status();
}

TEST(Format, WrongMemberTypesAreDataLossNotACrash) {
  // Regression (found by tests/fuzz): a sealed object whose "format" or "version" has another type.
  for (const char* bad : {R"({"format": 7, "version": 1})", R"({"format": "zrt-checkpoint", "version": "1"})",
                          R"({"format": "zrt-checkpoint", "version": 1, "nonce": 5})",
                          R"({"format": "zrt-checkpoint", "version": 1, "chunks": [[1, 2]]})"}) {
    const std::string text = internal::Seal(nlohmann::json::parse(bad));
    EXPECT_EQ(DecodeManifest(text, "m").status().code(), StatusCode::kDataLoss) << bad;
    EXPECT_EQ(DecodeIndex(text, "i").status().code(), StatusCode::kDataLoss) << bad;
  }
}

TEST(Format, IndexRoundTripAndBounds) {
  RankIndex r;
  r.nonce = "n";
  r.rank = 2;
  r.shards = 4;
  r.data_file = DataFileName(2);
  r.data_bytes = 8192;
  r.chunks.push_back({0, 1, 0, 1024, 4096, 4096, Codec::kRaw, 0xdeadbeefcafe1234ull});
  auto back = DecodeIndex(EncodeIndex(r), "i");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->chunks[0].xxh3, 0xdeadbeefcafe1234ull);
  EXPECT_EQ(back->chunks[0].file_offset, 4096);
  r.chunks[0].stored_bytes = 999999;  // beyond the data file
  EXPECT_EQ(DecodeIndex(EncodeIndex(r), "i").status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(StepDirName(1200), "step-00001200");
  EXPECT_EQ(*ParseStepDirName("step-00001200"), 1200);
  EXPECT_FALSE(ParseStepDirName("step-12.tmp-ab").ok());
  EXPECT_EQ(IndexFileName(3), "rank-00003.index.json");
}

TEST(Codec, RoundTripsAndFallsBackToRaw) {
  std::mt19937_64 rng(testing::TestSeed());
  std::vector<float> smooth(100000);
  for (size_t i = 0; i < smooth.size(); ++i) smooth[i] = Bf16ToFloat(FloatToBf16(0.01f * std::sin(0.001f * static_cast<float>(i))));
  std::vector<uint32_t> noise(100000);
  for (auto& x : noise) x = static_cast<uint32_t>(rng());
  std::vector<char> scratch, out;
  for (Codec c : {Codec::kZstd, Codec::kByteGroupZstd}) {
    CompressOptions o{c, 1};
    auto used = EncodeChunk(smooth.data(), smooth.size() * 4, 4, o, &scratch, &out);
    ASSERT_TRUE(used.ok());
    EXPECT_EQ(*used, c) << "smooth data must compress";
    EXPECT_LT(out.size(), smooth.size() * 4);
    std::vector<float> back(smooth.size());
    ASSERT_TRUE(DecodeChunk(*used, out.data(), out.size(), back.data(), back.size() * 4, 4, &scratch).ok());
    EXPECT_EQ(back, smooth);
    // Random bits do not shrink: stored raw.
    EXPECT_EQ(*EncodeChunk(noise.data(), noise.size() * 4, 4, o, &scratch, &out), Codec::kRaw);
    // A corrupt stream is DataLoss, not a crash.
    auto again = EncodeChunk(smooth.data(), smooth.size() * 4, 4, o, &scratch, &out);
    out[out.size() / 2] ^= 0x5a;
    Status s = DecodeChunk(*again, out.data(), out.size(), back.data(), back.size() * 4, 4, &scratch);
    if (!s.ok()) {
      EXPECT_EQ(s.code(), StatusCode::kDataLoss);
    }
  }
  EXPECT_NE(Checksum("a", 1), Checksum("b", 1));
  EXPECT_EQ(*ParseCodec("bg+zstd"), Codec::kByteGroupZstd);
  EXPECT_FALSE(ParseCodec("lz4").ok());
}

// Every checkpoint ever written holds these values: each build, and the copying variant, must give
// exactly what the xxhash library gives, at every length and alignment (block edges included).
TEST(FormatTest, ChecksumsAreTheLibrarysXxh3AtEveryLengthAndAlignment) {
  EXPECT_EQ(Checksum("", 0), 0x2D06800538D394C2ull);  // XXH3-64 of nothing, from its specification
  std::mt19937_64 rng(7);
  std::vector<unsigned char> src((size_t{1} << 20) + 4096), dst(src.size());
  for (auto& c : src) c = static_cast<unsigned char>(rng());
  const bool avx2 = __builtin_cpu_supports("avx2");
  for (size_t len : {size_t{0}, size_t{1}, size_t{3}, size_t{16}, size_t{17}, size_t{128}, size_t{129}, size_t{240}, size_t{241},
                     size_t{1024}, size_t{4099}, (size_t{256} << 10) - 1, size_t{256} << 10, (size_t{256} << 10) + 1,
                     (size_t{512} << 10) + 77, size_t{1} << 20}) {
    for (size_t align : {size_t{0}, size_t{1}, size_t{7}}) {
      const unsigned char* p = src.data() + align;
      const uint64_t want = XXH3_64bits(p, len);
      EXPECT_EQ(Checksum(p, len), want) << len << " at +" << align;
      EXPECT_EQ(generic::Checksum(p, len), want) << len << " at +" << align;
      std::fill(dst.begin(), dst.end(), 0);
      EXPECT_EQ(CopyAndChecksum(dst.data() + 3 * align, p, len), want) << len << " at +" << align;
      EXPECT_TRUE(std::equal(p, p + len, dst.data() + 3 * align)) << len;
      EXPECT_EQ(dst[3 * align + len], 0) << "wrote past the end: " << len;
      EXPECT_EQ(generic::CopyAndChecksum(dst.data(), p, len), want) << len;
      if (avx2) {
        EXPECT_EQ(avx2::Checksum(p, len), want) << len << " at +" << align;
        EXPECT_EQ(avx2::CopyAndChecksum(dst.data() + align, p, len), want) << len << " at +" << align;
      }
    }
  }
}

}  // namespace
}  // namespace zrt::ckpt
