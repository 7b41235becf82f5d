// LoopbackCommunicator: N ranks in one process, one thread each, over host memory. The collectives
// of Communicator with the same semantics as MpiCommunicator (f32 accumulation for bf16/f16, the
// argument check), so unit tests of multi-rank components run without mpirun and under TSan.
//
//   Status s = RunLoopbackRanks(3, [&](Communicator& comm) { ... one rank's code ... });
//
// Protocol of a collective: each rank posts its arguments and buffers in its slot, all meet at a
// barrier, each computes its result into private scratch reading the others' send buffers, all meet
// again (nobody writes a buffer another may still read), then each copies its result out. Every
// collective completes before it returns (the handles are already done); results do not depend on
// thread timing (reductions run in rank order). A rank that does not arrive within the group's
// timeout makes the others fail with Unavailable instead of hanging (a test's rank that returned early).
//
// Thread-safety: one thread per rank's communicator, as for MPI.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "zrt/core/communicator.h"

namespace zrt {

class LoopbackGroup;

class LoopbackCommunicator final : public Communicator {
 public:
  // The communicators of a new group of `size` ranks (index = rank). Each is used by one thread.
  static std::vector<std::unique_ptr<LoopbackCommunicator>> CreateGroup(
      int size, std::chrono::milliseconds timeout = std::chrono::seconds(60));
  ~LoopbackCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override;
  std::string backend() const override { return "loopback"; }

  Status Barrier() override;
  Status Broadcast(void* buf, size_t count, DType dtype, int root) override;
  Result<CommHandle> AllReduceAsync(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override;
  Result<CommHandle> ReduceScatterAsync(const void* send, void* recv, size_t recv_count, DType dtype, ReduceOp op) override;
  Result<CommHandle> AllGatherAsync(const void* send, void* recv, size_t send_count, DType dtype) override;
  Result<CommHandle> ShiftAsync(const void* send, size_t send_bytes, void* recv, size_t recv_bytes, int distance) override;
  Result<std::unique_ptr<Communicator>> Split(int color, int key) override;

 private:
  LoopbackCommunicator(std::shared_ptr<LoopbackGroup> group, int rank) : group_(std::move(group)), rank_(rank) {}
  Status CheckArgs(Collective kind, int64_t count, DType dtype, ReduceOp op, int root);
  std::shared_ptr<LoopbackGroup> group_;
  int rank_;
};

// Runs fn(comm) on `size` threads, one rank each, and returns when all are done: OK, or the first
// failing rank's status (prefixed "rank r: "). fn's own status is its rank's.
Status RunLoopbackRanks(int size, const std::function<Status(Communicator& comm)>& fn,
                        std::chrono::milliseconds timeout = std::chrono::seconds(60));

}  // namespace zrt
