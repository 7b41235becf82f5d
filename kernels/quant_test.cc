// Compact optimizer state (core/quant_math.h): the 8-bit code, stochastic rounding and the fused
// compact Adam step — every ISA bit for bit against the scalar path, the scalar path against an
// independent NumPy implementation of the documented rule (kernels/quant_reference.py), and the
// properties resharding relies on.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "zrt/core/thread_pool.h"
#include "zrt/kernels/adam.h"

namespace zrt::kernels {
namespace {

// The documented value of a code, computed independently (ldexp in double).
double DocumentedValue(int c, bool is_signed) {
  const int f = c & 7, e = is_signed ? (c >> 3) & 15 : c >> 3, bias = is_signed ? 15 : 31;
  const double mag = e == 0 ? std::ldexp(f / 8.0, 1 - bias) : std::ldexp(1 + f / 8.0, e - bias);
  return is_signed && (c & 0x80) ? -mag : mag;
}

TEST(Q8, CodesDecodeToTheDocumentedValuesAndEncodeBack) {
  for (bool is_signed : {false, true}) {
    const int top = is_signed ? 120 : 248;  // the code of 1.0
    EXPECT_EQ(Q8Value(static_cast<uint8_t>(top), is_signed), 1.0f);
    for (int c = 0; c < 256; ++c) {
      const float v = Q8Value(static_cast<uint8_t>(c), is_signed);
      EXPECT_EQ(static_cast<double>(v), DocumentedValue(c, is_signed)) << c;
      const int mag = is_signed ? c & 0x7f : c;
      if (mag > top || (is_signed && c == 0x80)) continue;  // never written
      for (float scale : {1.0f, 0.37f, 3e-9f, 1e30f}) {
        const float x = v * scale;
        EXPECT_EQ(Q8Encode(x, Q8Recip(scale), is_signed), c) << "code " << c << " scale " << scale;
      }
    }
    EXPECT_EQ(Q8Encode(5.0f, Q8Recip(0.0f), is_signed), 0);      // an all-zero block
    EXPECT_EQ(Q8Encode(2.0f, Q8Recip(1.0f), is_signed), top);    // r clamps at 1
    EXPECT_EQ(Q8Encode(NAN, Q8Recip(1.0f), is_signed), top);     // NaN: as the largest (min(NaN, 1) = 1)
    EXPECT_EQ(Q8Encode(-0.0f, Q8Recip(1.0f), is_signed), 0);     // no negative zero
  }
  EXPECT_EQ(Q8Encode(-1.0f, 1.0f, true), 0x80 | 120);
  EXPECT_EQ(Q8Encode(-1e-30f, 1.0f, true), 0);  // rounds to 0: unsigned zero
}

// Encoding picks the nearest code, ties to the even one: against a brute-force search in double.
TEST(Q8, EncodeIsTheNearestCodeTiesToEven) {
  std::mt19937 rng(std::random_device{}());
  for (bool is_signed : {false, true}) {
    const int top = is_signed ? 120 : 248;
    std::vector<double> table;
    for (int c = 0; c <= top; ++c) table.push_back(DocumentedValue(c, is_signed));
    std::vector<float> rs;
    std::uniform_real_distribution<double> log(-40, 0);
    for (int i = 0; i < 200000; ++i) rs.push_back(static_cast<float>(std::exp2(log(rng))));
    for (int c = 0; c < top; ++c) rs.push_back(static_cast<float>((table[c] + table[c + 1]) / 2));  // every tie
    for (const float r : rs) {
      int best = 0;
      for (int c = 1; c <= top; ++c) {
        const double d = std::fabs(table[c] - r), b = std::fabs(table[best] - r);
        if (d < b || (d == b && c % 2 == 0)) best = c;
      }
      ASSERT_EQ(Q8Encode(r, 1.0f, is_signed), best) << "r = " << r;
      if (is_signed && best != 0) {
        ASSERT_EQ(Q8Encode(-r, 1.0f, true), 0x80 | best);
      }
    }
  }
}

// Stochastic rounding: deterministic in (seed, step, index), a bf16 neighbour, unbiased on average.
TEST(StochasticRounding, DeterministicNeighbourAndUnbiased) {
  const float x = 1.0f + 0x1p-10f;  // 1/8 of the way from 1.0 to the next bf16 (1 + 2^-7)
  double sum = 0;
  const int n = 200000;
  const uint32_t key = RoundingKey(7, 3, 0);
  for (int i = 0; i < n; ++i) {
    const uint16_t h = FloatToBf16Stochastic(x, key, static_cast<uint32_t>(i));
    ASSERT_TRUE(h == 0x3f80 || h == 0x3f81) << h;
    ASSERT_EQ(h, FloatToBf16Stochastic(x, key, static_cast<uint32_t>(i)));
    sum += Bf16ToFloat(h);
  }
  EXPECT_NEAR(sum / n, x, 3e-5);  // 5 standard errors: 2^-7 sqrt(p (1 - p) / n) = 5.8e-6 with p = 1/8
  EXPECT_NE(RoundingKey(7, 3, 0), RoundingKey(7, 4, 0));
  EXPECT_NE(RoundingKey(7, 3, 0), RoundingKey(8, 3, 0));
  EXPECT_NE(RoundingKey(7, 3, 0), RoundingKey(7, 3, 1));
  EXPECT_EQ(FloatToBf16Stochastic(1.0f, key, 5), 0x3f80);  // bf16 values stay as they are
}

// The q4 codes: the documented values (E2M1 magnitudes over 6, signed; (c + 1) / 16 unsigned), each
// encoding back to itself at any scale, and the encode the nearest value, ties away from zero.
TEST(Q4, CodesDecodeToTheDocumentedValuesAndEncodeToTheNearest) {
  const double e2m1[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  for (bool is_signed : {false, true}) {
    std::vector<double> table;  // magnitudes of codes 0..top
    const int top = is_signed ? 7 : 15;
    for (int c = 0; c <= top; ++c) table.push_back(is_signed ? static_cast<double>(static_cast<float>(e2m1[c] / 6)) : (c + 1) / 16.0);
    EXPECT_EQ(Q4Value(static_cast<uint8_t>(top), is_signed), 1.0f);
    for (int c = 0; c < 16; ++c) {
      const double want = is_signed ? (c & 8 ? -1 : 1) * table[static_cast<size_t>(c & 7)] : table[static_cast<size_t>(c)];
      EXPECT_EQ(static_cast<double>(Q4Value(static_cast<uint8_t>(c), is_signed)), want) << c;
      if (is_signed && c == 8) continue;  // negative zero: never written
      for (float scale : {1.0f, 0.37f, 3e-9f, 1e30f}) {
        EXPECT_EQ(Q4Encode(Q4Value(static_cast<uint8_t>(c), is_signed) * scale, Q8Recip(scale), is_signed), c) << c << " scale " << scale;
      }
    }
    EXPECT_EQ(Q4Encode(5.0f, Q8Recip(0.0f), is_signed), 0);  // an all-zero block
    EXPECT_EQ(Q4Encode(2.0f, 1.0f, is_signed), top);          // r clamps at 1
    EXPECT_EQ(Q4Encode(-0.0f, 1.0f, is_signed), 0);           // no negative zero
    std::mt19937 rng(std::random_device{}());
    std::vector<float> rs;
    std::uniform_real_distribution<double> log(-12, 0);
    for (int i = 0; i < 100000; ++i) rs.push_back(static_cast<float>(std::exp2(log(rng))));
    for (int c = 0; c < top; ++c) {  // the ties, as the rule's f32 thresholds, and their neighbours
      const float t = is_signed ? static_cast<float>((e2m1[c] + e2m1[c + 1]) / 12) : static_cast<float>(c + 1.5) / 16.0f;
      rs.insert(rs.end(), {t, std::nextafter(t, 0.0f), std::nextafter(t, 1.0f)});
    }
    for (const float r : rs) {
      const float t = static_cast<float>(r);
      int best = 0;  // nearest by the thresholds: the last code whose lower midpoint is <= r
      for (int c = 1; c <= top; ++c) {
        // the rule's thresholds: the f32 nearest each midpoint
        const float mid = is_signed ? static_cast<float>((e2m1[c - 1] + e2m1[c]) / 12) : static_cast<float>(c + 0.5) / 16.0f;
        if (t >= mid) best = c;
      }
      ASSERT_EQ(Q4Encode(t, 1.0f, is_signed), best) << "r = " << t;
      if (is_signed && best != 0) {
        ASSERT_EQ(Q4Encode(-t, 1.0f, true), 8 | best);
      }
      const double d = std::fabs(table[static_cast<size_t>(best)] - t);  // and it is the nearest value
      for (double v : table) ASSERT_LE(d, std::fabs(v - t) + 1e-7) << "r = " << t;
    }
  }
}

// ---- the compact step -------------------------------------------------------------------------------

struct Buffers {
  std::vector<uint8_t> p, g, m, v, copy;
  std::vector<float> ms, vs;
};

// q8 moments: in every third block, element 5 gets the block's largest first moment (code 120, the
// others at most 119, the scale 0.1 so the gradients cannot overtake it), a zero second moment and a
// zero gradient: the coupling zeroes it, so the block's stored scale is not the largest magnitude before
// the coupling (the kernels' rare second pass, StoreBlock in cpu_loops.h).
bool Planted(int64_t i, int64_t block) { return (i / block) % 3 == 1 && i % block == 5; }
void PlantCoupledMaxima(Buffers& b, int64_t block, int64_t n, DType grad) {
  for (int64_t q = 1; q * block + 5 < n; q += 3) {
    b.ms[static_cast<size_t>(q)] = 0.1f;
    for (int64_t i = q * block; i < std::min(n, q * block + block); ++i) {
      uint8_t& c = b.m[static_cast<size_t>(i)];
      if ((c & 0x7f) == 120) --c;
    }
    const int64_t e = q * block + 5;
    b.m[static_cast<size_t>(e)] = static_cast<uint8_t>(120 | (q & 2 ? 0x80 : 0));
    b.v[static_cast<size_t>(e)] = 0;
    const size_t width = grad == DType::kBF16 ? 2 : 4;
    std::memset(b.g.data() + static_cast<size_t>(e) * width, 0, width);
  }
}

// Random state in the given formats: parameters ~ N(0, 1), gradients ~ N(0, 1) with a few blocks much
// smaller, valid codes and positive scales for q8 and q4 moments.
Buffers RandomState(const CompactFormat& f, int64_t n, DType grad, std::mt19937& rng) {
  Buffers b;
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> byte(0, 255);
  auto fill_floats = [&](std::vector<uint8_t>& out, bool half, float scale, bool positive) {
    out.resize(static_cast<size_t>(n) * (half ? 2 : 4));
    for (int64_t i = 0; i < n; ++i) {
      float x = normal(rng) * scale * ((i / 300) % 5 == 4 ? 1e-4f : 1.0f);
      if (positive) x = x * x;
      if (half) {
        const uint16_t h = FloatToBf16(x);
        std::memcpy(out.data() + i * 2, &h, 2);
      } else {
        std::memcpy(out.data() + i * 4, &x, 4);
      }
    }
  };
  auto moment = [&](std::vector<uint8_t>& out, std::vector<float>& scales, Precision mf, bool is_signed, float scale) {
    if (!IsBlockwise(mf)) return fill_floats(out, mf == Precision::kBF16, scale, !is_signed);
    if (mf == Precision::kQ8) {
      out.resize(static_cast<size_t>(n));
      for (auto& c : out) {
        const int v = byte(rng);
        c = static_cast<uint8_t>(is_signed ? (v & 0x80) | ((v & 0x7f) % 121) : v % 249);
      }
    } else {
      out.assign(static_cast<size_t>((n + 1) / 2), 0);
      for (int64_t i = 0; i < n; ++i) {
        int c = byte(rng) & 15;
        if (is_signed && c == 8) c = 0;  // no negative zero
        out[static_cast<size_t>(i / 2)] |= static_cast<uint8_t>(c << (4 * (i & 1)));
      }
    }
    scales.resize(static_cast<size_t>(Q8Blocks(n, f.block)));
    for (float& s : scales) s = std::exp2(std::uniform_real_distribution<float>(-20, 0)(rng)) * scale;
  };
  fill_floats(b.p, !f.master, 1.0f, false);
  fill_floats(b.g, grad == DType::kBF16, 1.0f, false);
  moment(b.m, b.ms, f.exp_avg, true, 0.1f);
  moment(b.v, b.vs, f.exp_avg_sq, false, 0.01f);
  if (f.exp_avg == Precision::kQ8 && f.exp_avg_sq == Precision::kQ8) PlantCoupledMaxima(b, f.block, n, grad);
  if (f.master) b.copy.assign(static_cast<size_t>(n) * 2, 0xab);
  return b;
}

AdamCompactArgs ArgsOf(Buffers& b, const CompactFormat& f, int64_t n, int64_t index) {
  AdamCompactArgs a;
  a.param = b.p.data();
  a.grad = b.g.data();
  a.exp_avg = b.m.data();
  a.exp_avg_scale = b.ms.empty() ? nullptr : b.ms.data();
  a.exp_avg_sq = b.v.data();
  a.exp_avg_sq_scale = b.vs.empty() ? nullptr : b.vs.data();
  a.param_copy = b.copy.empty() ? nullptr : b.copy.data();
  a.numel = n;
  a.index = index;
  a.format = f;
  return a;
}

AdamStepScalars Scalars(bool l2, int64_t step, double grad_scale = 1.0 / 1024) {
  AdamConfig c;
  c.lr = 1e-3;
  c.weight_decay = 0.1;
  c.mode = l2 ? AdamMode::kAdamL2 : AdamMode::kAdamW;
  return MakeAdamStepScalars(c, step, grad_scale).value();
}

// Every byte a step writes: parameters, both moments and their scales, the 16-bit copy.
void ExpectSameState(const Buffers& b, const Buffers& ref, const std::string& what) {
  EXPECT_EQ(b.p, ref.p) << what;
  EXPECT_EQ(b.m, ref.m) << what;
  EXPECT_EQ(b.v, ref.v) << what;
  EXPECT_EQ(b.ms, ref.ms) << what;
  EXPECT_EQ(b.vs, ref.vs) << what;
  EXPECT_EQ(b.copy, ref.copy) << what;
}

std::vector<CompactFormat> AllFormats() {
  std::vector<CompactFormat> out;
  for (bool master : {true, false}) {
    for (Precision m : {Precision::kF32, Precision::kBF16, Precision::kQ8, Precision::kQ4}) {
      for (Precision v : {Precision::kF32, Precision::kBF16, Precision::kQ8, Precision::kQ4}) {
        out.push_back({.exp_avg = m, .exp_avg_sq = v, .master = master, .block = 256, .seed = 1234});
      }
    }
  }
  return out;
}

std::string Name(const CompactFormat& f) {
  return std::string(PrecisionName(f.exp_avg)) + "/" + std::string(PrecisionName(f.exp_avg_sq)) + (f.master ? " master" : " no master");
}

// Every ISA this CPU has, every thread count and chunk: the same bytes as the scalar path.
// Block-wise formats at a block shorter than a vector (8), the default (256) and the largest.
TEST(AdamCompact, EveryIsaThreadCountAndChunkGivesTheSameBytes) {
  std::mt19937 rng(std::random_device{}());
  ThreadPool pool(3, "test");
  std::vector<CompactFormat> formats;
  for (const CompactFormat& f : AllFormats()) {
    formats.push_back(f);
    if (!IsBlockwise(f.exp_avg) && !IsBlockwise(f.exp_avg_sq)) continue;
    for (int64_t block : {int64_t{8}, int64_t{kMaxQuantBlock}}) {
      formats.push_back(f);
      formats.back().block = block;
    }
  }
  for (const CompactFormat& f : formats) {
    for (DType grad : {DType::kF32, DType::kBF16}) {
      // f32 gradients loss-scaled, bf16 ones not (a grad_scale of 1 skips the multiply).
      const AdamStepScalars s = Scalars(false, 7, grad == DType::kF32 ? 1.0 / 1024 : 1.0);
      const int64_t n = 5000 + static_cast<int64_t>(rng() % 3000);
      const Buffers start = RandomState(f, n, grad, rng);
      Buffers ref = start;
      AdamCompactArgs a = ArgsOf(ref, f, n, f.block * 3);
      ASSERT_TRUE(AdamCompactCpu(s, 7, {&a, 1}, grad, DType::kBF16, {.isa = CpuIsa::kScalar}).ok());
      // The vector encoders take codes of exponent 0 (magnitudes 1..7) on a path of their own: the
      // state must reach it, in vectors that mix them with larger codes (checked at the default block).
      for (const auto& [codes, is_signed] : {std::pair{&ref.m, true}, std::pair{&ref.v, false}}) {
        if ((is_signed ? f.exp_avg : f.exp_avg_sq) != Precision::kQ8 || f.block != 256) continue;
        int mixed = 0;
        for (size_t i = 0; i + 16 <= codes->size(); i += 16) {
          int tiny = 0;
          for (size_t j = i; j < i + 16; ++j) tiny += ((*codes)[j] & (is_signed ? 0x7f : 0xff)) - 1u < 7u;
          mixed += tiny > 0 && tiny < 16;
        }
        EXPECT_GT(mixed, 0) << Name(f) << (is_signed ? " exp_avg" : " exp_avg_sq") << ": no vector mixes exponent-0 codes with others";
      }
      for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16}) {
        if (!CpuSupports(isa)) continue;
        for (int64_t chunk : {int64_t{1} << 15, int64_t{100}}) {
          Buffers b = start;
          AdamCompactArgs t = ArgsOf(b, f, n, f.block * 3);
          ASSERT_TRUE(AdamCompactCpu(s, 7, {&t, 1}, grad, DType::kBF16, {.pool = &pool, .isa = isa, .chunk = chunk}).ok());
          const std::string what = Name(f) + " block " + std::to_string(f.block) + " " + std::string(CpuIsaName(isa)) + " chunk " + std::to_string(chunk);
          ExpectSameState(b, ref, what);
        }
      }
    }
  }
}

// The encoders at their decision boundaries: with beta1 = beta2 = 0 a step stores m = g and v = g * g,
// so gradients placed at every boundary between two codes (q8: the midpoint of neighbouring values; q4:
// the rule's thresholds) and a few ulps either side put the vector encoders' rounding where it is
// closest to wrong. Each block's element 0 sets its scale (1, or 0.75 for an inexact reciprocal).
// Every ISA against the scalar path, and the scalar path's codes against Q8Encode / Q4Encode.
TEST(AdamCompact, EveryIsaEncodesAtEveryBoundaryAsTheRule) {
  auto boundaries = [](Precision p, bool is_signed) {
    std::vector<float> out;
    if (p == Precision::kQ8) {
      const int top = is_signed ? 120 : 248;
      for (int c = 0; c < top; ++c) {
        out.push_back(static_cast<float>((static_cast<double>(Q8Value(static_cast<uint8_t>(c), is_signed)) +
                                          Q8Value(static_cast<uint8_t>(c + 1), is_signed)) / 2));
      }
    } else if (is_signed) {
      for (int k = 0; k < 7; ++k) out.push_back(Q4SignedMid(k));
    } else {
      for (int c = 0; c < 15; ++c) out.push_back((static_cast<float>(c) + 1.5f) / 16.0f);
    }
    out.push_back(1.0f);
    return out;
  };
  auto step_ulps = [](float x, int d) {
    for (; d > 0; --d) x = std::nextafter(x, 2.0f);
    for (; d < 0; ++d) x = std::nextafter(x, 0.0f);
    return x;
  };
  AdamConfig c;
  c.lr = 1e-3;
  c.beta1 = 0;
  c.beta2 = 0;
  c.weight_decay = 0;
  const AdamStepScalars s = MakeAdamStepScalars(c, 3).value();
  for (Precision mp : {Precision::kQ8, Precision::kQ4}) {
    for (Precision vp : {Precision::kQ8, Precision::kQ4}) {
      for (bool master : {true, false}) {
        const CompactFormat f{.exp_avg = mp, .exp_avg_sq = vp, .master = master, .block = 256, .seed = 99};
        // Gradients: the first moment's boundaries (both signs), and the square roots of the second's.
        std::vector<float> gs;
        for (float b : boundaries(mp, true)) {
          for (int d = -3; d <= 3; ++d) {
            if (step_ulps(b, d) <= 1.0f) gs.insert(gs.end(), {step_ulps(b, d), -step_ulps(b, d)});  // element 0 stays the largest
          }
        }
        for (float b : boundaries(vp, false)) {
          const float root = static_cast<float>(std::sqrt(static_cast<double>(b)));
          for (int d = -6; d <= 6; ++d) {
            if (step_ulps(root, d) <= 1.0f) gs.push_back(step_ulps(root, d));
          }
        }
        const int64_t block = f.block, per_block = block - 1, blocks = 2 * ((static_cast<int64_t>(gs.size()) + per_block - 1) / per_block);
        const int64_t n = blocks * block - 3;  // a short last block
        std::vector<float> grad(static_cast<size_t>(n));
        for (int64_t q = 0; q < blocks; ++q) {
          const float scale = q % 2 == 0 ? 1.0f : 0.75f;  // the second pass of the list at the inexact reciprocal
          for (int64_t j = 0; j < block && q * block + j < n; ++j) {
            const int64_t at = (q / 2) * per_block + j - 1;
            grad[static_cast<size_t>(q * block + j)] = j == 0 ? scale : gs[static_cast<size_t>(at) % gs.size()] * scale;
          }
        }
        Buffers start;
        start.g.resize(static_cast<size_t>(n) * 4);
        std::memcpy(start.g.data(), grad.data(), start.g.size());
        start.p.assign(static_cast<size_t>(n) * (master ? 4 : 2), 0);
        auto code_bytes = [n](Precision p) { return static_cast<size_t>(p == Precision::kQ8 ? n : (n + 1) / 2); };
        start.m.assign(code_bytes(mp), 0);
        start.v.assign(code_bytes(vp), 0);
        start.ms.assign(static_cast<size_t>(blocks), 0.0f);
        start.vs.assign(static_cast<size_t>(blocks), 0.0f);
        if (master) start.copy.assign(static_cast<size_t>(n) * 2, 0);
        Buffers ref = start;
        AdamCompactArgs a = ArgsOf(ref, f, n, 0);
        ASSERT_TRUE(AdamCompactCpu(s, 3, {&a, 1}, DType::kF32, DType::kBF16, {.isa = CpuIsa::kScalar}).ok());
        // The scalar path's codes are the rule's: m = g, v = g * g (the coupling aside: q8's v code 0).
        for (int64_t q = 0; q < blocks; ++q) {
          const int64_t b0 = q * block, len = std::min(block, n - b0);
          std::vector<float> m(grad.begin() + b0, grad.begin() + b0 + len), v(static_cast<size_t>(len));
          for (int64_t j = 0; j < len; ++j) v[static_cast<size_t>(j)] = m[static_cast<size_t>(j)] * m[static_cast<size_t>(j)];
          ASSERT_EQ(ref.ms[static_cast<size_t>(q)], std::fabs(m[0])) << "block " << q;
          ASSERT_EQ(ref.vs[static_cast<size_t>(q)], v[0]) << "block " << q;
          for (int64_t j = 0; j < len; ++j) {
            const int64_t i = b0 + j;
            const float mj = m[static_cast<size_t>(j)], vj = v[static_cast<size_t>(j)];
            const uint8_t vc = vp == Precision::kQ8 ? Q8Encode(vj, Q8Recip(v[0]), false) : Q4Encode(vj, Q8Recip(v[0]), false);
            const bool coupled = vp == Precision::kQ8 && vc == 0;
            const uint8_t mc = coupled ? 0 : mp == Precision::kQ8 ? Q8Encode(mj, Q8Recip(std::fabs(m[0])), true) : Q4Encode(mj, Q8Recip(std::fabs(m[0])), true);
            const uint8_t got_v = vp == Precision::kQ8 ? ref.v[static_cast<size_t>(i)] : Q4CodeAt(ref.v.data(), i);
            const uint8_t got_m = mp == Precision::kQ8 ? ref.m[static_cast<size_t>(i)] : Q4CodeAt(ref.m.data(), i);
            ASSERT_EQ(int{got_v}, int{vc}) << Name(f) << " element " << i << " v " << vj;
            ASSERT_EQ(int{got_m}, int{mc}) << Name(f) << " element " << i << " m " << mj;
          }
        }
        for (CpuIsa isa : {CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16}) {
          if (!CpuSupports(isa)) continue;
          Buffers b = start;
          AdamCompactArgs t = ArgsOf(b, f, n, 0);
          ASSERT_TRUE(AdamCompactCpu(s, 3, {&t, 1}, DType::kF32, DType::kBF16, {.isa = isa}).ok());
          const std::string what = Name(f) + " " + std::string(CpuIsaName(isa));
          ExpectSameState(b, ref, what);
        }
      }
    }
  }
}

// A q4 second moment exactly at a tie between two codes rounds up, on every ISA. With beta2 = 1/2 and
// the block's scale 1 (element 0: code 15, gradient 1), v = (c' + 1) / 32 + g * g / 2 is exact for g in
// {0, 1/4, 1/2, 3/4, 1}, and c' is chosen to put v at (c + 1.5) / 16, the tie between c and c + 1.
TEST(AdamCompact, AQ4SecondMomentAtATieRoundsUpOnEveryIsa) {
  AdamConfig c;
  c.lr = 1e-3;
  c.beta2 = 0.5;
  const AdamStepScalars s = MakeAdamStepScalars(c, 2).value();
  const CompactFormat f{.exp_avg = Precision::kQ4, .exp_avg_sq = Precision::kQ4, .master = true, .block = 64};
  std::vector<std::pair<int, float>> ties = {{15, 1.0f}};  // (c', g); element 0 sets the scale
  std::vector<int> want = {15};
  for (int code = 0; code < 15; ++code) {
    for (int q = 0; q <= 4; ++q) {
      const int old = 2 * code + 2 - q * q;
      if (old >= 0 && old <= 15) {
        ties.emplace_back(old, static_cast<float>(q) / 4);
        want.push_back(code + 1);
      }
    }
  }
  ASSERT_LE(ties.size(), 64u);
  const int64_t n = static_cast<int64_t>(ties.size());
  Buffers start;
  start.p.assign(static_cast<size_t>(n) * 4, 0);
  start.g.resize(static_cast<size_t>(n) * 4);
  start.m.assign(static_cast<size_t>((n + 1) / 2), 0);
  start.v.assign(static_cast<size_t>((n + 1) / 2), 0);
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(start.g.data() + i * 4, &ties[static_cast<size_t>(i)].second, 4);
    start.v[static_cast<size_t>(i / 2)] |= static_cast<uint8_t>(ties[static_cast<size_t>(i)].first << (4 * (i & 1)));
  }
  start.ms = {0.0f};
  start.vs = {1.0f};
  start.copy.assign(static_cast<size_t>(n) * 2, 0);
  for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16}) {
    if (!CpuSupports(isa)) continue;
    Buffers b = start;
    AdamCompactArgs t = ArgsOf(b, f, n, 0);
    ASSERT_TRUE(AdamCompactCpu(s, 2, {&t, 1}, DType::kF32, DType::kBF16, {.isa = isa}).ok());
    EXPECT_EQ(b.vs[0], 1.0f) << CpuIsaName(isa);
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(int{Q4CodeAt(b.v.data(), i)}, want[static_cast<size_t>(i)]) << CpuIsaName(isa) << " element " << i;
  }
}

