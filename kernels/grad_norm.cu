// Launchers of the CUDA gradient sum-of-squares and clip-multiplier kernels.
#include <algorithm>
#include <vector>

#include "zrt/core/cuda_status.h"
#include "zrt/kernels/grad_norm.cuh"
#include "zrt/kernels/grad_norm.h"

namespace zrt::kernels {

using cuda::kThreads;

size_t GradSumSquaresCudaWorkspace(std::span<const GradRef> grads) {
  int64_t blocks = 0;
  for (const GradRef& g : grads) blocks += cuda::Chunks(std::max<int64_t>(g.numel, 0));
  return static_cast<size_t>(std::max<int64_t>(blocks, 1)) * sizeof(double);
}

Status GradSumSquaresCuda(std::span<const GradRef> grads, DType dtype, void* workspace, size_t workspace_bytes,
                          double* sum_squares, int* found_inf, void* stream) {
  ASSIGN_OR_RETURN(const int kind, cuda::KindOf(dtype, "gradient"), "grad sum of squares (cuda)");
  if (workspace_bytes < GradSumSquaresCudaWorkspace(grads) || workspace == nullptr) {
    return InvalidArgumentError("grad sum of squares (cuda): workspace of ", workspace_bytes, " bytes is below the ",
                                GradSumSquaresCudaWorkspace(grads), " needed");
  }
  if (sum_squares == nullptr || found_inf == nullptr) return InvalidArgumentError("grad sum of squares (cuda): null output");
  std::vector<int64_t> numels(grads.size());
  for (size_t i = 0; i < grads.size(); ++i) {
    if (grads[i].numel < 0 || (grads[i].numel > 0 && grads[i].data == nullptr)) {
      return InvalidArgumentError("grad sum of squares (cuda): gradient ", i, " is null or has a negative size");
    }
    numels[i] = grads[i].numel;
  }
  auto* partials = static_cast<double*>(workspace);
  auto st = static_cast<cudaStream_t>(stream);
  cuda::NormBatch b{};
  int32_t offset = 0;
  auto add = [&](int slot, size_t t) {
    b.g[slot] = grads[t].data;
    b.n[slot] = grads[t].numel;
  };
  auto block = [&](int k, int slot, int32_t chunk) {
    b.block_tensor[k] = static_cast<uint8_t>(slot);
    b.block_chunk[k] = chunk;
  };
  auto flush = [&](int blocks) -> Status {
    b.partial_offset = offset;
    switch (kind) {
      case cuda::kBf16: cuda::SumSquaresKernel<cuda::kBf16><<<blocks, kThreads, 0, st>>>(b, partials, found_inf); break;
      case cuda::kF16: cuda::SumSquaresKernel<cuda::kF16><<<blocks, kThreads, 0, st>>>(b, partials, found_inf); break;
      default: cuda::SumSquaresKernel<cuda::kF32><<<blocks, kThreads, 0, st>>>(b, partials, found_inf); break;
    }
    offset += blocks;
    return CudaStatus(cudaGetLastError(), "launching the sum-of-squares kernel");
  };
  RETURN_IF_ERROR(cuda::Batch(numels, add, block, flush));
  cuda::SumPartialsKernel<<<1, kThreads, 0, st>>>(partials, offset, sum_squares);
  return CudaStatus(cudaGetLastError(), "launching the partial-sum kernel");
}

Status GradMultiplierCuda(const double* sum_squares, float loss_scale, float max_norm, float* multiplier, float* norm,
                          void* stream) {
  if (sum_squares == nullptr || multiplier == nullptr) return InvalidArgumentError("grad multiplier (cuda): null pointer");
  if (!(loss_scale > 0)) return InvalidArgumentError("grad multiplier (cuda): loss scale must be > 0");
  cuda::GradMultiplierKernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(sum_squares, loss_scale, max_norm,
                                                                            multiplier, norm);
  return CudaStatus(cudaGetLastError(), "launching the grad multiplier kernel");
}

}  // namespace zrt::kernels
