// Compute on a CudaDevice: the CUDA kernels, queued on the device's compute stream. Each call makes
// the device current first (cheap when it already is): the engine may be driven from any one thread
// at a time, and a launch on the default stream would otherwise go to that thread's current GPU.
#include <cstring>
#include <memory>

#include "zrt/kernels/adam.h"
#include "zrt/kernels/cast.h"
#include "zrt/kernels/grad_norm.h"
#include "zrt/runtime/compute.h"
#include "zrt/core/cuda_device.h"
#include "zrt/core/cuda_status.h"

namespace zrt {
namespace {

class CudaCompute final : public Compute {
 public:
  explicit CudaCompute(CudaDevice* d) : d_(d) {}

  Status Cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n) override {
    RETURN_IF_ERROR(d_->MakeCurrent());
    return kernels::CastCuda(src, src_dtype, dst, dst_dtype, n, d_->stream());
  }

  Status Move(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0 || dst == src) return Status();
    RETURN_IF_ERROR(d_->MakeCurrent());
    const auto* s = static_cast<const char*>(src);
    auto* t = static_cast<char*>(dst);
    if (s + bytes <= t || t + bytes <= s) {
      return CudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, d_->stream()), "compute: move");
    }
    // Overlapping (bucket compaction): through a scratch buffer, which grows as needed and stays.
    if (scratch_.size() < bytes) {
      scratch_.Reset();
      ASSIGN_OR_RETURN(scratch_, d_->Allocate(bytes, MemCategory::kCommunication), "compute: move scratch");
    }
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(scratch_.data(), src, bytes, cudaMemcpyDeviceToDevice, d_->stream()));
    return CudaStatus(cudaMemcpyAsync(dst, scratch_.data(), bytes, cudaMemcpyDeviceToDevice, d_->stream()), "compute: move");
  }

  Status CopyAsync(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return Status();
    RETURN_IF_ERROR(d_->MakeCurrent());
    return CudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, d_->stream()), "compute: copy");
  }

  Status Fill(void* dst, uint8_t byte, size_t bytes) override {
    if (bytes == 0) return Status();
    RETURN_IF_ERROR(d_->MakeCurrent());
    return CudaStatus(cudaMemsetAsync(dst, byte, bytes, d_->stream()), "compute: fill");
  }

  Result<kernels::GradStats> SumSquares(std::span<const kernels::GradRef> grads, DType dtype) override {
    RETURN_IF_ERROR(d_->MakeCurrent());
    // Workspace: [sum (double)][found_inf (int, padded to 8)][partials...], reused across steps.
    const size_t need = 16 + kernels::GradSumSquaresCudaWorkspace(grads);
    if (norm_ws_.size() < need) {
      norm_ws_.Reset();
      ASSIGN_OR_RETURN(norm_ws_, d_->Allocate(need, MemCategory::kOther), "compute: norm workspace");
    }
    char* ws = norm_ws_.as<char>();
    auto* sum = reinterpret_cast<double*>(ws);
    auto* inf = reinterpret_cast<int*>(ws + 8);
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(ws, 0, 16, d_->stream()));
    RETURN_IF_ERROR(kernels::GradSumSquaresCuda(grads, dtype, ws + 16, need - 16, sum, inf, d_->stream()));
    char host[16];
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host, ws, 16, cudaMemcpyDeviceToHost, d_->stream()));
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(d_->stream()));
    kernels::GradStats st;
    int found = 0;
    std::memcpy(&st.sum_squares, host, 8);
    std::memcpy(&found, host + 8, 4);
    st.nonfinite = found != 0;
    return st;
  }

  Status Adam(const kernels::AdamStepScalars& s, std::span<const kernels::AdamTensorArgs> tensors, DType grad_dtype,
              DType copy_dtype) override {
    RETURN_IF_ERROR(d_->MakeCurrent());
    kernels::AdamCudaOptions o;
    o.stream = d_->stream();
    return kernels::AdamCuda(s, tensors, grad_dtype, copy_dtype, o);
  }

  Status AdamCompact(const kernels::AdamStepScalars& s, int64_t step, std::span<const kernels::AdamCompactArgs> tensors, DType grad_dtype,
                     DType copy_dtype) override {
    RETURN_IF_ERROR(d_->MakeCurrent());
    kernels::AdamCudaOptions o;
    o.stream = d_->stream();
    return kernels::AdamCompactCuda(s, step, tensors, grad_dtype, copy_dtype, o);
  }

  Status Synchronize() override {
    RETURN_IF_ERROR(d_->MakeCurrent());
    return CudaStatus(cudaStreamSynchronize(d_->stream()), "compute: synchronize");
  }

  Status MarkUpdated() override {
    RETURN_IF_ERROR(d_->MakeCurrent());
    return updated_.Record(d_->stream());
  }

  Status CopyToHost(void* host, const void* device, size_t bytes) override {
    if (bytes == 0) return Status();
    RETURN_IF_ERROR(d_->MakeCurrent());
    RETURN_IF_ERROR(updated_.MakeWait(side_));
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, side_.get()));
    return side_.Synchronize();
  }

  Status Init() {
    ASSIGN_OR_RETURN(side_, CudaStream::Create(), "compute: snapshot stream");
    ASSIGN_OR_RETURN(updated_, CudaEvent::Create(), "compute");
    return updated_.Record(d_->stream());  // everything queued so far
  }

 private:
  CudaDevice* d_;
  CudaStream side_;    // snapshot copies
  CudaEvent updated_;  // the last MarkUpdated on the compute stream
  DeviceBuffer scratch_, norm_ws_;
};

}  // namespace

Result<std::unique_ptr<Compute>> MakeCudaCompute(Device* device) {
  auto* d = dynamic_cast<CudaDevice*>(device);
  if (d == nullptr) return InvalidArgumentError("compute: ", device->name(), " is not a CudaDevice");
  RETURN_IF_ERROR(d->MakeCurrent());
  std::unique_ptr<CudaCompute> c(new CudaCompute(d));
  RETURN_IF_ERROR(c->Init());
  return std::unique_ptr<Compute>(std::move(c));
}

}  // namespace zrt
