// Compute: the element-wise work the engine does on its device's buffers (casts, moves, fills,
// gradient norms, Adam), so the engine is written once for host and GPU memory.
//
// CPU devices run the SIMD CPU kernels on the calling thread and the optimizer pool. CUDA devices
// queue the CUDA kernels on the device's compute stream (CudaDevice::stream()) and return at once;
// SumSquares and Synchronize wait for the stream. All pointers are the device's buffers.
//
// Not thread-safe: one thread at a time (the engine's).
#pragma once

#include <memory>
#include <span>

#include "zrt/kernels/adam.h"
#include "zrt/kernels/grad_norm.h"
#include "zrt/core/device.h"

namespace zrt {

class Compute {
 public:
  // For `device`: CPU kernels (with `options`' pool) for a CPU device, CUDA kernels for a CUDA one.
  static Result<std::unique_ptr<Compute>> For(Device* device, const kernels::CpuKernelOptions& options);
  virtual ~Compute() = default;

  // dst[i] = src[i] converted (as kernels::CastCpu); src and dst must not overlap.
  virtual Status Cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n) = 0;
  // memmove within the device's memory: dst and src may overlap.
  virtual Status Move(void* dst, const void* src, size_t bytes) = 0;
  // Queued copy between host memory and the device's, either way (pinned host memory keeps it
  // asynchronous on a GPU). The source must not change until the queue reaches the copy.
  virtual Status CopyAsync(void* dst, const void* src, size_t bytes) = 0;
  virtual Status Fill(void* dst, uint8_t byte, size_t bytes) = 0;
  // Sum of squares and inf/NaN presence over `grads` (waits for the result).
  virtual Result<kernels::GradStats> SumSquares(std::span<const kernels::GradRef> grads, DType dtype) = 0;
  // Adam/AdamW over state in this device's memory (as kernels::AdamCpu).
  virtual Status Adam(const kernels::AdamStepScalars& s, std::span<const kernels::AdamTensorArgs> tensors,
                      DType grad_dtype, DType copy_dtype) = 0;
  // The same over compact state (as kernels::AdamCompactCpu; `step` keys stochastic rounding).
  virtual Status AdamCompact(const kernels::AdamStepScalars& s, int64_t step, std::span<const kernels::AdamCompactArgs> tensors,
                             DType grad_dtype, DType copy_dtype) = 0;
  // Waits until everything queued so far is done (no-op on CPU).
  virtual Status Synchronize() = 0;

  // State snapshots (checkpoints). MarkUpdated() after the optimizer state changed (the step's
  // updates are queued); CopyToHost then copies device memory to host memory on a side stream that
  // waits only for those updates, so work queued later on the compute stream (the next forward)
  // overlaps the copy. Returns when the copy is done.
  virtual Status MarkUpdated() = 0;
  virtual Status CopyToHost(void* host, const void* device, size_t bytes) = 0;
};

#if defined(ZRT_HAVE_CUDA)
// Defined in compute_cuda.cc.
Result<std::unique_ptr<Compute>> MakeCudaCompute(Device* device);
#endif

}  // namespace zrt
