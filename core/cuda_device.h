// CudaDevice: device memory through a caching allocator (no cudaMalloc/cudaFree inside a step),
// owned streams and events, and async copies to/from (pinned) host memory. Built with ZRT_WITH_CUDA.
//
//   auto dev = CudaDevice::Create();        // the GPU of this process's local rank
//   auto buf = dev->Allocate(bytes, MemCategory::kParameters);
//   CudaStream s = *CudaStream::Create();
//   dev->CopyAsync(host_pinned, buf.data(), bytes, s); s.Synchronize();
//
// Device choice: the local rank (OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID or LOCAL_RANK, first set)
// modulo the visible device count; 0 without any. Accounting as on CPU: per category, live buffers.
//
// Streams: stream() is the compute stream zrt orders its work on (kernels, copies, and the NCCL
// communicator's collectives through events). It is the trainer's stream: set_stream() before creating
// the engine when the trainer computes on its own stream; the default is the legacy default stream.
// Copy/Fill are queued on stream() and then wait for it (so they see every kernel queued before);
// the *Async forms are ordered on the given stream.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>

#include "zrt/core/device.h"

namespace zrt {

class CachingAllocator;  // caching_allocator.h

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
  Status Record(cudaStream_t s);
  Status Record(const CudaStream& s) { return Record(s.get()); }
  Status MakeWait(cudaStream_t s) const;  // work later queued on s waits for this event
  Status MakeWait(const CudaStream& s) const { return MakeWait(s.get()); }
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
  bool host_accessible() const override { return false; }
  int ordinal() const { return ordinal_; }
  cudaStream_t stream() const { return stream_; }
  void set_stream(cudaStream_t s) { stream_ = s; }
  Status Copy(void* dst, const void* src, size_t bytes) override;  // any direction (unified addressing)
  Status Fill(void* dst, uint8_t byte, size_t bytes) override;
  Status CopyAsync(void* dst, const void* src, size_t bytes, const CudaStream& s);
  Status FillAsync(void* dst, uint8_t byte, size_t bytes, const CudaStream& s);
  // Makes this device current on the calling thread (each thread that launches work must).
  Status MakeCurrent() const;
  AllocatorStats allocator_stats() const;
  void EmptyCache();

 protected:
  Result<void*> RawAllocate(size_t bytes, size_t alignment) override;
  void RawFree(void* p, size_t bytes) override;

 private:
  explicit CudaDevice(int ordinal);
  int ordinal_;
  cudaStream_t stream_ = nullptr;  // legacy default stream
  std::unique_ptr<CachingAllocator> cache_;
};

}  // namespace zrt