// f32 moments with a master are today's state: the compact step equals AdamCpu bit for bit.
TEST(AdamCompact, F32StateWithAMasterIsTheUsualStep) {
  std::mt19937 rng(std::random_device{}());
  const CompactFormat f{};
  const int64_t n = 3001;
  for (bool l2 : {false, true}) {
    Buffers a = RandomState(f, n, DType::kBF16, rng), b = a;
    AdamCompactArgs ca = ArgsOf(a, f, n, 0);
    ASSERT_TRUE(AdamCompactCpu(Scalars(l2, 3), 3, {&ca, 1}, DType::kBF16, DType::kBF16).ok());
    AdamTensorArgs t{reinterpret_cast<float*>(b.p.data()), b.g.data(), reinterpret_cast<float*>(b.m.data()),
                     reinterpret_cast<float*>(b.v.data()), nullptr, b.copy.data(), n};
    ASSERT_TRUE(AdamCpu(Scalars(l2, 3), {&t, 1}, DType::kBF16, DType::kBF16).ok());
    EXPECT_EQ(a.p, b.p);
    EXPECT_EQ(a.m, b.m);
    EXPECT_EQ(a.v, b.v);
    EXPECT_EQ(a.copy, b.copy);
  }
}

// Resharding moves whole blocks: a shard updated as two pieces (cut at a block boundary, each with
// its own global index) ends in the very same bytes as updated whole.
TEST(AdamCompact, APieceOfAShardUpdatesAsTheWholeDoes) {
  std::mt19937 rng(std::random_device{}());
  for (const CompactFormat& f : AllFormats()) {
    const int64_t n = 256 * 11 + 77, cut = 256 * 4, base = 256 * 1000;
    const Buffers start = RandomState(f, n, DType::kBF16, rng);
    Buffers whole = start;
    AdamCompactArgs w = ArgsOf(whole, f, n, base);
    ASSERT_TRUE(AdamCompactCpu(Scalars(false, 9), 9, {&w, 1}, DType::kBF16, DType::kBF16).ok());
    Buffers parts = start;
    AdamCompactArgs a = ArgsOf(parts, f, cut, base), b = ArgsOf(parts, f, n - cut, base + cut);
    const size_t pe = f.master ? 4 : 2;
    b.param = parts.p.data() + cut * pe;
    b.grad = parts.g.data() + cut * 2;
    b.exp_avg = parts.m.data() + f.exp_avg_format().ValuesBytes(cut);
    b.exp_avg_sq = parts.v.data() + f.exp_avg_sq_format().ValuesBytes(cut);
    if (b.exp_avg_scale) b.exp_avg_scale += cut / 256;
    if (b.exp_avg_sq_scale) b.exp_avg_sq_scale += cut / 256;
    if (b.param_copy) b.param_copy = parts.copy.data() + cut * 2;
    const AdamCompactArgs both[] = {b, a};
    ASSERT_TRUE(AdamCompactCpu(Scalars(false, 9), 9, both, DType::kBF16, DType::kBF16).ok());
    EXPECT_EQ(parts.p, whole.p) << Name(f);
    EXPECT_EQ(parts.m, whole.m) << Name(f);
    EXPECT_EQ(parts.v, whole.v) << Name(f);
    EXPECT_EQ(parts.ms, whole.ms) << Name(f);
    EXPECT_EQ(parts.vs, whole.vs) << Name(f);
  }
}

