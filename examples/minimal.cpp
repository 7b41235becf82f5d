// The smallest complete use of zrt: a linear model y = w . x trained with ZeRO stage 3 on every MPI
// rank, checkpointed, and resumed on the next start.   mpirun -n 2 ./minimal /tmp/minimal-ckpt
#include <cstdio>

#include <zrt/zrt.h>

int main(int argc, char** argv) {
  auto session = zrt::MpiSession::Init(&argc, &argv).value();   // MPI with the thread level zrt needs
  auto comm = zrt::MpiCommunicator::Create().value();            // or the trainer's data-parallel group
  zrt::CpuDevice device;
  zrt::EngineConfig cfg;
  cfg.stage = 3;
  cfg.adam.lr = 0.3;
  auto engine = zrt::ZeroEngine::Create(comm.get(), &device, cfg).value();
  const int n = 10;
  if (!engine->AddParam("w", {n}, zrt::DType::kF32).ok()) return 1;
  if (!engine->Finalize([](int64_t, int64_t, int64_t count, float* out) { for (int64_t i = 0; i < count; ++i) out[i] = 0; }).ok()) return 1;

  const std::string root = argc > 1 ? argv[1] : "/tmp/zrt-minimal";
  auto ck = zrt::ckpt::Checkpointer::Create(comm.get(), &device, {.root = root}).value();
  if (auto dir = zrt::ckpt::FindLatestComplete(root); dir.ok()) {          // resume if we can
    auto r = zrt::ckpt::Load(*dir, engine->state_view()).value();
    if (!engine->Restore(r.step, {r.loss_scale, r.scaler_good_steps, r.scaler_hysteresis_left}).ok()) return 1;
  }
  while (engine->steps() < 200) {
    // Each rank's sample: x = e_k (k = step + rank), target y = k, so w converges to w_k = k.
    const int k = static_cast<int>((engine->steps() + comm->rank()) % n);
    auto* w = static_cast<float*>(engine->Gather(0).value());
    const float err = w[k] - static_cast<float>(k);                      // forward: loss = err^2 / 2
    auto* grad = static_cast<float*>(engine->GradBuffer(0).value());
    grad[k] += err;                                                      // backward
    if (!engine->Release(0).ok() || !engine->GradsReady(0).ok()) return 1;
    auto step = engine->Step().value();
    if (step.step % 100 == 0 && !ck->SaveAsync(engine->state_view()).ok()) return 1;
  }
  if (!ck->Wait().ok()) return 1;
  auto* w = static_cast<float*>(engine->Gather(0).value());
  if (comm->rank() == 0) std::printf("step %lld: w[3] = %.3f (target 3), w[7] = %.3f (target 7)\n",
                                     static_cast<long long>(engine->steps()), w[3], w[7]);
  return engine->Release(0).ok() ? 0 : 1;
}
