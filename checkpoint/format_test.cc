#include "zrt/checkpoint/format.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
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

// A group's kinds stored compact ("stored", "block"; M6): round trip, an f32 manifest written as before
// the member existed, and every rule refused as DataLoss naming the group.
TEST(Format, StoredTypesRoundTripAndTheirRulesAreChecked) {
  Manifest m = Sample();
  m.chunk_elements = 4096;
  EXPECT_EQ(nlohmann::json::parse(EncodeManifest(m))["groups"][0].count("stored"), 0u) << "all f32: written as before";
  m.groups[0].alignment = 256;
  m.groups[0].tensors[1].offset = 256;
  m.groups[0].stored = {Precision::kBF16, Precision::kQ8, Precision::kQ8};
  m.groups[0].block = 128;
  auto back = DecodeManifest(EncodeManifest(m), "manifest.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->groups[0].stored, m.groups[0].stored);
  EXPECT_EQ(back->groups[0].block, 128);
  EXPECT_EQ(back->groups[0].stored_as(2), Precision::kQ8);
  EXPECT_EQ(back->groups[0].format(2).Bytes(1024), 1024 + 8 * 4);
  EXPECT_EQ(back->groups[0].format(0).Bytes(1024), 2048);
  EXPECT_TRUE(back->groups[0].format(1).is_signed) << "exp_avg's q8 codes are signed";
  EXPECT_FALSE(back->groups[0].format(2).is_signed);
  {  // q4: half a byte a code, the same sign rule
    Manifest q4 = m;
    q4.groups[0].stored = {Precision::kF32, Precision::kQ4, Precision::kQ4};
    auto b4 = DecodeManifest(EncodeManifest(q4), "manifest.json");
    ASSERT_TRUE(b4.ok()) << b4.status();
    EXPECT_EQ(b4->groups[0].stored, q4.groups[0].stored);
    EXPECT_EQ(b4->groups[0].format(1).Bytes(1024), 512 + 8 * 4);
    EXPECT_TRUE(b4->groups[0].format(1).is_signed);
    EXPECT_FALSE(b4->groups[0].format(2).is_signed);
  }
  const nlohmann::json good = nlohmann::json::parse(EncodeManifest(m));
  const std::vector<std::pair<const char*, std::function<void(nlohmann::json&)>>> bad = {
      {"stored types for", [](nlohmann::json& j) { j["groups"][0]["stored"].erase(2); }},
      {"unknown stored type", [](nlohmann::json& j) { j["groups"][0]["stored"][1] = "q2"; }},
      {"master cannot be stored as q8", [](nlohmann::json& j) { j["groups"][0]["stored"][0] = "q8"; }},
      {"master cannot be stored as q4", [](nlohmann::json& j) { j["groups"][0]["stored"][0] = "q4"; }},
      {"not a power of two", [](nlohmann::json& j) { j["groups"][0]["block"] = 96; }},
      {"not a power of two", [](nlohmann::json& j) { j["groups"][0]["block"] = 512; }},  // > alignment
      {"not a power of two", [](nlohmann::json& j) { j["groups"][0].erase("block"); }},
      {"not a power of two", [](nlohmann::json& j) { j["chunk_elements"] = 1000; }},
      {"a block size without a q8 or q4 kind", [](nlohmann::json& j) { j["groups"][0]["stored"] = {"f32", "bf16", "bf16"}; }},
  };
  for (const auto& [what, forge] : bad) {
    nlohmann::json j = good;
    j.erase("checksum");
    forge(j);
    auto r = DecodeManifest(internal::Seal(j), "manifest.json");
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << what;
    EXPECT_NE(r.status().message().find(what), std::string_view::npos) << r.status();
    EXPECT_NE(r.status().message().find("layer0"), std::string_view::npos) << r.status();
  }
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

// A save spread over a shard's replicas ("parts"): absent means 1 (every checkpoint before it reads
// as it did, its checksum unchanged); parts round-trip in the manifest and the index, are bounded by
// the replicas a shard has, and name their files; the plan gives every chunk one part, in runs of
// about equal bytes, the same for every shard.
TEST(Format, PartsRoundTripTheirBoundsAndThePlan) {
  Manifest m = Sample();
  m.world_size = 12;
  m.shards = 4;  // 3 replicas of each shard
  EXPECT_EQ(nlohmann::json::parse(EncodeManifest(m)).count("parts"), 0u) << "one part: written as before";
  m.parts = 3;
  auto back = DecodeManifest(EncodeManifest(m), "manifest.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->parts, 3);
  for (int bad : {0, 4, kMaxParts + 1}) {
    m.parts = bad;
    auto refused = DecodeManifest(EncodeManifest(m), "manifest.json");
    EXPECT_EQ(refused.status().code(), StatusCode::kDataLoss) << bad;
    EXPECT_NE(refused.status().message().find("parts"), std::string_view::npos) << refused.status();
  }
  m.parts = 3;
  EXPECT_EQ(DataFileName(2, 1, 3), "rank-00002.part-001.data");
  EXPECT_EQ(IndexFileName(2, 1, 3), "rank-00002.part-001.index.json");
  EXPECT_EQ(IndexFileName(2, 0, 1), "rank-00002.index.json");
  const RankIndex idx = IndexOf(m, 2, 1);
  auto idx_back = DecodeIndex(EncodeIndex(idx), "i");
  ASSERT_TRUE(idx_back.ok()) << idx_back.status();
  EXPECT_EQ(idx_back->part, 1);
  EXPECT_EQ(idx_back->parts, 3);
  const std::vector<ShardLayout> layouts = *SavedLayouts(m);
  EXPECT_TRUE(ValidateIndexFile(m, layouts, *idx_back, 2, 1, "i").ok());
  EXPECT_EQ(ValidateIndexFile(m, layouts, *idx_back, 2, 2, "i").code(), StatusCode::kDataLoss) << "under another part's name";
  EXPECT_EQ(ValidateIndex(m, layouts, *idx_back, 2, "i").code(), StatusCode::kDataLoss) << "one index of a spread shard";
  // The plan over a group of 3 kinds x 10 chunks of 1024 elements (all f32): 10 chunks per part.
  Manifest big = m;
  big.chunk_elements = 1024;
  big.groups[0].tensors = {{"w", {40960}, DType::kF32, 0, 40960}};
  const std::vector<ShardLayout> bl = *SavedLayouts(big);
  const PartPlan plan(big, bl);
  std::vector<int> per_part(3, 0);
  int last = 0;
  for (int k = 0; k < 3; ++k) {
    for (int c = 0; c < 10; ++c) {
      const int p = plan.part(0, k, c);
      ASSERT_GE(p, last) << "parts are runs in chunk order";
      last = p;
      ++per_part[static_cast<size_t>(p)];
    }
  }
  EXPECT_EQ(per_part, (std::vector<int>{10, 10, 10}));
  EXPECT_EQ(plan.max_file_bytes(1), 10 * 4096);
}

// Groups over meshes of their own ("files", M7): absent means the manifest's mesh (every checkpoint
// before it reads as it did); listed, every rank wrote its file in one part, a group's files are
// distinct files of the save (one at stage 0), its layout is over them, a file's index holds chunks of
// the groups that list it alone and covers each of those, and the plan gives it only theirs.
TEST(Format, GroupsOverTheirOwnFilesRoundTripTheirRulesAndThePlan) {
  Manifest m = Sample();
  m.world_size = m.shards = 4;
  m.chunk_elements = 1024;
  EXPECT_EQ(nlohmann::json::parse(EncodeManifest(m))["groups"][0].count("files"), 0u) << "the manifest's mesh: written as before";
  GroupEntry ex = m.groups[0];
  ex.name = "experts@0";
  ex.tensors = {{"expert.0", {2000}, DType::kF32, 0, 2000}};
  ex.files = {1, 3};
  m.groups.push_back(ex);
  ex.name = "experts@1";
  ex.tensors = {{"expert.1", {2000}, DType::kF32, 0, 2000}};
  ex.files = {2, 0};
  m.groups.push_back(ex);
  auto back = DecodeManifest(EncodeManifest(m), "manifest.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->groups[1].files, (std::vector<int>{1, 3}));
  EXPECT_EQ(GroupShards(*back, 0), 4);
  EXPECT_EQ(GroupShards(*back, 2), 2);
  EXPECT_EQ(FileOf(*back, 2, 1), 0);
  EXPECT_EQ(FileOf(*back, 0, 3), 3);
  EXPECT_EQ(ShardIn(*back, 1, 3), 1);
  EXPECT_EQ(ShardIn(*back, 1, 0), -1);
  EXPECT_EQ(ShardIn(*back, 0, 2), 2);
  const std::vector<ShardLayout> layouts = *SavedLayouts(*back);
  EXPECT_EQ(layouts[1].world_size(), 2);
  // Hostile lists: each refused as corrupt, naming the group.
  const std::vector<std::pair<std::string, std::function<void(Manifest&)>>> bad = {
      {"a file listed twice", [](Manifest& x) { x.groups[1].files = {1, 1}; }},
      {"a file beyond the save", [](Manifest& x) { x.groups[1].files = {1, 4}; }},
      {"a negative file", [](Manifest& x) { x.groups[1].files = {-1, 3}; }},
      {"more shards than files", [](Manifest& x) { x.groups[1].files = {0, 1, 2, 3, 0}; }},
      {"fewer shards than ranks", [](Manifest& x) { x.shards = 2; }},
      {"parts", [](Manifest& x) { x.parts = 2; }},
      {"two shards at stage 0", [](Manifest& x) { x.stage = 0; x.groups[0].files = {0}; }},
  };
  for (const auto& [what, spoil] : bad) {
    Manifest x = m;
    spoil(x);
    auto refused = DecodeManifest(EncodeManifest(x), "manifest.json");
    EXPECT_EQ(refused.status().code(), StatusCode::kDataLoss) << what;
  }
  {
    nlohmann::json j = nlohmann::json::parse(EncodeManifest(m));
    j.erase("checksum");
    j["groups"][1]["files"] = nlohmann::json::array();
    EXPECT_EQ(DecodeManifest(internal::Seal(j), "manifest.json").status().code(), StatusCode::kDataLoss) << "an empty list";
    j["groups"][1]["files"] = {1.5, 3};
    EXPECT_EQ(DecodeManifest(internal::Seal(j), "manifest.json").status().code(), StatusCode::kDataLoss) << "a fraction";
    // Version 2 exactly when a group lists its files: a reader of version 1 refuses such a manifest.
    EXPECT_EQ(nlohmann::json::parse(EncodeManifest(m))["version"], 2);
    EXPECT_EQ(nlohmann::json::parse(EncodeManifest(Sample()))["version"], 1);
    j["groups"][1]["files"] = {1, 3};
    ASSERT_TRUE(DecodeManifest(internal::Seal(j), "manifest.json").ok());
    j["version"] = 1;
    EXPECT_EQ(DecodeManifest(internal::Seal(j), "manifest.json").status().code(), StatusCode::kDataLoss) << "files in version 1";
    nlohmann::json plain = nlohmann::json::parse(EncodeManifest(Sample()));
    plain.erase("checksum");
    plain["version"] = 2;
    EXPECT_EQ(DecodeManifest(internal::Seal(plain), "manifest.json").status().code(), StatusCode::kDataLoss) << "version 2 without files";
    plain["version"] = 3;
    EXPECT_EQ(DecodeManifest(internal::Seal(plain), "manifest.json").status().code(), StatusCode::kDataLoss) << "a version from the future";
  }
  // File 0 holds shard 0 of the dense group and shard 1 of experts@1, nothing of experts@0.
  RankIndex r = IndexOf(*back, 0);
  const int64_t ds = layouts[0].shard_size(), es = layouts[2].shard_size();
  int64_t at = 0;
  for (int k = 0; k < 3; ++k) {
    r.chunks.push_back({0, k, 0, ds, at, ds * 4, Codec::kRaw, 0});
    at += 4096;
  }
  for (int k = 0; k < 3; ++k) {
    r.chunks.push_back({2, k, 0, es, at, es * 4, Codec::kRaw, 0});
    at += 4096;
  }
  r.data_bytes = at;
  EXPECT_TRUE(ValidateIndex(*back, layouts, r, 0, "i").ok()) << ValidateIndex(*back, layouts, r, 0, "i");
  RankIndex foreign = r;
  foreign.chunks[3].group = 1;  // experts@0 is not in file 0
  const Status st = ValidateIndex(*back, layouts, foreign, 0, "i");
  EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st;
  EXPECT_NE(st.message().find("experts@0"), std::string::npos) << st;
  EXPECT_EQ(r.holds, (std::vector<std::pair<int, int>>{{2, 1}})) << "file 0 holds shard 1 of experts@1";
  auto r_back = DecodeIndex(EncodeIndex(r), "i");
  ASSERT_TRUE(r_back.ok()) << r_back.status();
  EXPECT_EQ(r_back->holds, r.holds);
  // The manifest's lists edited alone (two shards of experts@1 swapped, checksum recomputed): the
  // index disagrees, the file is refused rather than its shard taken for the other.
  Manifest swapped = *back;
  swapped.groups[2].files = {0, 2};
  const std::vector<ShardLayout> swapped_layouts = *SavedLayouts(swapped);
  const Status sw = ValidateIndex(swapped, swapped_layouts, r, 0, "i");
  EXPECT_EQ(sw.code(), StatusCode::kDataLoss) << sw;
  EXPECT_NE(sw.message().find("holds"), std::string::npos) << sw;
  RankIndex short_of = r;
  short_of.chunks.pop_back();  // experts@1's last kind missing
  EXPECT_EQ(ValidateIndex(*back, layouts, short_of, 0, "i").code(), StatusCode::kDataLoss);
  const PartPlan plan(*back, layouts, 0);
  EXPECT_EQ(plan.part(1, 0, 0), -1) << "no part of file 0 writes experts@0";
  EXPECT_EQ(plan.part(2, 0, 0), 0);
  EXPECT_EQ(plan.raw_bytes(0), 3 * 4 * (ds + es));
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
      // In two parts kept apart (a q8 chunk's codes and scales), split anywhere.
      for (size_t cut : {size_t{0}, len / 3, len}) {
        std::vector<unsigned char> tail(p + cut, p + len);
        EXPECT_EQ(Checksum(p, cut, tail.data(), tail.size()), want) << len << " cut at " << cut;
        EXPECT_EQ(generic::Checksum(p, cut, tail.data(), tail.size()), want) << len << " cut at " << cut;
        std::vector<unsigned char> head(cut + 1, 0), rest(len - cut + 1, 0);  // and copied into two places
        EXPECT_EQ(CopyAndChecksum(head.data(), cut, rest.data(), p, len), want) << len << " cut at " << cut;
        EXPECT_TRUE(std::equal(p, p + cut, head.data()) && std::equal(p + cut, p + len, rest.data())) << len << " cut at " << cut;
        EXPECT_EQ(head[cut] + rest[len - cut], 0) << "wrote past the end: " << len << " cut at " << cut;
        std::string seen;  // what `seen` is handed: the first part, in order
        auto collect = [](void* to, const char* data, size_t n) { static_cast<std::string*>(to)->append(data, n); };
        EXPECT_EQ(generic::CopyAndChecksum(head.data(), cut, rest.data(), p, len, collect, &seen), want) << len << " cut at " << cut;
        EXPECT_EQ(seen, std::string(reinterpret_cast<const char*>(p), cut)) << len << " cut at " << cut;
        if (avx2) {
          EXPECT_EQ(avx2::Checksum(p, cut, tail.data(), tail.size()), want) << len << " cut at " << cut;
          seen.clear();
          EXPECT_EQ(avx2::CopyAndChecksum(head.data(), cut, rest.data(), p, len, collect, &seen), want) << len << " cut at " << cut;
          EXPECT_EQ(seen, std::string(reinterpret_cast<const char*>(p), cut)) << len << " cut at " << cut;
        }
      }
    }
  }
}

}  // namespace
}  // namespace zrt::ckpt
