// Launcher of the CUDA cast kernel (equal dtypes: an asynchronous copy).
#include <algorithm>

#include "zrt/core/cuda_status.h"
#include "zrt/kernels/cast.cuh"
#include "zrt/kernels/cast.h"

namespace zrt::kernels {

using cuda::kThreads;

namespace {
template <int S>
void LaunchCast(int dst_kind, int blocks, const void* src, void* dst, int64_t n, cudaStream_t st) {
  switch (dst_kind) {
    case cuda::kBf16: cuda::CastKernel<S, cuda::kBf16><<<blocks, kThreads, 0, st>>>(src, dst, n); break;
    case cuda::kF16: cuda::CastKernel<S, cuda::kF16><<<blocks, kThreads, 0, st>>>(src, dst, n); break;
    default: cuda::CastKernel<S, cuda::kF32><<<blocks, kThreads, 0, st>>>(src, dst, n); break;
  }
}
}  // namespace

Status CastCuda(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n, void* stream) {
  ASSIGN_OR_RETURN(const int sk, cuda::KindOf(src_dtype, "source"), "cast (cuda)");
  ASSIGN_OR_RETURN(const int dk, cuda::KindOf(dst_dtype, "destination"), "cast (cuda)");
  if (n < 0) return InvalidArgumentError("cast (cuda): negative count ", n);
  if (n == 0) return Status();
  if (src == nullptr || dst == nullptr) return InvalidArgumentError("cast (cuda): null pointer");
  auto st = static_cast<cudaStream_t>(stream);
  if (sk == dk) {
    return CudaStatus(cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * DTypeSize(src_dtype), cudaMemcpyDefault, st),
                      "cast (cuda): copy");
  }
  const int blocks = static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, 4096));
  switch (sk) {
    case cuda::kBf16: LaunchCast<cuda::kBf16>(dk, blocks, src, dst, n, st); break;
    case cuda::kF16: LaunchCast<cuda::kF16>(dk, blocks, src, dst, n, st); break;
    default: LaunchCast<cuda::kF32>(dk, blocks, src, dst, n, st); break;
  }
  return CudaStatus(cudaGetLastError(), "launching the cast kernel");
}

}  // namespace zrt::kernels
