#include "zrt/core/state_view.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>

#include "zrt/core/dtype.h"
#include "zrt/core/quant_math.h"

namespace zrt {
namespace {

TEST(StateFormat, NamesSizesAndTheSignOfEachKind) {
  for (Precision p : {Precision::kF32, Precision::kBF16, Precision::kQ8, Precision::kQ4}) EXPECT_EQ(ParsePrecision(PrecisionName(p)).value(), p);
  const Result<Precision> bad = ParsePrecision("int8");
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'int8'"), std::string_view::npos) << bad.status();
  EXPECT_EQ(Precision::kBf16, Precision::kBF16) << "0.1's spelling still names bf16";

  EXPECT_EQ(StateFormat::Of(Precision::kQ8, "exp_avg", 64), (StateFormat{Precision::kQ8, true, 64}));
  EXPECT_EQ(StateFormat::Of(Precision::kQ8, "exp_avg_sq", 64), (StateFormat{Precision::kQ8, false, 64}));
  EXPECT_EQ(StateFormat::Of(Precision::kQ4, "exp_avg", 64), (StateFormat{Precision::kQ4, true, 64}));
  EXPECT_EQ(StateFormat::Of(Precision::kQ4, "exp_avg_sq", 64), (StateFormat{Precision::kQ4, false, 64}));
  EXPECT_EQ(StateFormat::Of(Precision::kBF16, "exp_avg", 64), (StateFormat{Precision::kBF16, false, 0})) << "only q8 and q4 have a sign and blocks";
  EXPECT_FALSE(StateFormat{}.compact());

  const StateFormat q8{Precision::kQ8, false, 64}, bf16{Precision::kBF16, false, 0}, f32{};
  EXPECT_EQ(q8.Bytes(256), 256 + 4 * 4);
  EXPECT_EQ(q8.Bytes(200), 200 + 4 * 4) << "a short last block has its scale";
  EXPECT_EQ(q8.Scales(65), 2);
  EXPECT_EQ(bf16.Bytes(100), 200);
  EXPECT_EQ(bf16.Scales(100), 0);
  EXPECT_EQ(f32.Bytes(100), 400);
  const StateFormat q4{Precision::kQ4, true, 64};
  EXPECT_EQ(q4.Bytes(256), 128 + 4 * 4) << "two codes a byte";
  EXPECT_EQ(q4.Bytes(201), 101 + 4 * 4) << "an odd last element takes a byte";
  EXPECT_EQ(q4.ValuesBytes(64), 32);
  EXPECT_EQ(q4.value_bytes(), 1);
}

// q4 (core/quant_math.h): two codes a byte from a low nibble, block by block as Q4EncodeBlock; Decode
// from any element, an odd one too (the byte holding it, its high nibble).
TEST(StateFormat, Q4EncodeThenDecodeFromAnyElement) {
  std::mt19937 rng(5);
  std::normal_distribution<float> d(0, 1e-2f);
  const int64_t n = 301, block = 64;  // a short last block of odd length
  for (const bool is_signed : {true, false}) {
    const StateFormat f{Precision::kQ4, is_signed, block};
    std::vector<float> in(static_cast<size_t>(n));
    for (float& v : in) v = is_signed ? d(rng) : d(rng) * d(rng);
    std::vector<uint8_t> bytes(static_cast<size_t>(f.ValuesBytes(n)), 0xee);
    std::vector<float> scales(static_cast<size_t>(f.Scales(n)));
    f.Encode(in.data(), n, bytes.data(), scales.data());
    EXPECT_EQ(bytes.back() >> 4, 0) << "the odd last element's byte ends with a high nibble of 0";
    for (int64_t b = 0; b < f.Scales(n); ++b) {
      const int64_t m = std::min(block, n - b * block);
      std::vector<uint8_t> want(static_cast<size_t>(block / 2));
      EXPECT_EQ(scales[static_cast<size_t>(b)], Q4EncodeBlock(in.data() + b * block, m, is_signed, want.data()));
      EXPECT_EQ(0, std::memcmp(want.data(), bytes.data() + b * block / 2, static_cast<size_t>((m + 1) / 2))) << "block " << b;
    }
    for (const int64_t first : {int64_t{0}, int64_t{1}, int64_t{63}, int64_t{64}, int64_t{131}}) {
      std::vector<float> out(static_cast<size_t>(n - first));
      f.Decode(bytes.data() + first / 2, scales.data() + first / block, first, n - first, out.data());
      for (int64_t i = first; i < n; ++i) {
        ASSERT_EQ(out[static_cast<size_t>(i - first)], Q4Value(Q4CodeAt(bytes.data(), i), is_signed) * scales[static_cast<size_t>(i / block)])
            << "from " << first << ", element " << i;
      }
    }
    std::vector<float> back(static_cast<size_t>(n));
    f.Decode(bytes.data(), scales.data(), 0, n, back.data());
    std::vector<uint8_t> again(bytes.size());
    std::vector<float> again_scales(scales.size());
    ASSERT_TRUE(f.EncodeExact(back.data(), n, again.data(), again_scales.data()).ok()) << "decoded values encode exactly";
    EXPECT_EQ(again, bytes);
    EXPECT_EQ(again_scales, scales);
    back[7] = back[7] * 1.01f + 1e-9f;
    EXPECT_EQ(f.EncodeExact(back.data(), n, again.data(), again_scales.data()).code(), StatusCode::kInvalidArgument);
    // A corrupt block is named: its scale, a negative zero, a largest code lowered.
    const int64_t whole = n / block * block;
    ASSERT_TRUE(f.Check(bytes.data(), scales.data(), whole).ok());
    auto refused = [&](const char* what, const std::function<void(std::vector<uint8_t>&, std::vector<float>&)>& forge) {
      std::vector<uint8_t> b = bytes;
      std::vector<float> sc = scales;
      forge(b, sc);
      const Status st = f.Check(b.data(), sc.data(), whole);
      EXPECT_EQ(st.code(), StatusCode::kDataLoss) << what;
      EXPECT_NE(st.message().find(what), std::string_view::npos) << st;
    };
    refused("q4 block 1: scale nan", [](auto&, auto& sc) { sc[1] = std::nanf(""); });
    refused("q4 block 2: scale -", [](auto&, auto& sc) { sc[2] = -sc[2]; });
    refused("q4 block 3: its largest code", [&](auto& b, auto&) { std::fill(b.begin() + 3 * block / 2, b.begin() + 4 * block / 2, uint8_t{0x11}); });
    if (is_signed) refused("q4 block 0: code 8 is never written", [](auto& b, auto&) { b[3] = static_cast<uint8_t>((b[3] & 0xf0) | 8); });
  }
  // The unsigned code has no zero: a 0 beside positive values (padding a reshard fills in) is stored as
  // the block's smallest code; the signed code holds 0 exactly.
  const std::vector<float> padded = {0.5f, 0.0f, 0.25f, 0.0f};
  std::vector<uint8_t> b(2);
  float scale = 0;
  ASSERT_TRUE((StateFormat{Precision::kQ4, false, 8}.EncodeExact(padded.data(), 4, b.data(), &scale)).ok());
  EXPECT_EQ(b[0], 0x0f) << "0.5 is the largest (15), 0 the smallest code (0)";
  EXPECT_EQ(b[1], 0x07) << "0.25 is 8/16 of the scale (code 7)";
  ASSERT_TRUE((StateFormat{Precision::kQ4, true, 8}.EncodeExact(padded.data(), 4, b.data(), &scale)).ok());
  EXPECT_EQ(b[0], 0x07);
}

// Encode rounds (bf16 to nearest even, q8 block by block as core/quant_math.h says) and Decode from
// any element, inside a block too, gives what each element's code and scale say.
TEST(StateFormat, EncodeThenDecodeFromAnyElement) {
  std::mt19937 rng(3);
  std::normal_distribution<float> d(0, 1e-2f);
  const int64_t n = 300, block = 64;  // the last block is short
  std::vector<float> x(n);
  for (float& v : x) v = d(rng);
  for (const bool is_signed : {true, false}) {
    const StateFormat f{Precision::kQ8, is_signed, block};
    std::vector<float> in = x;
    if (!is_signed) for (float& v : in) v = v * v;
    std::vector<uint8_t> codes(n);
    std::vector<float> scales(static_cast<size_t>(f.Scales(n)));
    f.Encode(in.data(), n, codes.data(), scales.data());
    for (int64_t b = 0; b < f.Scales(n); ++b) {
      std::vector<uint8_t> want(static_cast<size_t>(block));
      const int64_t m = std::min(block, n - b * block);
      EXPECT_EQ(scales[static_cast<size_t>(b)], Q8EncodeBlock(in.data() + b * block, m, is_signed, want.data()));
      EXPECT_EQ(0, std::memcmp(want.data(), codes.data() + b * block, static_cast<size_t>(m))) << "block " << b;
    }
    for (const int64_t first : {int64_t{0}, int64_t{1}, int64_t{63}, int64_t{64}, int64_t{130}}) {
      std::vector<float> out(static_cast<size_t>(n - first));
      f.Decode(codes.data() + first, scales.data() + first / block, first, n - first, out.data());
      for (int64_t i = first; i < n; ++i) {
        ASSERT_EQ(out[static_cast<size_t>(i - first)], Q8Value(codes[static_cast<size_t>(i)], is_signed) * scales[static_cast<size_t>(i / block)])
            << "from " << first << ", element " << i;
      }
    }
  }
  const StateFormat bf16{Precision::kBF16, false, 0};
  std::vector<uint16_t> h(n);
  bf16.Encode(x.data(), n, h.data(), nullptr);
  std::vector<float> back(n);
  bf16.Decode(h.data() + 5, nullptr, 5, n - 5, back.data());
  for (int64_t i = 5; i < n; ++i) ASSERT_EQ(back[static_cast<size_t>(i - 5)], Bf16ToFloat(FloatToBf16(x[static_cast<size_t>(i)])));
  std::vector<float> copy(n);
  StateFormat{}.Encode(x.data(), n, copy.data(), nullptr);
  EXPECT_EQ(copy, x);
}

// The stored forms round trip bit for bit; a value the form cannot hold is refused at a save; a stored
// form encoding never writes is DataLoss naming the block, from Check and from CodeScan alike.
TEST(StateFormat, StoredStateRoundTripsAndHostileFormsAreRefused) {
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0, 1e-3f);
  for (const int64_t block : {int64_t{8}, int64_t{64}, int64_t{2048}})  // codes one by one, 16 at a time; blocks longer than EncodeExact's piece
  for (const bool is_signed : {true, false}) {
    SCOPED_TRACE("block " + std::to_string(block) + (is_signed ? ", signed" : ""));
    const StateFormat f{Precision::kQ8, is_signed, block};
    const int64_t n = 4 * block;
    std::vector<float> x(static_cast<size_t>(n)), kept(x.size());
    for (float& v : x) v = is_signed ? d(rng) : d(rng) * d(rng);
    std::fill(x.begin() + block, x.begin() + 2 * block, 0.0f);  // an all-zero block: scale 0
    std::vector<uint8_t> codes(x.size());
    for (int64_t b = 0; b < n / block; ++b) {  // what the optimizer keeps: values its blocks decode to
      const float s = Q8EncodeBlock(x.data() + b * block, block, is_signed, codes.data() + b * block);
      for (int64_t i = b * block; i < (b + 1) * block; ++i) kept[static_cast<size_t>(i)] = Q8Value(codes[static_cast<size_t>(i)], is_signed) * s;
    }
    std::vector<char> packed(static_cast<size_t>(f.Bytes(n)));
    auto scales_of = [n](std::vector<char>& p) { return reinterpret_cast<float*>(p.data() + n); };
    ASSERT_TRUE(f.EncodeExact(kept.data(), n, packed.data(), scales_of(packed)).ok());
    EXPECT_EQ(0, std::memcmp(packed.data(), codes.data(), codes.size())) << "the codes are stored as they are";
    std::vector<float> back(x.size());
    ASSERT_TRUE(f.DecodeChecked(packed.data(), scales_of(packed), n, back.data()).ok());
    {
      CodeScan scan(f, n);
      scan.Take(packed.data(), 5);
      EXPECT_EQ(scan.Check(packed.data(), scales_of(packed)).code(), StatusCode::kDataLoss) << "not every code taken";
      scan.Take(packed.data() + 5, static_cast<size_t>(n - 5) + 100);  // what follows the codes is not taken
      EXPECT_TRUE(scan.Check(packed.data(), scales_of(packed)).ok());
    }
    EXPECT_EQ(0, std::memcmp(back.data(), kept.data(), kept.size() * 4));
    kept[5] = kept[5] * 1.0001f + 1e-9f;  // not what its block decodes to
    const Status inexact = f.EncodeExact(kept.data(), n, packed.data(), scales_of(packed));
    EXPECT_EQ(inexact.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(inexact.message().find("is not a q8 value of its block"), std::string_view::npos) << inexact;
    ASSERT_TRUE(f.EncodeExact(back.data(), n, packed.data(), scales_of(packed)).ok());
    auto refused = [&](const char* what, const std::function<void(std::vector<char>&)>& forge) {
      std::vector<char> p = packed;
      forge(p);
      const Status s = f.DecodeChecked(p.data(), scales_of(p), n, back.data());
      EXPECT_EQ(s.code(), StatusCode::kDataLoss) << what;
      EXPECT_NE(s.message().find(what), std::string_view::npos) << s;
      EXPECT_EQ(f.Check(p.data(), scales_of(p), n).message(), s.message());
      CodeScan scan(f, n);  // the codes taken as they go by, in pieces that cut blocks
      for (int64_t at = 0; at < n; at += 7) scan.Take(p.data() + at, static_cast<size_t>(std::min<int64_t>(7, n - at)));
      EXPECT_EQ(scan.Check(p.data(), scales_of(p)).message(), s.message()) << what;
    };
    auto scale = [&](std::vector<char>& p, int64_t b, float v) { std::memcpy(p.data() + n + 4 * b, &v, 4); };
    refused("scale nan", [&](std::vector<char>& p) { scale(p, 0, std::nanf("")); });
    refused("scale inf", [&](std::vector<char>& p) { scale(p, 2, INFINITY); });
    refused("scale -", [&](std::vector<char>& p) { scale(p, 3, -1.0f); });
    refused("does not match its scale", [&](std::vector<char>& p) { scale(p, 1, 1.0f); });  // zeros with a scale
    refused("is never written", [&](std::vector<char>& p) { p[7] = static_cast<char>(is_signed ? 121 : 249); });
    if (is_signed) refused("is never written", [&](std::vector<char>& p) { p[block + 1] = static_cast<char>(0x80); });  // -0
    refused("does not match its scale", [&](std::vector<char>& p) {  // the largest code lowered
      for (int64_t i = 0; i < block; ++i) p[static_cast<size_t>(i)] = static_cast<char>(std::min<int>(static_cast<uint8_t>(p[static_cast<size_t>(i)]) & 0x7f, 64));
    });
    const Status split = f.Check(packed.data(), scales_of(packed), n - 1);
    EXPECT_EQ(split.code(), StatusCode::kDataLoss) << "a check covers whole blocks";
  }
  const StateFormat bf16{Precision::kBF16, false, 0};
  const std::vector<float> h = {1.0f, -0.5f, 3.140625f, 0.0f};
  std::vector<char> p(8);
  std::vector<float> back(4);
  ASSERT_TRUE(bf16.EncodeExact(h.data(), 4, p.data(), nullptr).ok());
  ASSERT_TRUE(bf16.DecodeChecked(p.data(), nullptr, 4, back.data()).ok());
  EXPECT_EQ(back, h);
  for (const std::vector<float>& bad : {std::vector<float>{1.0f, 0.1f}, std::vector<float>{1.0f, std::nanf("")}}) {
    const Status s = bf16.EncodeExact(bad.data(), 2, p.data(), nullptr);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("element 1"), std::string_view::npos) << s;
  }
}

// Check against a checker written from the format's prose (docs/checkpoint-format.md "Stored
// state"), element by element, on valid blocks with random codes and scales changed: the same verdict
// every time, and CodeScan fed in random pieces agrees. q8: a byte a code, 1.0 is 120 signed and 248
// unsigned; q4: two codes a byte from the low nibble, 1.0 is 7 signed and 15 unsigned; signed codes
// carry their sign in the top bit, and a negative zero is never written.
bool Canonical(const uint8_t* bytes, const float* scales, int64_t n, int64_t block, bool is_signed, bool q4) {
  const int top = q4 ? (is_signed ? 7 : 15) : (is_signed ? 120 : 248), sign = q4 ? 8 : 0x80;
  for (int64_t b = 0; b < n / block; ++b) {
    const float s = scales[b];
    if (!std::isfinite(s) || s < 0) return false;
    int largest = 0;
    for (int64_t i = b * block; i < (b + 1) * block; ++i) {
      const int code = q4 ? (bytes[i / 2] >> (i % 2 == 1 ? 4 : 0)) & 15 : bytes[i];
      const int mag = is_signed ? code & (sign - 1) : code;
      if (mag > top || (is_signed && code == sign)) return false;
      largest = std::max(largest, mag);
    }
    if (largest != (s > 0 ? top : 0)) return false;
  }
  return true;
}

TEST(StateFormat, CheckAgreesWithTheFormatsRulesOnRandomForgeries) {
  std::mt19937 rng(11);
  std::normal_distribution<float> d(0, 1e-3f);
  int refused = 0;
  for (int round = 0; round < 2000; ++round) {
    const int64_t block = int64_t{8} << (rng() % 4), n = block * (1 + rng() % 5);
    const bool is_signed = rng() & 1, q4 = rng() & 1;
    const StateFormat f{q4 ? Precision::kQ4 : Precision::kQ8, is_signed, block};
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = rng() % 7 == 0 ? 0.0f : d(rng);
    if (rng() % 4 == 0) std::fill(x.begin(), x.begin() + block, 0.0f);  // an all-zero block
    std::vector<uint8_t> codes(static_cast<size_t>(f.ValuesBytes(n)));
    std::vector<float> scales(static_cast<size_t>(f.Scales(n)));
    f.Encode(x.data(), n, codes.data(), scales.data());
    ASSERT_TRUE(f.Check(codes.data(), scales.data(), n).ok()) << "what Encode writes is canonical";
    for (int k = 0, edits = 1 + static_cast<int>(rng() % 3); k < edits; ++k) {
      switch (rng() % 4) {
        case 0: codes[rng() % codes.size()] = static_cast<uint8_t>(rng()); break;
        case 1: codes[rng() % codes.size()] ^= static_cast<uint8_t>(1u << (rng() % 8)); break;
        case 2: scales[rng() % scales.size()] = (rng() & 1) ? 0.0f : -scales[rng() % scales.size()]; break;
        default: {
          uint32_t u;
          float& s = scales[rng() % scales.size()];
          std::memcpy(&u, &s, 4);
          u ^= 1u << (rng() % 32);
          std::memcpy(&s, &u, 4);
        }
      }
    }
    const bool want = Canonical(codes.data(), scales.data(), n, block, is_signed, q4);
    const Status got = f.Check(codes.data(), scales.data(), n);
    ASSERT_EQ(got.ok(), want) << "round " << round << ": " << got;
    if (!want) {
      ++refused;
      EXPECT_EQ(got.code(), StatusCode::kDataLoss);
    }
    CodeScan scan(f, n);
    for (int64_t at = 0; at < static_cast<int64_t>(codes.size());) {
      const int64_t take = std::min<int64_t>(static_cast<int64_t>(codes.size()) - at, 1 + rng() % 40);
      scan.Take(reinterpret_cast<const char*>(codes.data()) + at, static_cast<size_t>(take));
      at += take;
    }
    ASSERT_EQ(scan.Check(codes.data(), scales.data()).message(), got.message()) << "round " << round;
  }
  EXPECT_GT(refused, 400) << "the forgeries exercise the refusals";
}

}  // namespace
}  // namespace zrt
