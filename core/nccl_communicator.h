// NcclCommunicator: collectives on device buffers through NCCL (built with ZRT_WITH_NCCL), one GPU per
// rank. The production Communicator on GPUs; MpiCommunicator stays the reference and the bootstrap.
//
//   auto mpi  = MpiCommunicator::Create();
//   auto gpu  = CudaDevice::Create();                    // the GPU of this local rank
//   auto nccl = NcclCommunicator::Create(mpi.get(), gpu.get(), {.timeout_seconds = 300});
//
// Bootstrap: collective over `bootstrap` (any communicator on host memory): rank 0 creates the
// ncclUniqueId and broadcasts it; the NCCL group has the bootstrap group's ranks.
//
// Streams: collectives run on the communicator's own stream. Each waits (by an event) for the work
// queued so far on the device's compute stream (CudaDevice::stream()), so it reads what the trainer
// and the engine wrote; CommHandle::Wait() makes the compute stream wait for the collective (the host
// does not block), and Test() reports whether it finished. Host buffers are accepted too (staged
// through device memory, synchronously): small control messages such as AgreeOnStatus work unchanged.
//
// Reductions: f32, bf16, f16 (bf16/f16 are reduced by NCCL in their own dtype, rounded at each hop:
// reduce in f32, the engine's default reduce_dtype, where that matters). kAvg is ncclAvg.
//
// Failures: a watchdog thread polls ncclCommGetAsyncError and every pending collective; a collective
// not finished after `timeout_seconds` (a dead or diverged rank) or an asynchronous NCCL error aborts
// the communicator (ncclCommAbort, so stuck kernels return) and every later call returns that error
// naming the collective and the rank. Argument checking (check_args(), on by default) costs a
// synchronous all-reduce per collective: turn it off on hot paths once a configuration works.
//
// Thread-safety: one thread at a time, as every Communicator.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "zrt/core/communicator.h"
#include "zrt/core/cuda_device.h"

struct ncclComm;  // nccl.h's ncclComm_t is ncclComm*; this header does not need nccl.h

namespace zrt {

class Watchdog;  // watchdog.h

struct NcclOptions {
  double timeout_seconds = 600;  // a collective pending longer aborts the communicator
};

class NcclCommunicator final : public Communicator {
 public:
  static Result<std::unique_ptr<NcclCommunicator>> Create(Communicator* bootstrap, CudaDevice* device,
                                                          const NcclOptions& options = {});
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "nccl"; }
  cudaStream_t stream() const { return stream_.get(); }
  // The watchdog's error (OK while the communicator is healthy).
  Status error() const;

  Status Barrier() override;
  Status Broadcast(void* buf, size_t count, DType dtype, int root) override;
  Result<CommHandle> AllReduceAsync(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override;
  Result<CommHandle> ReduceScatterAsync(const void* send, void* recv, size_t recv_count, DType dtype, ReduceOp op) override;
  Result<CommHandle> AllGatherAsync(const void* send, void* recv, size_t send_count, DType dtype) override;
  // ncclSend/ncclRecv in one group.
  Result<CommHandle> ShiftAsync(const void* send, size_t send_bytes, void* recv, size_t recv_bytes, int distance) override;
  // ncclCommSplit: collective; color < 0 leaves this rank out (null result).
  Result<std::unique_ptr<Communicator>> Split(int color, int key) override;

 private:
  class Handle;
  NcclCommunicator(CudaDevice* device, ncclComm* comm, int rank, int size, const NcclOptions& o);
  Status Init();
  // fn(send, recv, stream) issues the NCCL call. Device buffers: queued, asynchronous. A host buffer:
  // staged through scratch device memory and completed before returning (an empty handle).
  template <class Fn>
  Result<CommHandle> Run(std::string what, const void* send, size_t send_bytes, void* recv, size_t recv_bytes, Fn fn);
  template <class Fn>
  Result<CommHandle> Enqueue(std::string what, Fn fn);
  Status WaitComputeStream();  // host wait that gives up when the watchdog fires
  Status CheckArgs(Collective kind, int64_t count, DType dtype, ReduceOp op, int root);  // CheckCollective over NCCL
  void Abort();  // the watchdog's: once

  CudaDevice* device_;
  ncclComm* comm_;
  int rank_, size_;
  NcclOptions o_;
  CudaStream stream_;
  CudaEvent ready_;  // recorded on the compute stream before each collective
  DeviceBuffer scratch_;  // host-buffer staging
  uint64_t seq_ = 0;      // collectives issued, for messages
  std::timed_mutex call_mu_;  // held around NCCL calls; the abort takes it (or gives up after 1 s)
  std::atomic<bool> aborted_{false};
  std::unique_ptr<Watchdog> watchdog_;  // last: stopped first
};

}  // namespace zrt
