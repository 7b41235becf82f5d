#include "zrt/core/cuda_device.h"

#include "zrt/core/caching_allocator.h"

#include <cstdlib>
#include <string>

#include "zrt/core/cuda_status.h"

namespace zrt {

// ---- CudaStream / CudaEvent ------------------------------------------------------------------------
Result<CudaStream> CudaStream::Create(int priority) {
  cudaStream_t s = nullptr;
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, priority));
  return CudaStream(s);
}

CudaStream& CudaStream::operator=(CudaStream&& o) noexcept {
  if (this != &o) {
    if (s_ != nullptr) (void)cudaStreamDestroy(s_);
    s_ = o.s_;
    o.s_ = nullptr;
  }
  return *this;
}

CudaStream::~CudaStream() {
  if (s_ != nullptr) (void)cudaStreamDestroy(s_);
}

Status CudaStream::Synchronize() const { return CudaStatus(cudaStreamSynchronize(s_), "cudaStreamSynchronize"); }

Result<CudaEvent> CudaEvent::Create() {
  cudaEvent_t e = nullptr;
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return CudaEvent(e);
}

CudaEvent& CudaEvent::operator=(CudaEvent&& o) noexcept {
  if (this != &o) {
    if (e_ != nullptr) (void)cudaEventDestroy(e_);
    e_ = o.e_;
    o.e_ = nullptr;
  }
  return *this;
}

CudaEvent::~CudaEvent() {
  if (e_ != nullptr) (void)cudaEventDestroy(e_);
}

Status CudaEvent::Record(cudaStream_t s) { return CudaStatus(cudaEventRecord(e_, s), "cudaEventRecord"); }
Status CudaEvent::MakeWait(cudaStream_t s) const { return CudaStatus(cudaStreamWaitEvent(s, e_, 0), "cudaStreamWaitEvent"); }
Status CudaEvent::Synchronize() const { return CudaStatus(cudaEventSynchronize(e_), "cudaEventSynchronize"); }

Result<bool> CudaEvent::Done() const {
  const cudaError_t e = cudaEventQuery(e_);
  if (e == cudaSuccess) return true;
  if (e == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  return CudaStatus(e, "cudaEventQuery");
}

// ---- CudaDevice ------------------------------------------------------------------------------------
int CudaDevice::LocalRank() {
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "LOCAL_RANK"}) {
    if (const char* v = std::getenv(var); v != nullptr && *v != '\0') return std::atoi(v);
  }
  return 0;
}

Result<std::unique_ptr<CudaDevice>> CudaDevice::Create(int ordinal) {
  int count = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    return UnavailableError("no usable CUDA device (cudaGetDeviceCount: ", e == cudaSuccess ? "0 devices" : cudaGetErrorString(e), ")");
  }
  if (ordinal < 0) ordinal = LocalRank() % count;
  if (ordinal >= count) return InvalidArgumentError("CUDA device ", ordinal, " asked for, ", count, " visible");
  CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal));
  return std::unique_ptr<CudaDevice>(new CudaDevice(ordinal));
}

CudaDevice::CudaDevice(int ordinal) : ordinal_(ordinal) {
  cache_ = std::make_unique<CachingAllocator>(CachingAllocator::Backend{
      [this](size_t bytes) -> Result<void*> {
        RETURN_IF_ERROR(MakeCurrent());
        void* p = nullptr;
        const cudaError_t e = cudaMalloc(&p, bytes);
        if (e != cudaSuccess) {
          (void)cudaGetLastError();
          return CudaStatus(e, "cudaMalloc of " + FormatBytes(static_cast<int64_t>(bytes)) + " on " + name());
        }
        return p;
      },
      [](void* p, size_t) { (void)cudaFree(p); }});
}

CudaDevice::~CudaDevice() { cache_.reset(); }

std::string CudaDevice::name() const { return "cuda:" + std::to_string(ordinal_); }

Status CudaDevice::MakeCurrent() const { return CudaStatus(cudaSetDevice(ordinal_), "cudaSetDevice"); }

Result<void*> CudaDevice::RawAllocate(size_t bytes, size_t alignment) {
  // cudaMalloc returns 256-byte aligned memory; size classes keep every block a multiple of 512.
  if (alignment > 256) return InvalidArgumentError("CUDA allocations are 256-byte aligned; ", alignment, " asked");
  return cache_->Allocate(bytes);
}

void CudaDevice::RawFree(void* p, size_t /*bytes*/) { cache_->Free(p); }

Status CudaDevice::Copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return Status();
  RETURN_IF_ERROR(MakeCurrent());
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_));
  return CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize after a copy");
}

Status CudaDevice::Fill(void* dst, uint8_t byte, size_t bytes) {
  if (bytes == 0) return Status();
  RETURN_IF_ERROR(MakeCurrent());
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dst, byte, bytes, stream_));
  return CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize after a fill");
}

Status CudaDevice::CopyAsync(void* dst, const void* src, size_t bytes, const CudaStream& s) {
  if (bytes == 0) return Status();
  return CudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s.get()), "cudaMemcpyAsync");
}

Status CudaDevice::FillAsync(void* dst, uint8_t byte, size_t bytes, const CudaStream& s) {
  if (bytes == 0) return Status();
  return CudaStatus(cudaMemsetAsync(dst, byte, bytes, s.get()), "cudaMemsetAsync");
}

AllocatorStats CudaDevice::allocator_stats() const { return cache_->stats(); }
void CudaDevice::EmptyCache() { cache_->EmptyCache(); }

}  // namespace zrt
