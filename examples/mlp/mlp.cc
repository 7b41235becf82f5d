// mlp: the trainer of docs/getting-started.md. A 2-layer MLP (bf16) regressing a fixed function,
// ZeRO stage 3, AdamW with warmup + cosine, no weight decay on biases, gradient accumulation,
// clipping, asynchronous checkpoints, resume after any kill, all from one JSON file:
//
//   mpirun -n 2 mlp --config examples/mlp/mlp.json [--ckpt DIR] [--dump FILE]
//
// The data a rank sees depends only on (seed, step, micro-step, rank): a resumed run continues
// exactly as the uninterrupted one would.
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <fstream>

#include <zrt/zrt.h>

using zrt::bf16;

namespace {

constexpr int kIn = 16;

struct Trainer {  // the "trainer" section of the configuration
  int64_t steps = 200, save_every = 10;
  int hidden = 64, batch = 32;
  int64_t seed = 7;
};

// Deterministic samples: x uniform in [-1, 1], y = sum_j sin(j + 1) x_j + sin(3 x_0) x_1.
float Sample(const Trainer& t, int64_t step, int micro, int rank, int k, float* x) {
  uint64_t s = static_cast<uint64_t>(t.seed) * 0x9e3779b97f4a7c15ull ^ static_cast<uint64_t>(step * 977 + micro * 131 + rank * 7919 + k);
  float y = 0;
  for (int j = 0; j < kIn; ++j) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x[j] = static_cast<float>(s >> 40) / static_cast<float>(1 << 24) * 2.0f - 1.0f;
    y += std::sin(static_cast<float>(j + 1)) * x[j];
  }
  return y + std::sin(3.0f * x[0]) * x[1];
}

