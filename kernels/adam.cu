// Launchers for the CUDA optimizer kernels: validate on the host, pack tensors into batches of at most
// kMaxTensors tensors / kMaxBlocks blocks passed by value, launch, and check each launch.
#include <algorithm>
#include <vector>

#include "zrt/kernels/adam.cuh"
#include "zrt/kernels/adam_cuda.h"
#include "zrt/core/cuda_status.h"

namespace zrt::kernels {
namespace {

using cuda::kChunk;
using cuda::kMaxBlocks;
using cuda::kMaxTensors;
using cuda::kThreads;

Result<int> Kind(DType t, const char* what) {
  switch (t) {
    case DType::kF32: return int{cuda::kF32};
    case DType::kBF16: return int{cuda::kBf16};
    case DType::kF16: return int{cuda::kF16};
    default: return InvalidArgumentError(what, " dtype ", DTypeName(t), " unsupported (f32, bf16 or f16)");
  }
}

int64_t Chunks(int64_t n) { return (n + kChunk - 1) / kChunk; }

// Walks (tensor, chunk) pairs and calls flush(first_tensor, tensors_in_batch, blocks) whenever a batch is
// full; `add(slot, tensor)` fills a tensor slot, `block(b, slot, chunk)` a block entry.
template <class AddTensor, class AddBlock, class Flush>
Status Batch(std::span<const int64_t> numels, AddTensor add, AddBlock block, Flush flush) {
  int slots = 0, blocks = 0;
  for (size_t t = 0; t < numels.size(); ++t) {
    const int64_t chunks = Chunks(numels[t]);
    if (chunks == 0) continue;
    if (chunks > INT32_MAX) return InvalidArgumentError("tensor ", t, " is too large for one launch");
    int64_t c = 0;
    while (c < chunks) {
      if (slots == kMaxTensors || blocks == kMaxBlocks) {
        RETURN_IF_ERROR(flush(blocks));
        slots = blocks = 0;
      }
      const int slot = slots++;
      add(slot, t);
      for (; c < chunks && blocks < kMaxBlocks; ++c) block(blocks++, slot, static_cast<int32_t>(c));
    }
  }
  if (blocks > 0) RETURN_IF_ERROR(flush(blocks));
  return Status();
}

template <int G, int C>
void LaunchAdam(bool ams, int blocks, const cuda::AdamBatch& b, const AdamStepScalars& s, const AdamCudaOptions& o) {
  auto stream = static_cast<cudaStream_t>(o.stream);
  if (ams) {
    cuda::AdamKernel<G, C, true><<<blocks, kThreads, 0, stream>>>(b, s, o.skip_flag, o.grad_scale);
  } else {
    cuda::AdamKernel<G, C, false><<<blocks, kThreads, 0, stream>>>(b, s, o.skip_flag, o.grad_scale);
  }
}

template <int G>
void LaunchAdamCopy(int copy, bool ams, int blocks, const cuda::AdamBatch& b, const AdamStepScalars& s,
                    const AdamCudaOptions& o) {
  switch (copy) {
    case cuda::kBf16: return LaunchAdam<G, cuda::kBf16>(ams, blocks, b, s, o);
    case cuda::kF16: return LaunchAdam<G, cuda::kF16>(ams, blocks, b, s, o);
    default: return LaunchAdam<G, cuda::kNone>(ams, blocks, b, s, o);
  }
}

}  // namespace

Status AdamCuda(const AdamStepScalars& s, std::span<const AdamTensorArgs> tensors, DType grad_dtype, DType copy_dtype,
                const AdamCudaOptions& options) {
  ASSIGN_OR_RETURN(const int grad_kind, Kind(grad_dtype, "gradient"), "adam (cuda)");
  std::vector<int64_t> numels(tensors.size());
  bool any_copy = false;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const AdamTensorArgs& t = tensors[i];
    if (t.numel < 0) return InvalidArgumentError("adam (cuda): tensor ", i, " has negative numel");
    if (t.numel > 0 && (!t.param || !t.grad || !t.exp_avg || !t.exp_avg_sq || (s.amsgrad && !t.max_exp_avg_sq))) {
      return InvalidArgumentError("adam (cuda): tensor ", i, " has a null state pointer");
    }
    any_copy = any_copy || (t.numel > 0 && t.param_copy != nullptr);
    numels[i] = t.numel;
  }
  int copy_kind = cuda::kNone;
  if (any_copy) {
    if (copy_dtype != DType::kBF16 && copy_dtype != DType::kF16) {
      return InvalidArgumentError("adam (cuda): parameter copy dtype ", DTypeName(copy_dtype), " unsupported");
    }
    copy_kind = copy_dtype == DType::kBF16 ? cuda::kBf16 : cuda::kF16;
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (tensors[i].numel > 0 && tensors[i].param_copy == nullptr) {
        return InvalidArgumentError("adam (cuda): tensor ", i, " lacks param_copy (all or none per call)");
      }
    }
  }
  cuda::AdamBatch b{};
  auto add = [&](int slot, size_t t) {
    const AdamTensorArgs& a = tensors[t];
    b.p[slot] = a.param;
    b.g[slot] = a.grad;
    b.m[slot] = a.exp_avg;
    b.v[slot] = a.exp_avg_sq;
    b.vmax[slot] = a.max_exp_avg_sq;
    b.copy[slot] = a.param_copy;
    b.n[slot] = a.numel;
  };
  auto block = [&](int k, int slot, int32_t chunk) {
    b.block_tensor[k] = static_cast<uint8_t>(slot);
    b.block_chunk[k] = chunk;
  };
  auto flush = [&](int blocks) -> Status {
    switch (grad_kind) {
      case cuda::kBf16: LaunchAdamCopy<cuda::kBf16>(copy_kind, s.amsgrad, blocks, b, s, options); break;
      case cuda::kF16: LaunchAdamCopy<cuda::kF16>(copy_kind, s.amsgrad, blocks, b, s, options); break;
      default: LaunchAdamCopy<cuda::kF32>(copy_kind, s.amsgrad, blocks, b, s, options); break;
    }
    return CudaStatus(cudaGetLastError(), "launching the adam kernel");
  };
  return Batch(numels, add, block, flush);
}

size_t GradSumSquaresCudaWorkspace(std::span<const GradRef> grads) {
  int64_t blocks = 0;
  for (const GradRef& g : grads) blocks += Chunks(std::max<int64_t>(g.numel, 0));
  return static_cast<size_t>(std::max<int64_t>(blocks, 1)) * sizeof(double);
}

Status GradSumSquaresCuda(std::span<const GradRef> grads, DType dtype, void* workspace, size_t workspace_bytes,
                          double* sum_squares, int* found_inf, void* stream) {
  ASSIGN_OR_RETURN(const int kind, Kind(dtype, "gradient"), "grad sum of squares (cuda)");
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
  RETURN_IF_ERROR(Batch(numels, add, block, flush));
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
  ASSIGN_OR_RETURN(const int sk, Kind(src_dtype, "source"), "cast (cuda)");
  ASSIGN_OR_RETURN(const int dk, Kind(dst_dtype, "destination"), "cast (cuda)");
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
