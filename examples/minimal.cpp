// The smallest complete use of zrt: a linear model y = w . x trained with ZeRO stage 3 on every MPI
// rank, checkpointed, and resumed on the next start.   mpirun -n 2 ./minimal /tmp/minimal-ckpt
#include <cstdio>

#include <zrt/zrt.h>

zrt::Status Train(zrt::Communicator& comm, const std::string& root) {
  zrt::CpuDevice device;
  zrt::EngineConfig cfg;
  cfg.stage = 3;
  cfg.adam.lr = 0.3;
  ASSIGN_OR_RETURN(auto engine, zrt::ZeroEngine::Create(&comm, &device, cfg));
  const int n = 10;
  RETURN_IF_ERROR(engine->AddParam("w", {n}, zrt::DType::kF32));
  RETURN_IF_ERROR(engine->Finalize([](int64_t, int64_t, int64_t count, float* out) { std::fill(out, out + count, 0.0f); }));

  ASSIGN_OR_RETURN(auto ck, zrt::ckpt::Checkpointer::Create(&comm, &device, {.root = root}));
  auto resumed = zrt::ckpt::Resume(&comm, root, engine->state_view());  // newest loadable checkpoint
  if (!resumed.ok() && resumed.status().code() != zrt::StatusCode::kNotFound) return resumed.status();
  while (engine->steps() < 200) {
    // Each rank's sample: x = e_k (k = step + rank), target y = k, so w converges to w_k = k.
    const int k = static_cast<int>((engine->steps() + comm.rank()) % n);
    ASSIGN_OR_RETURN(void* wp, engine->Gather(0));
    const float err = static_cast<float*>(wp)[k] - static_cast<float>(k);  // forward: loss = err^2 / 2
    ASSIGN_OR_RETURN(void* gp, engine->GradBuffer(0));
    static_cast<float*>(gp)[k] += err;                                      // backward
    RETURN_IF_ERROR(engine->Release(0));
    RETURN_IF_ERROR(engine->GradsReady(0));
    ASSIGN_OR_RETURN(zrt::StepResult step, engine->Step());
    if (step.step % 100 == 0) RETURN_IF_ERROR(ck->SaveAsync(engine->state_view()));
    RETURN_IF_ERROR(ck->Poll());  // commits a save as soon as every rank has written it
  }
  RETURN_IF_ERROR(ck->Wait());
  ASSIGN_OR_RETURN(void* wp, engine->Gather(0));
  const auto* w = static_cast<const float*>(wp);
  if (comm.rank() == 0) {
    std::printf("step %lld: w[3] = %.3f (target 3), w[7] = %.3f (target 7)\n", static_cast<long long>(engine->steps()), w[3], w[7]);
  }
  return engine->Release(0);
}

int main(int argc, char** argv) {
  auto session = zrt::MpiSession::Init(&argc, &argv);  // MPI with the thread level zrt needs
  zrt::Status s = session.status();
  if (s.ok()) {
    auto comm = zrt::MpiCommunicator::Create();  // or the trainer's data-parallel group
    s = comm.ok() ? Train(**comm, argc > 1 ? argv[1] : "/tmp/zrt-minimal") : comm.status();
  }
  if (!s.ok()) std::fprintf(stderr, "minimal: %s\n", s.ToString().c_str());
  return s.ok() ? 0 : 1;
}
