// The model of the tests of tensors over a data-parallel group of their own (own_group_test.cc,
// own_group_ckpt_test.cc): dense tensors over the world, and each EP rank's experts over its
// expert-data-parallel group; deterministic init, targets and gradients by tensor key.
#pragma once

#include <string>
#include <vector>

#include "tests/mpi/engine_fixture.h"

namespace zrt::own_group {

// The dense part; experts are added per EP rank (ExpertsOf).
inline const std::vector<ParamDef> kDense = {{"embed", {37, 29}, "g0"}, {"w1", {1001}, "g1"}, {"b1", {3}, "g1"}, {"head", {129}, "g2"}};
constexpr int kExpertsPerRank = 2;

struct Expert {
  int id;             // global expert index
  ParamDef w, b;      // its tensors (group "expert.<id>")
};
// EP rank e's experts: e, e + EP, ... (kExpertsPerRank of them).
inline std::vector<Expert> ExpertsOf(int ep, int e) {
  std::vector<Expert> out;
  for (int k = 0; k < kExpertsPerRank; ++k) {
    const int id = e + k * ep;
    const std::string g = "expert." + std::to_string(id);
    out.push_back({id, {g + ".w", {333}, g}, {g + ".b", {7}, g}});
  }
  return out;
}
// A tensor's identity in the gradient and init functions: dense index, or 100 + 2 id (+1 for b).
inline int64_t ExpertKey(int id, int which) { return 100 + 2 * id + which; }

struct Case {
  int stage = 2;
  int accum = 1;
  double clip = 0;
  bool offload = false;  // stage 3: optimizer state and parameter shards in host memory
  bool nvme = false;     // stage 3: both on NVMe (streamed in sub-groups)
};
inline std::string Name(const Case& r, int ep) {
  return "stage " + std::to_string(r.stage) + " accum " + std::to_string(r.accum) + " clip " + std::to_string(r.clip) +
         (r.offload ? " offload" : "") + (r.nvme ? " nvme" : "") + " EP " + std::to_string(ep);
}

inline EngineConfig Config(const Case& r) {
  EngineConfig c;
  c.stage = r.stage;
  c.bucket_bytes = 4096;  // several buckets per step, groups across buckets
  c.alignment = 8;
  c.grad_accum_steps = r.accum;
  c.max_grad_norm = r.clip;
  c.adam.lr = 1e-2;
  c.adam.weight_decay = 0.01;
  c.adam.eps = 0.5;  // about the gradients' size: the update sees their scale (Adam alone would not)
  if (r.offload) {
    c.offload.optimizer = OffloadTarget::kHost;
    c.offload.params = OffloadTarget::kHost;
  }
  if (r.nvme) {  // nvme_dir: the caller's
    c.offload.optimizer = OffloadTarget::kNvme;
    c.offload.params = OffloadTarget::kNvme;
    c.offload.sub_group_elements = 512;
  }
  return c;
}

// Rank q's gradient of tensor `key`'s element i at value v.
inline float Grad(int q, int64_t key, int64_t i, float v) { return v - Target(q, key, i) + 0.01f * static_cast<float>(q); }

// The dense tensors but the last, the experts of EP ranks `eps` (over `edp`, or the engine's group
// when null), then the last dense one; initialised by their keys; without the tensor named `skip`.
inline Status AddModel(ZeroEngine& e, int ep, const std::vector<int>& eps, Communicator* edp, std::vector<int64_t>* keys,
                       const std::string& skip = "") {
  keys->clear();
  auto dense = [&](size_t p) -> Status {
    RETURN_IF_ERROR(e.AddParam(kDense[p].name, kDense[p].shape, DType::kF32, {.group = kDense[p].group}).status());
    keys->push_back(static_cast<int64_t>(p));
    return Status();
  };
  for (size_t p = 0; p + 1 < kDense.size(); ++p) RETURN_IF_ERROR(dense(p));
  for (int er : eps) {
    for (const Expert& x : ExpertsOf(ep, er)) {
      if (x.w.name != skip) {
        RETURN_IF_ERROR(e.AddParam(x.w.name, x.w.shape, DType::kF32, {.group = x.w.group, .data_parallel = edp}).status());
        keys->push_back(ExpertKey(x.id, 0));
      }
      if (x.b.name != skip) {
        RETURN_IF_ERROR(e.AddParam(x.b.name, x.b.shape, DType::kF32, {.group = x.b.group, .weight_decay = 0, .data_parallel = edp}).status());
        keys->push_back(ExpertKey(x.id, 1));
      }
    }
  }
  RETURN_IF_ERROR(dense(kDense.size() - 1));  // the last after the experts: groups of both kinds interleave in the view
  const std::vector<int64_t> k = *keys;
  return e.Finalize([k](int64_t p, int64_t off, int64_t n, float* out) {
    for (int64_t i = 0; i < n; ++i) out[i] = Init(k[static_cast<size_t>(p)], off + i);
  });
}

}  // namespace zrt::own_group