// What a step stores decodes and encodes back to itself: a block's scale is the largest magnitude its
// codes decode to, so f32 values of a q8 or q4 moment (a checkpoint's view) quantize back to the same
// bytes (an odd shard's last q4 byte with a high nibble of 0).
TEST(AdamCompact, StoredBlocksDecodeAndEncodeBackToThemselves) {
  std::mt19937 rng(std::random_device{}());
  for (Precision p : {Precision::kQ8, Precision::kQ4}) {
    const CompactFormat f{.exp_avg = p, .exp_avg_sq = p, .block = 64};
    const int64_t n = 64 * 50 + 13;
    Buffers b = RandomState(f, n, DType::kF32, rng);
    AdamCompactArgs a = ArgsOf(b, f, n, 0);
    ASSERT_TRUE(AdamCompactCpu(Scalars(false, 2), 2, {&a, 1}, DType::kF32, DType::kBF16).ok());
    for (const auto& [codes, scales, form] : {std::tuple{&b.m, &b.ms, f.exp_avg_format()}, std::tuple{&b.v, &b.vs, f.exp_avg_sq_format()}}) {
      SCOPED_TRACE(std::string(PrecisionName(p)) + (form.is_signed ? " exp_avg" : " exp_avg_sq"));
      std::vector<float> x(static_cast<size_t>(n));
      form.Decode(codes->data(), scales->data(), 0, n, x.data());
      for (int64_t q = 0; q < Q8Blocks(n, 64); ++q) {
        float amax = 0;
        for (int64_t i = q * 64; i < std::min(n, q * 64 + 64); ++i) amax = std::max(amax, std::fabs(x[static_cast<size_t>(i)]));
        ASSERT_EQ(amax, (*scales)[static_cast<size_t>(q)]) << "block " << q;
      }
      if (p == Precision::kQ8 && form.is_signed) {
        int planted = 0;
        for (int64_t i = 0; i < n; ++i) {
          if (!Planted(i, 64)) continue;
          ++planted;
          EXPECT_EQ((*codes)[static_cast<size_t>(i)], 0) << "element " << i << ": a block's largest first moment, coupled to 0";
          EXPECT_LT((*scales)[static_cast<size_t>(i / 64)], 0.09f) << "element " << i;
        }
        EXPECT_GT(planted, 10);
      }
      std::vector<uint8_t> again(codes->size());
      std::vector<float> again_scales(scales->size());
      form.Encode(x.data(), n, again.data(), again_scales.data());
      EXPECT_EQ(again, *codes);
      EXPECT_EQ(again_scales, *scales);
      if (p == Precision::kQ4) {
        EXPECT_EQ((*codes)[static_cast<size_t>(n / 2)] >> 4, 0) << "an odd shard's last high nibble";
      }
    }
  }
}

