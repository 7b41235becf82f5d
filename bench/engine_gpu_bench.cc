// bench/engine_gpu (GPU machine only; tests/gpu/run.sh runs it under mpirun -np 1): on one GPU,
//  - copy bandwidth: device-to-device, and host<->device from pinned memory (the limits below);
//  - one engine step of a bf16 model (default 1B parameters) with the optimizer on the device (limit:
//    the bytes Adam and the reduction move, at the device copy bandwidth) and with the optimizer
//    offloaded to pinned host memory (limit: gradients down and parameters up over PCIe);
//  - the checkpoint stall of that model's device state (limit: the state's bytes at the D2H bandwidth).
// The trainer's part of a step is only zeroing and marking gradients ready (no forward/backward).
//
//   mpirun -np 1 engine_gpu_bench [--params N] [--steps S] [--ckpt-dir D]
#include <CLI/CLI.hpp>

#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "bench/bench_util.h"
#include "zrt/checkpoint/checkpointer.h"
#include "zrt/offload/host_memory.h"
#include "zrt/core/cuda_device.h"
#include "zrt/core/mpi_communicator.h"
#include "zrt/core/nccl_communicator.h"
#include "zrt/runtime/engine.h"

using namespace zrt;

namespace {

void Die(const Status& s, const char* what) {
  if (s.ok()) return;
  std::fprintf(stderr, "engine_gpu_bench: %s: %s\n", what, s.ToString().c_str());
  std::exit(1);
}

// GB/s of a copy of `bytes` (median of reps), on the device's stream.
double CopyGbs(CudaDevice& d, void* dst, const void* src, size_t bytes, int reps) {
  const double s = bench::MedianSeconds([&] {
    (void)cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, d.stream());
    (void)cudaStreamSynchronize(d.stream());
  }, reps);
  return static_cast<double>(bytes) / s / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t params = int64_t{1} << 30;
  int steps = 5;
  std::string ckpt_dir;
  CLI::App app{"engine_gpu_bench: engine steps on the GPU (NCCL) and a checkpoint's stall"};
  app.add_option("--params", params, "parameters")->capture_default_str();
  app.add_option("--steps", steps, "timed steps")->capture_default_str();
  app.add_option("--ckpt-dir", ckpt_dir, "checkpoint directory (written only here)")->required();
  CLI11_PARSE(app, argc, argv);
  auto session = MpiSession::Init(&argc, &argv);
  Die(session.status(), "MPI");
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("bench/engine_gpu: no GPU, skipped\n");
    return 0;
  }
  auto mpi = MpiCommunicator::Create();
  Die(mpi.status(), "mpi");
  auto dev = CudaDevice::Create();
  Die(dev.status(), "device");
  CudaDevice& d = **dev;
  auto nccl = NcclCommunicator::Create(mpi->get(), &d);
  Die(nccl.status(), "nccl");
  (*nccl)->set_check_args(false);
  auto pinned = HostMemory::Create(0, "bench");

  // Copy bandwidth (1 GiB).
  const size_t cb = size_t{1} << 30;
  auto a = d.Allocate(cb, MemCategory::kOther), b = d.Allocate(cb, MemCategory::kOther);
  auto h = pinned->Allocate(cb, MemCategory::kStaging);
  Die(a.status(), "alloc");
  Die(b.status(), "alloc");
  Die(h.status(), "alloc");
  Die(d.Fill(a->data(), 0, cb), "fill");
  std::memset(h->data(), 0, cb);
  const double d2d = 2 * CopyGbs(d, b->data(), a->data(), cb, 10);  // read + write
  const double h2d = CopyGbs(d, a->data(), h->data(), cb, 10);
  const double d2h = CopyGbs(d, h->data(), a->data(), cb, 10);
  std::printf("bench/engine_gpu: %s; copies: device %.0f GB/s (read+write), H2D %.1f GB/s, D2H %.1f GB/s (pinned: %s)\n",
              d.name().c_str(), d2d, h2d, d2h, pinned->pinned() ? "yes" : "no");
  bench::PrintResult("engine_gpu", "D2D copy", d2d, "GB/s", d2d, "itself");
  bench::PrintResult("engine_gpu", "H2D copy (pinned)", h2d, "GB/s", h2d, "itself");
  bench::PrintResult("engine_gpu", "D2H copy (pinned)", d2h, "GB/s", d2h, "itself");
  a->Reset();
  b->Reset();
  h->Reset();

  const int groups = 8;
  const int64_t per_group = params / groups;
  for (OffloadTarget opt : {OffloadTarget::kNone, OffloadTarget::kHost}) {
    EngineConfig cfg;
    cfg.stage = 2;
    cfg.bucket_bytes = 256 << 20;
    cfg.offload.optimizer = opt;
    auto e = ZeroEngine::Create(nccl->get(), &d, cfg);
    Die(e.status(), "engine");
    for (int g = 0; g < groups; ++g) {
      Die((*e)->AddParam("w" + std::to_string(g), {per_group}, DType::kBF16, {.group = "layer" + std::to_string(g)}).status(), "add");
    }
    Die((*e)->Finalize([](int64_t, int64_t, int64_t n, float* out) { std::fill(out, out + n, 0.01f); }), "finalize");
    auto step = [&] {
      for (int g = groups - 1; g >= 0; --g) {
        auto gb = (*e)->GradBuffer(g);
        Die(gb.status(), "grad buffer");
        Die((*e)->GradsReady(g), "grads ready");
      }
      auto r = (*e)->Step();
      Die(r.status(), "step");
      (void)cudaStreamSynchronize(d.stream());
    };
    const double s = bench::MedianSeconds(step, steps);
    const double n = static_cast<double>(per_group) * groups;
    const std::string name = opt == OffloadTarget::kNone ? "step, optimizer on GPU" : "step, optimizer in host memory";
    // Device: zero + bucket copy + reduce (one rank: a copy) + cast out, ~14 B/param; Adam 28 B/param.
    // Host offload: gradients down (2 B/param) and parameters up (2 B/param).
    const double limit = opt == OffloadTarget::kNone ? (14.0 + 28.0) * n / (d2d * 1e9) : 2.0 * n / (d2h * 1e9) + 2.0 * n / (h2d * 1e9);
    std::printf("  %s: %.1f ms for %.2f G params (%.2f G params/s); copy limit %.1f ms; device memory peak %s\n", name.c_str(),
                s * 1e3, n / 1e9, n / s / 1e9, limit * 1e3, FormatBytes((*e)->memory().total_peak).c_str());
    bench::PrintResult("engine_gpu", name + " (1/s)", 1.0 / s, "steps/s", 1.0 / limit, "copy-bound steps/s");

    if (opt == OffloadTarget::kNone) {
      std::filesystem::remove_all(ckpt_dir);
      auto ck = ckpt::Checkpointer::Create(mpi->get(), pinned.get(), {.root = ckpt_dir});
      Die(ck.status(), "checkpointer");
      Die((*ck)->SaveAsync((*e)->state_view()), "save");
      const ckpt::SaveStats st = (*ck)->last_stats();
      Die((*ck)->Wait(), "save (wait)");
      const double copy_limit = static_cast<double>(st.raw_bytes) / (d2h * 1e9);
      std::printf("  checkpoint of %s device state: stall %.3f s (D2H limit %.3f s), background write %.1f s\n",
                  FormatBytes(st.raw_bytes).c_str(), st.stall_seconds, copy_limit, (*ck)->last_stats().write_seconds);
      bench::PrintResult("engine_gpu", "checkpoint stall (1/s)", 1.0 / st.stall_seconds, "1/s", 1.0 / copy_limit, "D2H-bound 1/s");
      std::filesystem::remove_all(ckpt_dir);
    }
  }
  return 0;
}