zrt::Status Train(zrt::Communicator& comm, const nlohmann::json& config, std::string ckpt_root, const std::string& dump) {
  ASSIGN_OR_RETURN(zrt::EngineConfig cfg, zrt::EngineConfigFromJson(config.value("engine", nlohmann::json::object())));
  ASSIGN_OR_RETURN(zrt::ckpt::CheckpointOptions co, zrt::ckpt::CheckpointOptionsFromJson(config.value("checkpoint", nlohmann::json::object())));
  if (!ckpt_root.empty()) co.root = ckpt_root;
  Trainer t;
  ASSIGN_OR_RETURN(zrt::JsonReader tr, zrt::JsonReader::Object(config.value("trainer", nlohmann::json::object()), "trainer"));
  RETURN_IF_ERROR(tr.Read("steps", &t.steps));
  RETURN_IF_ERROR(tr.Read("save_every", &t.save_every));
  RETURN_IF_ERROR(tr.Read("hidden", &t.hidden));
  RETURN_IF_ERROR(tr.Read("batch", &t.batch));
  RETURN_IF_ERROR(tr.Read("seed", &t.seed));
  RETURN_IF_ERROR(tr.Finish());

  zrt::CpuDevice device;
  ASSIGN_OR_RETURN(auto engine, zrt::ZeroEngine::Create(&comm, &device, cfg));
  const int H = t.hidden;
  ASSIGN_OR_RETURN(auto w1, engine->AddParam("l1.w", {H, kIn}, zrt::DType::kBF16, {.group = "l1"}));
  ASSIGN_OR_RETURN(auto b1, engine->AddParam("l1.b", {H}, zrt::DType::kBF16, {.group = "l1", .weight_decay = 0}));
  ASSIGN_OR_RETURN(auto w2, engine->AddParam("l2.w", {H}, zrt::DType::kBF16, {.group = "l2"}));
  ASSIGN_OR_RETURN(auto b2, engine->AddParam("l2.b", {1}, zrt::DType::kBF16, {.group = "l2", .weight_decay = 0}));
  RETURN_IF_ERROR(engine->Finalize([&](int64_t p, int64_t off, int64_t n, float* out) {
    const float scale = p == w1.index ? 1.0f / std::sqrt(float{kIn}) : p == w2.index ? 1.0f / std::sqrt(static_cast<float>(H)) : 0.0f;
    for (int64_t i = 0; i < n; ++i) out[i] = scale * std::sin(12.9898f * static_cast<float>(off + i) + 78.233f * static_cast<float>(p));
  }));
  const int l1 = engine->group(w1), l2 = engine->group(w2);

  ASSIGN_OR_RETURN(auto ck, zrt::ckpt::Checkpointer::Create(&comm, &device, co));
  zrt::ckpt::InstallPreemptionHandler();
  auto resumed = zrt::ckpt::Resume(&comm, co, engine->state_view());  // the engine is restored
  if (resumed.ok() && comm.rank() == 0) std::printf("resumed from %s\n", resumed->dir.c_str());
  if (!resumed.ok() && resumed.status().code() != zrt::StatusCode::kNotFound) return resumed.status();

  std::vector<float> x(static_cast<size_t>(t.batch) * kIn), y(static_cast<size_t>(t.batch)), h(static_cast<size_t>(t.batch) * H);
  double loss = 0;
  while (engine->steps() < t.steps) {
    loss = 0;
    for (int micro = 0; micro < cfg.grad_accum_steps; ++micro) {
      engine->SetSync(micro == cfg.grad_accum_steps - 1);
      engine->Mark(zrt::Phase::kForward);
      RETURN_IF_ERROR(engine->Gather(l1).status());
      RETURN_IF_ERROR(engine->Gather(l2).status());
      ASSIGN_OR_RETURN(auto W1, engine->Param(w1));
      ASSIGN_OR_RETURN(auto B1, engine->Param(b1));
      ASSIGN_OR_RETURN(auto W2, engine->Param(w2));
      ASSIGN_OR_RETURN(auto B2, engine->Param(b2));
      std::span<const bf16> pw1 = W1.as<bf16>(), pb1 = B1.as<bf16>(), pw2 = W2.as<bf16>(), pb2 = B2.as<bf16>();
      std::vector<float> d(static_cast<size_t>(t.batch));
      for (int k = 0; k < t.batch; ++k) {
        float* xk = &x[static_cast<size_t>(k) * kIn];
        y[static_cast<size_t>(k)] = Sample(t, engine->steps(), micro, comm.rank(), k, xk);
        float out = pb2[0];
        for (int j = 0; j < H; ++j) {
          float a = pb1[static_cast<size_t>(j)];
          for (int i = 0; i < kIn; ++i) a += pw1[static_cast<size_t>(j * kIn + i)] * xk[i];
          h[static_cast<size_t>(k * H + j)] = a > 0 ? a : 0;
          out += pw2[static_cast<size_t>(j)] * h[static_cast<size_t>(k * H + j)];
        }
        d[static_cast<size_t>(k)] = (out - y[static_cast<size_t>(k)]) / static_cast<float>(t.batch);  // d(mean squared / 2)
        loss += 0.5 * (out - y[static_cast<size_t>(k)]) * (out - y[static_cast<size_t>(k)]) / t.batch / cfg.grad_accum_steps;
      }
      engine->Mark(zrt::Phase::kBackward);  // fp32 gradients (fp32_grads): accumulated across micro-steps
      ASSIGN_OR_RETURN(auto G1, engine->Grad(w1));
      ASSIGN_OR_RETURN(auto GB1, engine->Grad(b1));
      ASSIGN_OR_RETURN(auto G2, engine->Grad(w2));
      ASSIGN_OR_RETURN(auto GB2, engine->Grad(b2));
      std::span<float> gw1 = G1.as<float>(), gb1 = GB1.as<float>(), gw2 = G2.as<float>(), gb2 = GB2.as<float>();
      for (int k = 0; k < t.batch; ++k) {
        const float dk = d[static_cast<size_t>(k)];
        gb2[0] += dk;
        for (int j = 0; j < H; ++j) {
          const float hj = h[static_cast<size_t>(k * H + j)];
          gw2[static_cast<size_t>(j)] += dk * hj;
          if (hj <= 0) continue;
          const float dh = dk * pw2[static_cast<size_t>(j)];
          gb1[static_cast<size_t>(j)] += dh;
          for (int i = 0; i < kIn; ++i) gw1[static_cast<size_t>(j * kIn + i)] += dh * x[static_cast<size_t>(k) * kIn + i];
        }
      }
      for (int g : {l2, l1}) {
        RETURN_IF_ERROR(engine->Release(g));
        RETURN_IF_ERROR(engine->GradsReady(g));
      }
    }
    engine->Record("loss", loss);
    ASSIGN_OR_RETURN(zrt::StepResult r, engine->Step());
    if (comm.rank() == 0 && r.step % 20 == 0) {
      std::printf("step %4lld  loss %.5f  lr %.2e  grad norm %.3f  %.1f ms\n", static_cast<long long>(r.step), loss, r.lr, r.grad_norm,
                  1e3 * r.times.total);
    }
    if (r.step % t.save_every == 0) RETURN_IF_ERROR(ck->SaveAsync(engine->state_view(), {{"seed", t.seed}}));
    RETURN_IF_ERROR(ck->Poll());
    ASSIGN_OR_RETURN(bool preempted, zrt::ckpt::PreemptionRequested(&comm));
    if (preempted) {
      RETURN_IF_ERROR(ck->SaveAsync(engine->state_view(), {{"seed", t.seed}}));
      return ck->Wait();
    }
  }
  RETURN_IF_ERROR(ck->Wait());
  // The full fp32 weights, streamed tensor by tensor to rank 0.
  std::ofstream out;
  if (comm.rank() == 0 && !dump.empty()) out.open(dump, std::ios::binary | std::ios::trunc);
  RETURN_IF_ERROR(engine->ForEachFullTensor({}, [&](const zrt::TensorSpec&, std::string_view, std::span<const float> v) {
    out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size_bytes()));
    return zrt::Status();
  }));
  if (comm.rank() == 0) std::printf("SUMMARY steps=%lld loss=%.5f\n", static_cast<long long>(engine->steps()), loss);
  return zrt::Status();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"mlp: a 2-layer MLP trained with zrt from one JSON configuration"};
  std::string config_path, ckpt_root, dump;
  app.add_option("--config", config_path, "JSON configuration: engine, checkpoint, trainer sections")->required();
  app.add_option("--ckpt", ckpt_root, "checkpoint root (overrides checkpoint.root)");
  app.add_option("--dump", dump, "write the final fp32 weights here (rank 0)");
  CLI11_PARSE(app, argc, argv);
  auto session = zrt::MpiSession::Init(&argc, &argv);
  zrt::Status s = session.status();
  if (s.ok()) {
    auto config = zrt::ReadJsonFile(config_path);
    auto comm = zrt::MpiCommunicator::Create();
    s = !config.ok() ? config.status() : !comm.ok() ? comm.status() : Train(**comm, *config, ckpt_root, dump);
  }
  if (!s.ok()) std::fprintf(stderr, "mlp: %s\n", s.ToString().c_str());
  return s.ok() ? 0 : 1;
}