// A q4 second moment is never stored as zero (its smallest value is the block's scale / 16), but a
// block whose scale is 0 (all its values 0) takes its first moments with it.
TEST(AdamCompact, AQ4SecondMomentIsNeverZeroButAZeroBlockZeroesItsFirstMoments) {
  const CompactFormat f{.exp_avg = Precision::kF32, .exp_avg_sq = Precision::kQ4, .block = 8};
  std::vector<float> p(16, 1.0f), g(16, 0.0f), m(16, 0.5f);
  for (int i = 8; i < 16; ++i) g[static_cast<size_t>(i)] = i == 8 ? 1.0f : 1e-6f;
  std::vector<uint8_t> v(8, 0);
  std::vector<float> vs(2, 0.0f);
  AdamCompactArgs a{p.data(), g.data(), m.data(), nullptr, v.data(), vs.data(), nullptr, 16, 0, f};
  AdamConfig c;
  ASSERT_TRUE(AdamCompactCpu(MakeAdamStepScalars(c, 1).value(), 1, {&a, 1}, DType::kF32, DType::kBF16).ok());
  EXPECT_EQ(vs[0], 0.0f);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(m[static_cast<size_t>(i)], 0.0f) << "block 0's second moments are all 0";
  EXPECT_GT(vs[1], 0.0f);
  EXPECT_EQ(v[4], 0x0f | 0 << 4) << "element 8 holds the block's largest (15); element 9's tiny value takes the smallest code, 0";
  for (int i = 9; i < 16; ++i) EXPECT_GT(std::fabs(m[static_cast<size_t>(i)]), 0.0f) << "a tiny second moment keeps its first";

  // Both moments q4 (no coupling pass: the kernels zero such a block's first moments at once), on every
  // ISA, in blocks of 32 (whole vectors): block 0 has first moments (code 5, scale 0.5) and zero
  // gradients, so its second moments stay 0; block 1 has gradients.
  const CompactFormat q{.exp_avg = Precision::kQ4, .exp_avg_sq = Precision::kQ4, .block = 32};
  for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16}) {
    if (!CpuSupports(isa)) continue;
    std::vector<float> qp(64, 1.0f), qg(64, 0.0f), qms = {0.5f, 0.5f}, qvs = {0.0f, 0.0f};
    for (int i = 32; i < 64; ++i) qg[static_cast<size_t>(i)] = 0.01f * static_cast<float>(i - 31);
    std::vector<uint8_t> qm(32, 0x55), qv(32, 0);
    AdamCompactArgs t{qp.data(), qg.data(), qm.data(), qms.data(), qv.data(), qvs.data(), nullptr, 64, 0, q};
    ASSERT_TRUE(AdamCompactCpu(MakeAdamStepScalars(c, 1).value(), 1, {&t, 1}, DType::kF32, DType::kBF16, {.isa = isa}).ok());
    EXPECT_EQ(qvs[0], 0.0f) << CpuIsaName(isa);
    EXPECT_EQ(qms[0], 0.0f) << CpuIsaName(isa) << ": block 0's first moments are coupled to its zero second moments";
    for (int i = 0; i < 16; ++i) EXPECT_EQ(qm[static_cast<size_t>(i)], 0) << CpuIsaName(isa) << " byte " << i;
    EXPECT_GT(qvs[1], 0.0f) << CpuIsaName(isa);
    EXPECT_GT(qms[1], 0.0f) << CpuIsaName(isa);
    EXPECT_EQ(qm[31] & 0xf0, 0x70) << CpuIsaName(isa) << ": element 63, the largest gradient, the largest first moment";
  }
}

