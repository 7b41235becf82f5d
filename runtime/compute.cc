#include "zrt/runtime/compute.h"

#include <cstring>

#include "zrt/kernels/cast.h"

namespace zrt {
namespace {

class CpuCompute final : public Compute {
 public:
  explicit CpuCompute(const kernels::CpuKernelOptions& o) : o_(o) {}
  Status Cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n) override {
    return kernels::CastCpu(src, src_dtype, dst, dst_dtype, n, o_);
  }
  Status Move(void* dst, const void* src, size_t bytes) override {
    if (bytes != 0) std::memmove(dst, src, bytes);
    return Status();
  }
  Status CopyAsync(void* dst, const void* src, size_t bytes) override {
    if (bytes != 0) std::memcpy(dst, src, bytes);
    return Status();
  }
  Status Fill(void* dst, uint8_t byte, size_t bytes) override {
    if (bytes != 0) std::memset(dst, byte, bytes);
    return Status();
  }
  Result<kernels::GradStats> SumSquares(std::span<const kernels::GradRef> grads, DType dtype) override {
    return kernels::GradSumSquaresCpu(grads, dtype, o_);
  }
  Status Adam(const kernels::AdamStepScalars& s, std::span<const kernels::AdamTensorArgs> tensors, DType grad_dtype,
              DType copy_dtype) override {
    return kernels::AdamCpu(s, tensors, grad_dtype, copy_dtype, o_);
  }
  Status AdamCompact(const kernels::AdamStepScalars& s, int64_t step, std::span<const kernels::AdamCompactArgs> tensors, DType grad_dtype,
                     DType copy_dtype) override {
    return kernels::AdamCompactCpu(s, step, tensors, grad_dtype, copy_dtype, o_);
  }
  Status Synchronize() override { return Status(); }
  Status MarkUpdated() override { return Status(); }
  Status CopyToHost(void* host, const void* device, size_t bytes) override {
    if (bytes != 0) std::memcpy(host, device, bytes);
    return Status();
  }

 private:
  kernels::CpuKernelOptions o_;
};

}  // namespace

Result<std::unique_ptr<Compute>> Compute::For(Device* device, const kernels::CpuKernelOptions& options) {
  if (device == nullptr) return InvalidArgumentError("compute: null device");
  switch (device->kind()) {
    case DeviceKind::kCpu: return std::unique_ptr<Compute>(new CpuCompute(options));
    case DeviceKind::kCuda:
#if defined(ZRT_HAVE_CUDA)
      return MakeCudaCompute(device);
#else
      return UnavailableError("compute: device ", device->name(), " needs a build with CUDA");
#endif
  }
  return InvalidArgumentError("compute: unknown device kind");
}

}  // namespace zrt
