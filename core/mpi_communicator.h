// MPI on host buffers: the reference Communicator, and the bootstrap for NCCL.
//
// Thread level: zrt asks MPI for MPI_THREAD_SERIALIZED. The engine calls a communicator from one thread
// at a time (it may be a different thread from call to call, e.g. an offload worker), and background
// threads (checkpoint writer, I/O) never communicate. A trainer that initialises MPI itself must provide
// at least MPI_THREAD_SERIALIZED; MpiSession::Init checks it.
//
// Progress: Open MPI advances non-blocking collectives only inside MPI calls, so the engine overlaps
// communication by calling CommHandle::Test() between pieces of compute.
//
// Counts per call are limited to 2^31-1 elements (MPI's int); the engine's buckets are far smaller.
#pragma once

#include <mpi.h>

#include <memory>
#include <mutex>
#include <vector>

#include "zrt/core/communicator.h"

namespace zrt {

// Owns MPI initialisation: calls MPI_Init_thread (asking for MPI_THREAD_MULTIPLE, needing at least
// SERIALIZED) unless MPI is already initialised (then it only checks the thread level and leaves
// finalisation to whoever initialised it). Also sets the log rank prefix.
class MpiSession {
 public:
  static Result<std::unique_ptr<MpiSession>> Init(int* argc, char*** argv);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }

 private:
  MpiSession() = default;
  bool owns_ = false;
  int world_rank_ = 0;
  int world_size_ = 1;
};

class MpiCommunicator final : public Communicator {
 public:
  // Duplicates `comm` (the trainer keeps using its own), with errors returned instead of aborting.
  static Result<std::unique_ptr<MpiCommunicator>> Create(MPI_Comm comm = MPI_COMM_WORLD);
  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }
  MPI_Comm comm() const { return comm_; }

  Status Barrier() override;
  Status Broadcast(void* buf, size_t count, DType dtype, int root) override;
  Result<CommHandle> AllReduceAsync(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override;
  Result<CommHandle> ReduceScatterAsync(const void* send, void* recv, size_t recv_count, DType dtype,
                                        ReduceOp op) override;
  Result<CommHandle> AllGatherAsync(const void* send, void* recv, size_t send_count, DType dtype) override;
  Result<CommHandle> ShiftAsync(const void* send, size_t send_bytes, void* recv, size_t recv_bytes, int distance) override;
  Status ShiftV(std::span<const ShiftSend> send, std::span<const ShiftRecv> recv, int distance) override;
  Result<CommHandle> AllToAllAsync(const void* send, void* recv, size_t bytes) override;
  Result<std::unique_ptr<Communicator>> Split(int color, int key) override;
  bool concurrent_splits() const override;

  // Reusable f32 staging for bf16/f16 reductions (touching fresh pages costs more than the math).
  // Internal, public for the handles.
  class ScratchPool {
   public:
    std::vector<float> Acquire(size_t elements);
    void Release(std::vector<float> buf);

   private:
    std::mutex mu_;
    std::vector<std::vector<float>> free_;
  };

 private:
  explicit MpiCommunicator(MPI_Comm comm);
  // Verifies that every rank called the same collective with the same arguments (CheckCollective).
  Status CheckArgs(Collective kind, int64_t count, DType dtype, ReduceOp op, int root);
  // bf16/f16 sums and averages move 16-bit values on the wire (half of f32's bytes) and are summed in
  // f32 in rank order by the rank that owns each block, rounded once (mpi_communicator.cc).
  Result<CommHandle> AllReduce16(const void* send, void* recv, size_t count, DType dtype, ReduceOp op);
  // ShiftAsync and ShiftV: one size check for all the pieces, then every piece posted, sends first.
  Result<CommHandle> ShiftPieces(std::span<const ShiftSend> send, std::span<const ShiftRecv> recv, int distance);

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::shared_ptr<ScratchPool> scratch_ = std::make_shared<ScratchPool>();
};

}  // namespace zrt
