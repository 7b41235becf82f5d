// CudaDevice: device memory through a caching allocator (no cudaMalloc/cudaFree inside a step),
// owned streams and events, and async copies to/from (pinned) host memory. Built with ZRT_WITH_CUDA.
//
//   auto dev = CudaDevice::Create();        // the GPU of this process's local rank
//   auto buf = dev->Allocate(bytes, MemCategory::kParameters);
//   CudaStream s = *CudaStream::Create();
//   dev->CopyAsync(host_pinned, buf.data(), bytes, s); s.Synchronize();
//
// Device choice: the local rank (OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID or LOCAL_RANK, first set)
// modulo the visible device count; 0 without any. Copy/Fill are synchronous (Device contract); the
// *Async forms are ordered on the given stream. Accounting as on CPU: per category, live buffers.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>

#include "runtime/core/caching_allocator.h"
#include "runtime/core/device.h"

namespace zrt {

// Owned cudaStream_t (non-blocking with respect to the legacy default stream). Move-only.
class CudaStream {
 public:
  static Result<CudaStream> Create(int priority = 0);
  CudaStream() = default;
  CudaStream(CudaStream&& o) noexcept : s_(o.s_) { o.s_ = nullptr; }
  CudaStream& operator=(CudaStream&& o) noexcept;
  ~CudaStream();
  cudaStream_t get() const { return s_; }
  Status Synchronize() const;

 private:
  explicit CudaStream(cudaStream_t s) : s_(s) {}
  cudaStream_t s_ = nullptr;
};

// Owned cudaEvent_t (timing disabled): Record on one stream, make another wait for it. Move-only.
class CudaEvent {
 public:
  static Result<CudaEvent> Create();
  CudaEvent() = default;
  CudaEvent(CudaEvent&& o) noexcept : e_(o.e_) { o.e_ = nullptr; }
  CudaEvent& operator=(CudaEvent&& o) noexcept;
  ~CudaEvent();
  cudaEvent_t get() const { return e_; }
  Status Record(const CudaStream& s);
  Status MakeWait(const CudaStream& s) const;  // work later queued on s waits for this event
  Result<bool> Done() const;                   // cudaEventQuery
  Status Synchronize() const;

 private:
  explicit CudaEvent(cudaEvent_t e) : e_(e) {}
  cudaEvent_t e_ = nullptr;
};

class CudaDevice final : public Device {
 public:
  // ordinal < 0: chosen by local rank. Unavailable when there is no usable GPU.
  static Result<std::unique_ptr<CudaDevice>> Create(int ordinal = -1);
  // The local rank from the launcher's environment, or 0.
  static int LocalRank();
  ~CudaDevice() override;

  DeviceKind kind() const override { return DeviceKind::kCuda; }
  std::string name() const override;
  int ordinal() const { return ordinal_; }
  Status Copy(void* dst, const void* src, size_t bytes) override;  // any direction (unified addressing)
  Status Fill(void* dst, uint8_t byte, size_t bytes) override;
  Status CopyAsync(void* dst, const void* src, size_t bytes, const CudaStream& s);
  Status FillAsync(void* dst, uint8_t byte, size_t bytes, const CudaStream& s);
  // Makes this device current on the calling thread (each thread that launches work must).
  Status MakeCurrent() const;
  CachingAllocator::Stats allocator_stats() const { return cache_->stats(); }
  void EmptyCache() { cache_->EmptyCache(); }

 protected:
  Result<void*> RawAllocate(size_t bytes, size_t alignment) override;
  void RawFree(void* p, size_t bytes) override;

 private:
  explicit CudaDevice(int ordinal);
  int ordinal_;
  std::unique_ptr<CachingAllocator> cache_;
};

}  // namespace zrt