// A second moment too small for its block's codes takes its first moment with it.
TEST(AdamCompact, AnUnderflowingSecondMomentZeroesItsFirstMoment) {
  const CompactFormat f{.exp_avg = Precision::kBF16, .exp_avg_sq = Precision::kQ8, .block = 8};
  std::vector<float> p(8, 1.0f), g = {1e-20f, 1, 1, 1, 1, 1, 1, 1};
  std::vector<uint16_t> m(8, FloatToBf16(0.5f));
  std::vector<uint8_t> v(8, 0);
  float vs = 0;
  AdamCompactArgs a{p.data(), g.data(), m.data(), nullptr, v.data(), &vs, nullptr, 8, 0, f};
  AdamConfig c;
  ASSERT_TRUE(AdamCompactCpu(MakeAdamStepScalars(c, 1).value(), 1, {&a, 1}, DType::kF32, DType::kBF16).ok());
  EXPECT_EQ(v[0], 0);
  EXPECT_EQ(m[0], 0) << "the first moment of an element whose second moment encodes to 0";
  EXPECT_EQ(v[1], 248);
  EXPECT_NE(m[1], 0);
}

TEST(AdamCompact, NonsenseIsRejected) {
  std::vector<float> p(16), g(16), m(16), v(16), s(2);
  AdamCompactArgs a{p.data(), g.data(), m.data(), nullptr, v.data(), nullptr, nullptr, 16, 0, {}};
  const AdamStepScalars sc = Scalars(false, 1);
  auto run = [&](const AdamCompactArgs& t, int64_t step = 1) { return AdamCompactCpu(sc, step, {&t, 1}, DType::kF32, DType::kBF16).code(); };
  EXPECT_EQ(run(a), StatusCode::kOk);
  EXPECT_EQ(run(a, 0), StatusCode::kInvalidArgument);
  AdamCompactArgs t = a;
  t.format.exp_avg = Precision::kQ8;
  EXPECT_EQ(run(t), StatusCode::kInvalidArgument);  // no scales
  t.exp_avg_scale = s.data();
  t.format.block = 8;
  EXPECT_EQ(run(t), StatusCode::kOk);
  t.index = 4;
  EXPECT_EQ(run(t), StatusCode::kInvalidArgument);  // blocks must start at a multiple of the block
  t.index = 0;
  for (int64_t bad : {0, 6, 12, 2 * kMaxQuantBlock}) {
    t.format.block = bad;
    EXPECT_EQ(run(t), StatusCode::kInvalidArgument) << bad;
  }
  t = a;
  t.format.master = false;
  t.param_copy = m.data();
  EXPECT_EQ(run(t), StatusCode::kInvalidArgument);  // no copy without a master
  AdamConfig ams;
  ams.amsgrad = true;
  EXPECT_EQ(AdamCompactCpu(MakeAdamStepScalars(ams, 1).value(), 1, {&a, 1}, DType::kF32, DType::kBF16).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParsePrecision("q8").value(), Precision::kQ8);
  EXPECT_FALSE(ParsePrecision("int8").ok());
}

