// bench/adam_gpu (GPU machine only; tests/gpu/run.sh runs it): fused CUDA AdamW throughput beside the
// device copy bandwidth measured in the same run, and beside torch.optim.AdamW(fused=True) on the same
// shard sizes (measured by tests/gpu/torch_fused_adamw.py, passed in with --peer-gelems).
//
//   adam_gpu_bench [--elements N] [--reps R] [--peer-gelems X]
#include <CLI/CLI.hpp>

#include <cuda_runtime.h>

#include <cstdlib>
#include <string>

#include "bench/bench_util.h"
#include "zrt/kernels/adam.h"

using namespace zrt;
using namespace zrt::kernels;

namespace {
void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}
double TimeMs(const std::function<void()>& fn, int reps) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  fn();  // warm-up
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(a);
    fn();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}
}  // namespace

int main(int argc, char** argv) {
  int64_t n = int64_t{256} << 20;
  int reps = 20;
  double peer = -1;
  CLI::App app{"adam_gpu_bench: the fused CUDA AdamW against device memory bandwidth measured in the same run"};
  app.add_option("--elements", n, "parameters per step")->capture_default_str();
  app.add_option("--reps", reps, "timed repetitions (median)")->capture_default_str();
  app.add_option("--peer-gelems", peer, "the peer's rate in G elements/s, printed beside");
  CLI11_PARSE(app, argc, argv);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("bench/adam_gpu: no GPU, skipped\n");
    return 0;
  }
  const size_t un = static_cast<size_t>(n);
  float *p, *g, *m, *v;
  uint16_t* copy;
  char *src, *dst;
  Check(cudaMalloc(&p, un * 4), "malloc");
  Check(cudaMalloc(&g, un * 4), "malloc");
  Check(cudaMalloc(&m, un * 4), "malloc");
  Check(cudaMalloc(&v, un * 4), "malloc");
  Check(cudaMalloc(&copy, un * 2), "malloc");
  const size_t copy_bytes = un * 14;  // the copy moves as many bytes as Adam: 14 B read + 14 B write
  Check(cudaMalloc(&src, copy_bytes), "malloc");
  Check(cudaMalloc(&dst, copy_bytes), "malloc");
  cudaMemset(p, 0, un * 4);
  cudaMemset(g, 0, un * 4);
  cudaMemset(m, 0, un * 4);
  cudaMemset(v, 0, un * 4);
  cudaMemset(src, 0, copy_bytes);
  const double copy_ms = TimeMs([&] { cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice); }, reps);
  const double copy_gbs = 2.0 * copy_bytes / copy_ms / 1e6;
  AdamConfig cfg;
  cfg.weight_decay = 0.01;
  const auto s = *MakeAdamStepScalars(cfg, 10);
  std::printf("bench/adam_gpu: %lld elements; device copy %.1f GB/s\n", static_cast<long long>(n), copy_gbs);
  for (bool with_copy : {false, true}) {
    AdamTensorArgs t{p, g, m, v, nullptr, with_copy ? copy : nullptr, n};
    const double ms = TimeMs([&] { Check(cudaGetLastError(), "pre"); (void)AdamCuda(s, std::span(&t, 1), DType::kF32, DType::kBF16); }, reps);
    const double bytes = static_cast<double>(n) * (16 + 12 + (with_copy ? 2 : 0));
    const double gbs = bytes / ms / 1e6, gel = n / ms / 1e6;
    std::printf("  fused AdamW%s: %.2f G elements/s, %.1f GB/s (%.2f of copy)\n", with_copy ? " + bf16 copy" : "", gel, gbs,
                gbs / copy_gbs);
    bench::PrintResult("adam_gpu", with_copy ? "fp32 grad + bf16 copy" : "fp32 grad", gbs, "GB/s", copy_gbs, "D2D copy GB/s",
                       with_copy ? -1 : peer * bytes / n, "torch fused AdamW GB/s");
  }
  return 0;
}
