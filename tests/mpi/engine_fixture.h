// The engine tests' fixture: a small model of awkward sizes, helpers that run a training step and
// read every parameter back, and deterministic init/targets. Shared by engine_test and offload_test.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "zrt/core/mpi_communicator.h"
#include "zrt/runtime/engine.h"

namespace zrt {

struct ParamDef {
  std::string name;
  std::vector<int64_t> shape;
  std::string group;
};

// Sizes not divisible by the world size, an empty tensor, a tensor smaller than the world, groups
// of several tensors, and (with small buckets) groups that span buckets.
inline const std::vector<ParamDef> kModel = {
    {"embed", {37, 29}, "g0"}, {"w1", {1001}, "g1"}, {"empty", {0, 4}, "g1"}, {"b1", {3}, "g1"},
    {"w2", {4099}, "g2"},      {"tiny", {1}, "g2"}};

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto c = MpiCommunicator::Create(MPI_COMM_WORLD);
    ASSERT_TRUE(c.ok()) << c.status();
    comm_ = std::move(*c);
  }
  int rank() const { return comm_->rank(); }
  int size() const { return comm_->size(); }

  // On `device` (default: the fixture's host-accessible CpuDevice).
  Result<std::unique_ptr<ZeroEngine>> Make(const EngineConfig& cfg, const std::vector<ParamDef>& model, DType dtype,
                                           const ZeroEngine::InitFn& init, Device* device = nullptr) {
    ASSIGN_OR_RETURN(auto e, ZeroEngine::Create(comm_.get(), device != nullptr ? device : &device_, cfg));
    for (const ParamDef& p : model) RETURN_IF_ERROR(e->AddParam(p.name, p.shape, dtype, {.group = p.group}));
    RETURN_IF_ERROR(e->Finalize(init));
    return e;
  }

  // Full values (as float) of every parameter, gathering where needed.
  std::vector<std::vector<float>> Params(ZeroEngine& e, size_t count) {
    std::vector<std::vector<float>> out(count);
    for (int g = 0; g < e.num_groups(); ++g) {
      auto base = e.Gather(g);
      EXPECT_TRUE(base.ok()) << base.status();
      for (size_t p = 0; p < count; ++p) {
        const ParamHandle h{static_cast<int64_t>(p)};
        if (e.group(h) != g) continue;
        auto v = e.Param(h);
        EXPECT_TRUE(v.ok()) << v.status();
        for (int64_t i = 0; i < v->numel(); ++i) out[p].push_back(LoadAsFloat(v->data, i, v->dtype));
      }
      EXPECT_TRUE(e.Release(g).ok());
    }
    return out;
  }

  // One training step: forward gathers every group; backward (reverse order) gathers again, writes
  // grad_fn(param, index, value) into the gradient buffer, releases, and marks the group ready.
  // `frozen_group` (if any) has no gradient: it is gathered and marked ready only.
  using GradFn = std::function<float(int64_t param, int64_t i, float value)>;
  void Backward(ZeroEngine& e, size_t nparams, const GradFn& grad_fn, int frozen_group = -1) {
    for (int g = 0; g < e.num_groups(); ++g) {
      ASSERT_TRUE(e.Gather(g).ok());
      ASSERT_TRUE(e.Release(g).ok());
    }
    for (int g = e.num_groups() - 1; g >= 0; --g) {
      auto base = e.Gather(g);
      ASSERT_TRUE(base.ok()) << base.status();
      if (g != frozen_group) {
        auto gbuf = e.GradBuffer(g);
        ASSERT_TRUE(gbuf.ok()) << gbuf.status();
      }
      for (size_t p = 0; p < nparams && g != frozen_group; ++p) {
        const ParamHandle h{static_cast<int64_t>(p)};
        if (e.group(h) != g) continue;
        auto w = e.Param(h);
        auto gr = e.Grad(h);
        ASSERT_TRUE(w.ok() && gr.ok()) << w.status() << gr.status();
        for (int64_t i = 0; i < w->numel(); ++i) {
          const float v = LoadAsFloat(w->data, i, w->dtype);
          const float old = LoadAsFloat(gr->data, i, gr->dtype);
          StoreFromFloat(gr->data, i, gr->dtype, old + grad_fn(static_cast<int64_t>(p), i, v));
        }
      }
      ASSERT_TRUE(e.Release(g).ok());
      ASSERT_TRUE(e.GradsReady(g).ok());
    }
  }

  CpuDevice device_;
  std::unique_ptr<MpiCommunicator> comm_;
};

inline float Init(int64_t p, int64_t i) { return 0.5f * std::sin(0.1f * static_cast<float>(i) + static_cast<float>(p)); }
inline ZeroEngine::InitFn InitFn() {
  return [](int64_t p, int64_t off, int64_t n, float* out) {
    for (int64_t i = 0; i < n; ++i) out[i] = Init(p, off + i);
  };
}

// Quadratic loss per rank: grad = p - target(rank); the average pulls p toward the mean target.
inline float Target(int rank, int64_t p, int64_t i) { return std::sin(0.37f * static_cast<float>(i) + static_cast<float>(rank) + 0.1f * static_cast<float>(p)); }

}  // namespace zrt
