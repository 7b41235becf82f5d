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
  ASSIGN_OR_RETURN(zrt::ParamHandle w, engine->AddParam("w", {n}, zrt::DType::kF32));  // in group 0, "default"
  RETURN_IF_ERROR(engine->Finalize([](int64_t, int64_t, int64_t count, float* out) { std::fill(out, out + count, 0.0f); }));

  ASSIGN_OR_RETURN(auto ck, zrt::ckpt::Checkpointer::Create(&comm, &device, {.root = root}));
  auto resumed = zrt::ckpt::Resume(&comm, {.root = root}, engine->state_view());  // newest loadable checkpoint
  if (!resumed.ok() && resumed.status().code() != zrt::StatusCode::kNotFound) return resumed.status();
  while (engine->steps() < 200) {
    // Each rank's sample: x = e_k (k = step + rank), target y = k, so w converges to w_k = k.
    const int k = static_cast<int>((engine->steps() + comm.rank()) % n);
    RETURN_IF_ERROR(engine->Gather(0).status());
    ASSIGN_OR_RETURN(zrt::TensorView wv, engine->Param(w));
    ASSIGN_OR_RETURN(zrt::TensorView gv, engine->Grad(w));
    const float err = wv.as<float>()[k] - static_cast<float>(k);  // forward: loss = err^2 / 2
    gv.as<float>()[k] += err;                                      // backward
    RETURN_IF_ERROR(engine->Release(0));
    RETURN_IF_ERROR(engine->GradsReady(0));
    ASSIGN_OR_RETURN(zrt::StepResult step, engine->Step());
    if (step.step % 100 == 0) RETURN_IF_ERROR(ck->SaveAsync(engine->state_view()));
    RETURN_IF_ERROR(ck->Poll());  // commits a save as soon as every rank has written it
  }
  RETURN_IF_ERROR(ck->Wait());
  RETURN_IF_ERROR(engine->Gather(0).status());
  ASSIGN_OR_RETURN(zrt::TensorView wv, engine->Param(w));
  if (comm.rank() == 0) {
    std::printf("step %lld: w[3] = %.3f (target 3), w[7] = %.3f (target 7)\n", static_cast<long long>(engine->steps()),
                wv.as<float>()[3], wv.as<float>()[7]);
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
