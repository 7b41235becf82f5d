// Launcher of the fused CUDA Adam/AdamW kernel: validate on the host, pack tensors into batches of at
// most kMaxTensors tensors / kMaxBlocks blocks passed by value, launch, check each launch.
#include <vector>

#include "zrt/core/cuda_status.h"
#include "zrt/kernels/adam.cuh"
#include "zrt/kernels/adam.h"

namespace zrt::kernels {
namespace {

using cuda::kThreads;

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
  ASSIGN_OR_RETURN(const int grad_kind, cuda::KindOf(grad_dtype, "gradient"), "adam (cuda)");
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
  return cuda::Batch(numels, add, block, flush);
}

namespace {

template <int G>
void LaunchCompact(int copy, bool sr, unsigned grid, const cuda::CompactTensor& t, const AdamStepScalars& s, uint64_t step, int64_t seg,
                   const AdamCudaOptions& o) {
  auto stream = static_cast<cudaStream_t>(o.stream);
  if (sr) {
    cuda::AdamCompactKernel<G, cuda::kNone, true><<<grid, kThreads, 0, stream>>>(t, s, step, seg, o.skip_flag, o.grad_scale);
    return;
  }
  switch (copy) {
    case cuda::kBf16: cuda::AdamCompactKernel<G, cuda::kBf16, false><<<grid, kThreads, 0, stream>>>(t, s, step, seg, o.skip_flag, o.grad_scale); break;
    case cuda::kF16: cuda::AdamCompactKernel<G, cuda::kF16, false><<<grid, kThreads, 0, stream>>>(t, s, step, seg, o.skip_flag, o.grad_scale); break;
    default: cuda::AdamCompactKernel<G, cuda::kNone, false><<<grid, kThreads, 0, stream>>>(t, s, step, seg, o.skip_flag, o.grad_scale); break;
  }
}

}  // namespace

// One launch per tensor: segments of one q8 or q4 block, or of 8192 elements.
Status AdamCompactCuda(const AdamStepScalars& s, int64_t step, std::span<const AdamCompactArgs> tensors, DType grad_dtype,
                       DType copy_dtype, const AdamCudaOptions& options) {
  ASSIGN_OR_RETURN(const int grad_kind, cuda::KindOf(grad_dtype, "gradient"), "adam (cuda)");
  if (s.amsgrad) return InvalidArgumentError("adam (cuda): amsgrad needs f32 moments and a master");
  if (step < 1) return InvalidArgumentError("adam (cuda): step must be >= 1, got ", step);
  static_assert(kMaxQuantBlock % cuda::kThreads == 0, "a q8 block is whole registers per thread");
  for (size_t i = 0; i < tensors.size(); ++i) {
    const AdamCompactArgs& a = tensors[i];
    RETURN_IF_ERROR(CheckCompactFormat(a.format), "adam (cuda): tensor ", i);
    if (a.numel <= 0) continue;
    const bool q8 = IsBlockwise(a.format.exp_avg) || IsBlockwise(a.format.exp_avg_sq);
    if (!a.param || !a.grad || !a.exp_avg || !a.exp_avg_sq || (IsBlockwise(a.format.exp_avg) && !a.exp_avg_scale) ||
        (IsBlockwise(a.format.exp_avg_sq) && !a.exp_avg_sq_scale) || (!a.format.master && a.param_copy) ||
        (q8 && a.index % a.format.block != 0) || a.index < 0) {
      return InvalidArgumentError("adam (cuda): tensor ", i, " has a null pointer, a copy without a master or misaligned q8/q4 blocks");
    }
    if (a.param_copy && copy_dtype != DType::kBF16 && copy_dtype != DType::kF16) {
      return InvalidArgumentError("adam (cuda): parameter copy dtype ", DTypeName(copy_dtype), " unsupported");
    }
    const int64_t seg = q8 ? a.format.block : 8192;
    const int64_t grid = (a.numel + seg - 1) / seg;
    if (grid > INT32_MAX) return InvalidArgumentError("adam (cuda): tensor ", i, " is too large for one launch");
    const cuda::CompactTensor t{a.param, a.grad, a.exp_avg, a.exp_avg_scale, a.exp_avg_sq, a.exp_avg_sq_scale, a.param_copy, a.numel,
                                a.index, static_cast<int>(a.format.exp_avg), static_cast<int>(a.format.exp_avg_sq), a.format.seed};
    const int copy = !a.param_copy ? cuda::kNone : copy_dtype == DType::kBF16 ? cuda::kBf16 : cuda::kF16;
    const auto g = static_cast<unsigned>(grid);
    const auto st = static_cast<uint64_t>(step);
    switch (grad_kind) {
      case cuda::kBf16: LaunchCompact<cuda::kBf16>(copy, !a.format.master, g, t, s, st, seg, options); break;
      case cuda::kF16: LaunchCompact<cuda::kF16>(copy, !a.format.master, g, t, s, st, seg, options); break;
      default: LaunchCompact<cuda::kF32>(copy, !a.format.master, g, t, s, st, seg, options); break;
    }
    RETURN_IF_ERROR(CudaStatus(cudaGetLastError(), "launching the compact adam kernel"));
  }
  return Status();
}

}  // namespace zrt::kernels
