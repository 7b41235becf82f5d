// The CUDA kernels against the CPU kernels on random data. The per-element math is shared and both
// sides avoid FMA contraction (nvcc --fmad=false), so Adam results must agree bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <cstring>
#include <random>

#include "zrt/kernels/adam.h"
#include "zrt/kernels/cast.h"
#include "zrt/kernels/grad_norm.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/support/reference.h"

namespace zrt::kernels {
namespace {

using testing::DeviceArray;

TEST(AdamCuda, MatchesCpuBitForBitOnManyTensors) {
  ZRT_REQUIRE_GPU();
  std::mt19937_64 rng(testing::TestSeed());
  // Awkward sizes, more tensors than one launch holds, and a misaligned start (offset 1).
  std::vector<int64_t> sizes = {0, 1, 15, 17, 1023, (1 << 20) + 3, 65536, 65537};
  for (int i = 0; i < 30; ++i) sizes.push_back(static_cast<int64_t>(rng() % 5000));
  for (bool ams : {false, true}) {
    for (DType grad : {DType::kF32, DType::kBF16}) {
      AdamConfig c;
      c.lr = 1e-2;
      c.weight_decay = 0.05;
      c.amsgrad = ams;
      const auto s = *MakeAdamStepScalars(c, 3, 0.5);
      std::vector<std::vector<float>> p, m, v, vm;
      std::vector<std::vector<uint16_t>> g16;
      std::vector<std::vector<float>> g32;
      for (int64_t n : sizes) {
        const size_t k = static_cast<size_t>(n) + 1;  // +1: the tensor starts at element 1
        p.push_back(testing::RandomFloats(k, rng));
        m.push_back(testing::RandomFloats(k, rng, 0.01f));
        auto vv = testing::RandomFloats(k, rng, 0.01f);
        for (float& x : vv) x = std::abs(x);
        v.push_back(vv);
        vm.push_back(vv);
        g32.push_back(testing::RandomFloats(k, rng, 0.1f));
        std::vector<uint16_t> h(k);
        for (size_t i = 0; i < k; ++i) h[i] = FloatToBf16(g32.back()[i]);
        g16.push_back(h);
      }
      // Device copies, then CPU in place.
      std::vector<std::unique_ptr<DeviceArray<float>>> dp, dm, dv, dvm, dg32;
      std::vector<std::unique_ptr<DeviceArray<uint16_t>>> dg16, dcopy;
      std::vector<AdamTensorArgs> dev_args, cpu_args;
      std::vector<std::vector<uint16_t>> cpu_copy;
      for (size_t t = 0; t < sizes.size(); ++t) {
        dp.push_back(std::make_unique<DeviceArray<float>>(p[t]));
        dm.push_back(std::make_unique<DeviceArray<float>>(m[t]));
        dv.push_back(std::make_unique<DeviceArray<float>>(v[t]));
        dvm.push_back(std::make_unique<DeviceArray<float>>(vm[t]));
        dg32.push_back(std::make_unique<DeviceArray<float>>(g32[t]));
        dg16.push_back(std::make_unique<DeviceArray<uint16_t>>(g16[t]));
        dcopy.push_back(std::make_unique<DeviceArray<uint16_t>>(p[t].size()));
        cpu_copy.emplace_back(p[t].size());
        const void* dg = grad == DType::kF32 ? static_cast<const void*>(dg32[t]->get() + 1) : dg16[t]->get() + 1;
        const void* hg = grad == DType::kF32 ? static_cast<const void*>(g32[t].data() + 1) : g16[t].data() + 1;
        dev_args.push_back({dp[t]->get() + 1, dg, dm[t]->get() + 1, dv[t]->get() + 1, dvm[t]->get() + 1,
                            dcopy[t]->get() + 1, sizes[t]});
        cpu_args.push_back({p[t].data() + 1, hg, m[t].data() + 1, v[t].data() + 1, vm[t].data() + 1,
                            cpu_copy[t].data() + 1, sizes[t]});
      }
      ASSERT_TRUE(AdamCuda(s, dev_args, grad, DType::kBF16).ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      ASSERT_TRUE(AdamCpu(s, cpu_args, grad, DType::kBF16).ok());
      for (size_t t = 0; t < sizes.size(); ++t) {
        const size_t bytes = static_cast<size_t>(sizes[t]) * 4;
        ASSERT_EQ(0, std::memcmp(dp[t]->Download().data() + 1, p[t].data() + 1, bytes)) << "param, tensor " << t;
        ASSERT_EQ(0, std::memcmp(dm[t]->Download().data() + 1, m[t].data() + 1, bytes)) << "exp_avg, tensor " << t;
        ASSERT_EQ(0, std::memcmp(dv[t]->Download().data() + 1, v[t].data() + 1, bytes)) << "exp_avg_sq, tensor " << t;
        if (ams) {
          ASSERT_EQ(0, std::memcmp(dvm[t]->Download().data() + 1, vm[t].data() + 1, bytes)) << "vmax " << t;
        }
        ASSERT_EQ(0, std::memcmp(dcopy[t]->Download().data() + 1, cpu_copy[t].data() + 1, bytes / 2)) << "copy " << t;
      }
    }
  }
}

// Compact state (core/quant_math.h): every moment format, with and without a master, q8 and q4 blocks of
// 64 and 4096, tails, a global index that crosses 2^32 inside the tensor: the CPU's bytes.
TEST(AdamCompactCuda, MatchesCpuBitForBit) {
  ZRT_REQUIRE_GPU();
  std::mt19937_64 rng(testing::TestSeed());
  const Precision kinds[] = {Precision::kF32, Precision::kBF16, Precision::kQ8, Precision::kQ4};
  for (bool master : {true, false}) {
    for (Precision mf : kinds) {
      for (Precision vf : kinds) {
        for (int64_t block : {64, 4096}) {
          const CompactFormat f{.exp_avg = mf, .exp_avg_sq = vf, .master = master, .block = block, .seed = 99};
          const int64_t n = 3 * block + 17 + static_cast<int64_t>(rng() % 1000), index = (int64_t{1} << 32) - 2 * block;
          auto bytes = [&](size_t count) {
            std::vector<uint8_t> b(count);
            for (auto& x : b) x = static_cast<uint8_t>(rng());
            return b;
          };
          auto floats = [&](size_t count, float scale, bool positive) {
            std::vector<uint8_t> b(count * 4);
            for (size_t i = 0; i < count; ++i) {
              float x = testing::RandomFloats(1, rng, scale)[0];
              if (positive) x = std::abs(x);
              std::memcpy(b.data() + i * 4, &x, 4);
            }
            return b;
          };
          auto moment = [&](Precision k, bool is_signed) {
            if (k == Precision::kF32) return floats(static_cast<size_t>(n), 0.01f, !is_signed);
            std::vector<uint8_t> b = bytes(static_cast<size_t>(StateFormat::Of(k, is_signed ? "exp_avg" : "exp_avg_sq", block).ValuesBytes(n)));
            if (k == Precision::kBF16) {
              const auto x = floats(static_cast<size_t>(n), 0.01f, !is_signed);
              for (int64_t i = 0; i < n; ++i) {
                float y;
                std::memcpy(&y, x.data() + i * 4, 4);
                const uint16_t h = FloatToBf16(y);
                std::memcpy(b.data() + i * 2, &h, 2);
              }
            } else if (k == Precision::kQ8) {
              for (auto& c : b) c = static_cast<uint8_t>(is_signed ? (c & 0x80) | ((c & 0x7f) % 121) : c % 249);
            } else {  // q4: any nibble but the signed negative zero; an odd length's last high nibble 0
              for (auto& c : b) {
                if (is_signed && (c & 15) == 8) c &= 0xf0;
                if (is_signed && (c >> 4) == 8) c &= 0x0f;
              }
              if (n % 2 == 1) b.back() &= 0x0f;
            }
            return b;
          };
          std::vector<uint8_t> p = master ? floats(static_cast<size_t>(n), 1, false) : moment(Precision::kBF16, true);
          std::vector<uint8_t> g = floats(static_cast<size_t>(n), 0.1f, false), m = moment(mf, true), v = moment(vf, false);
          std::vector<float> ms(static_cast<size_t>(Q8Blocks(n, block))), vs(ms.size());
          for (size_t i = 0; i < ms.size(); ++i) ms[i] = 0.01f * (1 + i % 7), vs[i] = 1e-4f * (1 + i % 5);
          std::vector<uint8_t> copy(static_cast<size_t>(n) * 2, 0);
          DeviceArray<uint8_t> dp(p), dg(g), dm(m), dv(v), dc(copy);
          DeviceArray<float> dms(ms), dvs(vs);
          const AdamCompactArgs dev{dp.get(), dg.get(), dm.get(), dms.get(), dv.get(), dvs.get(), master ? dc.get() : nullptr, n, index, f};
          const AdamCompactArgs cpu{p.data(), g.data(), m.data(), ms.data(), v.data(), vs.data(), master ? copy.data() : nullptr, n, index, f};
          const auto s = *MakeAdamStepScalars(AdamConfig{}, 5, 0.25);
          ASSERT_TRUE(AdamCompactCuda(s, 5, std::span(&dev, 1), DType::kF32, DType::kBF16).ok());
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          ASSERT_TRUE(AdamCompactCpu(s, 5, std::span(&cpu, 1), DType::kF32, DType::kBF16).ok());
          const std::string what = std::string(PrecisionName(mf)) + "/" + std::string(PrecisionName(vf)) + (master ? " master" : "") +
                                   " block " + std::to_string(block);
          EXPECT_EQ(dp.Download(), p) << what;
          EXPECT_EQ(dm.Download(), m) << what;
          EXPECT_EQ(dv.Download(), v) << what;
          if (IsBlockwise(mf)) {
            EXPECT_EQ(dms.Download(), ms) << what;
          }
          if (IsBlockwise(vf)) {
            EXPECT_EQ(dvs.Download(), vs) << what;
          }
          EXPECT_EQ(dc.Download(), copy) << what;
        }
      }
    }
  }
}

TEST(AdamCuda, SkipFlagLeavesStateUntouched) {
  ZRT_REQUIRE_GPU();
  std::vector<float> h(5000, 0.5f);
  DeviceArray<float> p(h), g(h), m(h), v(h);
  DeviceArray<int> flag(std::vector<int>{1});
  AdamTensorArgs t{p.get(), g.get(), m.get(), v.get(), nullptr, nullptr, 5000};
  AdamCudaOptions o;
  o.skip_flag = flag.get();
  ASSERT_TRUE(AdamCuda(*MakeAdamStepScalars(AdamConfig{}, 1), std::span(&t, 1), DType::kF32, DType::kBF16, o).ok());
  EXPECT_EQ(p.Download(), h);
  EXPECT_EQ(m.Download(), h);
  flag.Upload({0});
  ASSERT_TRUE(AdamCuda(*MakeAdamStepScalars(AdamConfig{}, 1), std::span(&t, 1), DType::kF32, DType::kBF16, o).ok());
  EXPECT_NE(p.Download(), h);
}

TEST(GradSumSquaresCuda, MatchesCpuAndFindsInf) {
  ZRT_REQUIRE_GPU();
  std::mt19937_64 rng(testing::TestSeed());
  std::vector<std::vector<float>> host;
  std::vector<std::unique_ptr<DeviceArray<float>>> dev;
  std::vector<GradRef> href, dref;
  for (int64_t n : {1, 17, 70000, (1 << 20) + 5}) {
    host.push_back(testing::RandomFloats(static_cast<size_t>(n), rng));
    dev.push_back(std::make_unique<DeviceArray<float>>(host.back()));
    href.push_back({host.back().data(), n});
    dref.push_back({dev.back()->get(), n});
  }
  const double want = GradSumSquaresCpu(href, DType::kF32)->sum_squares;
  DeviceArray<char> ws(GradSumSquaresCudaWorkspace(dref));
  DeviceArray<double> out(1);
  DeviceArray<int> inf(std::vector<int>{0});
  ASSERT_TRUE(GradSumSquaresCuda(dref, DType::kF32, ws.get(), GradSumSquaresCudaWorkspace(dref), out.get(), inf.get(), nullptr).ok());
  EXPECT_NEAR(out.Download()[0], want, 1e-6 * want);
  EXPECT_EQ(inf.Download()[0], 0);
  // The multiplier kernel computes the same float as the host function.
  DeviceArray<float> mult(1), norm(1);
  ASSERT_TRUE(GradMultiplierCuda(out.get(), 1.0f, 1.0f, mult.get(), norm.get(), nullptr).ok());
  float hn = 0;
  EXPECT_EQ(mult.Download()[0], GradMultiplier(out.Download()[0], 1.0f, 1.0f, &hn));
  EXPECT_EQ(norm.Download()[0], hn);
  host[2][12345] = std::nanf("");
  dev[2]->Upload(host[2]);
  ASSERT_TRUE(GradSumSquaresCuda(dref, DType::kF32, ws.get(), GradSumSquaresCudaWorkspace(dref), out.get(), inf.get(), nullptr).ok());
  EXPECT_EQ(inf.Download()[0], 1);
}

TEST(CastCuda, MatchesCastCpuBitForBitInEveryDirection) {
  ZRT_REQUIRE_GPU();
  const int64_t n = 300007;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-70000.0f, 70000.0f);
  std::vector<float> src(static_cast<size_t>(n));
  for (float& x : src) x = u(rng) * (u(rng) > 0 ? 1e-6f : 1.0f);  // small and large (f16 overflow) values
  src[5] = std::numeric_limits<float>::quiet_NaN();
  src[6] = std::numeric_limits<float>::infinity();
  for (DType from : {DType::kF32, DType::kBF16, DType::kF16}) {
    std::vector<char> in(static_cast<size_t>(n) * DTypeSize(from));
    ASSERT_TRUE(kernels::CastCpu(src.data(), DType::kF32, in.data(), from, n).ok());
    DeviceArray<char> din(in);
    for (DType to : {DType::kF32, DType::kBF16, DType::kF16}) {
      const size_t bytes = static_cast<size_t>(n) * DTypeSize(to);
      std::vector<char> want(bytes);
      ASSERT_TRUE(kernels::CastCpu(in.data(), from, want.data(), to, n).ok());
      DeviceArray<char> dout(bytes);
      ASSERT_TRUE(kernels::CastCuda(din.get(), from, dout.get(), to, n, nullptr).ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::vector<char> got = dout.Download();
      EXPECT_EQ(std::memcmp(got.data(), want.data(), bytes), 0) << DTypeName(from) << " -> " << DTypeName(to);
    }
  }
  EXPECT_FALSE(kernels::CastCuda(nullptr, DType::kF32, nullptr, DType::kBytes, 4, nullptr).ok());
}

}  // namespace
}  // namespace zrt::kernels