// ---- against NumPy ----------------------------------------------------------------------------------

uint32_t Bits(float x) { return FloatBits(x); }

void WriteRaw(const std::string& path, const void* data, size_t bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
}

// Every format, f32 and bf16 gradients, AdamW and L2: the inputs and the kernel's outputs go to files,
// kernels/quant_reference.py recomputes the outputs from the rule in NumPy and compares every bit.
TEST(AdamCompact, MatchesAnIndependentNumPyImplementationOfTheRule) {
  if (std::system("/usr/bin/python3 -c 'import numpy' 2>/dev/null") != 0) GTEST_SKIP() << "no /usr/bin/python3 with numpy";
  const std::string dir = ::testing::TempDir() + "quant_ref_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  std::mt19937 rng(std::random_device{}());
  nlohmann::json cases = nlohmann::json::array();
  int id = 0;
  for (const CompactFormat& f0 : AllFormats()) {
    for (DType grad : {DType::kF32, DType::kBF16}) {
      for (bool l2 : {false, true}) {
        CompactFormat f = f0;
        f.block = (id % 3 == 0) ? 64 : 256;
        f.seed = static_cast<uint32_t>(rng());
        const int64_t n = 1000 + static_cast<int64_t>(rng() % 3000);
        // Every fifth case crosses 2^32 in the global index, where the rounding key changes.
        const int64_t index = id % 5 == 0 ? (int64_t{1} << 32) - 3 * f.block : f.block * static_cast<int64_t>(rng() % 100000);
        const int64_t step = 1 + static_cast<int64_t>(rng() % 100000);
        Buffers b = RandomState(f, n, grad, rng);
        const std::string pre = dir + "/" + std::to_string(id) + ".";
        auto dump = [&](const char* suffix) {
          WriteRaw(pre + "p." + suffix, b.p.data(), b.p.size());
          WriteRaw(pre + "g." + suffix, b.g.data(), b.g.size());
          WriteRaw(pre + "m." + suffix, b.m.data(), b.m.size());
          WriteRaw(pre + "v." + suffix, b.v.data(), b.v.size());
          if (!b.ms.empty()) WriteRaw(pre + "m_scale." + suffix, b.ms.data(), b.ms.size() * 4);
          if (!b.vs.empty()) WriteRaw(pre + "v_scale." + suffix, b.vs.data(), b.vs.size() * 4);
          if (!b.copy.empty()) WriteRaw(pre + "copy." + suffix, b.copy.data(), b.copy.size());
        };
        dump("in");
        const AdamStepScalars s = Scalars(l2, step);
        AdamCompactArgs a = ArgsOf(b, f, n, index);
        ASSERT_TRUE(AdamCompactCpu(s, step, {&a, 1}, grad, DType::kBF16).ok());
        dump("out");
        cases.push_back({{"id", id}, {"numel", n}, {"index", index}, {"block", f.block}, {"seed", f.seed}, {"step", step},
                         {"m", PrecisionName(f.exp_avg)}, {"v", PrecisionName(f.exp_avg_sq)}, {"master", f.master},
                         {"copy", f.master}, {"grad", grad == DType::kF32 ? "f32" : "bf16"},
                         {"scalars", {{"beta1", Bits(s.beta1)}, {"beta2", Bits(s.beta2)}, {"omb1", Bits(s.one_minus_beta1)},
                                      {"omb2", Bits(s.one_minus_beta2)}, {"eps", Bits(s.eps)}, {"l2", Bits(s.l2)}, {"decay", Bits(s.decay)},
                                      {"nss", Bits(s.neg_step_size)}, {"bc2", Bits(s.bc2_sqrt)}, {"cstep", Bits(s.compact_step)},
                                      {"ceps", Bits(s.compact_eps)}, {"gs", Bits(s.grad_scale)},
                                      {"use_l2", s.use_l2}, {"use_decay", s.use_decay}}}});
        ++id;
      }
    }
  }
  std::ofstream(dir + "/cases.json") << cases.dump();
  const std::string cmd = "/usr/bin/python3 " ZRT_KERNELS_DIR "/quant_reference.py " + dir;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace zrt::kernels
