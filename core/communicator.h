// Communicator: the collectives the engine needs, over a group of ranks.
//
// Buffers live on the communicator's device (host memory for MPI, device memory for NCCL). Counts
// are in elements of `dtype`. Reductions support f32, bf16 and f16; bf16/f16 sums accumulate in f32
// and are rounded once at the end. kBytes may be broadcast and gathered, never reduced.
//
// Every rank of the group must call the same collectives in the same order with the same counts,
// dtypes and ops (as with MPI/NCCL). With argument checking on (the default) a mismatch is reported as
// InvalidArgument on every rank instead of hanging or corrupting memory; it costs one tiny extra
// all-reduce per collective, and the engine may turn it off on its hot path.
//
// Thread-safety: one thread at a time per communicator (calls are serialized by the caller).
// Asynchronous collectives return a CommHandle; their buffers must stay alive and untouched until
// Wait() returns. Handles must be waited (or destroyed, which waits) before the communicator dies.
#pragma once

#include <cstddef>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "zrt/core/dtype.h"
#include "zrt/core/status.h"

namespace zrt {

enum class ReduceOp : uint8_t { kSum, kAvg, kMax, kMin };
std::string_view ReduceOpName(ReduceOp op);

// A pending asynchronous collective.
class CommHandle {
 public:
  class Impl {
   public:
    virtual ~Impl() = default;
    virtual Status Wait() = 0;
    virtual Result<bool> Test() = 0;
  };
  CommHandle() = default;
  explicit CommHandle(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
  CommHandle(CommHandle&&) noexcept = default;
  CommHandle& operator=(CommHandle&& o) noexcept;
  ~CommHandle();

  // Blocks until the collective finished and its results are in the output buffer. Idempotent.
  // Device buffers (NCCL): the results are there for all work queued afterwards on the device's
  // compute stream; the host does not block (read them back through the device).
  Status Wait();
  // True when finished (results in place; the handle becomes empty). Drives MPI progress, so the
  // engine calls it between pieces of compute. An empty handle reports true.
  Result<bool> Test();
  bool pending() const { return impl_ != nullptr; }

 private:
  std::unique_ptr<Impl> impl_;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "mpi" or "nccl".
  virtual std::string backend() const = 0;

  virtual Status Barrier() = 0;
  virtual Status Broadcast(void* buf, size_t count, DType dtype, int root) = 0;

  // recv[i] = op over ranks of send[i], i < count. send == recv is allowed (in place).
  virtual Result<CommHandle> AllReduceAsync(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) = 0;
  // send holds size() * recv_count elements; rank r receives the reduction of block r. kSum or kAvg.
  virtual Result<CommHandle> ReduceScatterAsync(const void* send, void* recv, size_t recv_count, DType dtype,
                                                ReduceOp op) = 0;
  // recv holds size() * send_count elements; block r comes from rank r. send may alias recv's own block.
  virtual Result<CommHandle> AllGatherAsync(const void* send, void* recv, size_t send_count, DType dtype) = 0;

  // Ring shift: rank r sends `send_bytes` bytes to rank (r + distance) mod size() and receives
  // `recv_bytes` from rank (r - distance) mod size() (the memory tier's replicas). Collective, with the
  // same `distance` on every rank (checked with the other arguments); the sizes may differ between
  // ranks but each pair's must match: every rank first learns whether they do (one tiny exchange and
  // all-reduce), and sizes that disagree anywhere are InvalidArgument on every rank, nothing moved.
  // Either size may be 0. distance = 0 (mod size) copies send to recv.
  virtual Result<CommHandle> ShiftAsync(const void* send, size_t send_bytes, void* recv, size_t recv_bytes, int distance) = 0;

  // All-to-all: `send` holds size() blocks of `bytes` bytes, block r for rank r; `recv` receives
  // size() blocks, block r from rank r. Collective (the size checked with the other arguments).
  // The default posts one ShiftAsync per distance and completes when all have; MpiCommunicator uses
  // MPI_Ialltoall.
  virtual Result<CommHandle> AllToAllAsync(const void* send, void* recv, size_t bytes);

  // Vectored ring shift (blocking): the pieces of `send` go to rank r + distance, in order, into the
  // pieces of `recv` there; those of `recv` come from rank r - distance. Each pair's lists must agree
  // in number and sizes (checked, InvalidArgument on every rank otherwise, nothing moved); a rank with
  // nothing to move passes empty lists. The default checks the lists with one small shift and runs one
  // Shift per piece (as many on every rank); MpiCommunicator posts every piece at once.
  struct ShiftSend {
    const void* data;
    size_t bytes;
  };
  struct ShiftRecv {
    void* data;
    size_t bytes;
  };
  virtual Status ShiftV(std::span<const ShiftSend> send, std::span<const ShiftRecv> recv, int distance);

  // Blocking forms: the asynchronous call followed by Wait().
  Status Shift(const void* send, size_t send_bytes, void* recv, size_t recv_bytes, int distance);
  Status AllReduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op);
  Status ReduceScatter(const void* send, void* recv, size_t recv_count, DType dtype, ReduceOp op);
  Status AllGather(const void* send, void* recv, size_t send_count, DType dtype);

  // Whether a communicator Split from this one may be used from another thread while this one is
  // (MPI_THREAD_MULTIPLE): the memory tier then moves its replicas on a thread of its own.
  virtual bool concurrent_splits() const { return false; }

  // Collective over this group: ranks with the same color form a new group, ordered by (key, rank).
  // A negative color leaves the calling rank out (it receives a null pointer).
  virtual Result<std::unique_ptr<Communicator>> Split(int color, int key) = 0;

  // Whether every collective first verifies that all ranks passed matching arguments.
  void set_check_args(bool on) { check_args_ = on; }
  bool check_args() const { return check_args_; }

 protected:
  enum class Collective : uint8_t { kBroadcast = 1, kAllReduce, kReduceScatter, kAllGather, kShift, kAllToAll };
  // A shift's pieces as their receiver checks them: their number, their total and a hash of their
  // sizes in order (the peers are the job's own ranks: the hash guards against mistakes, not malice).
  struct ShiftShape {
    uint64_t pieces = 0, bytes = 0, hash = 0x9e3779b97f4a7c15;
    void Add(size_t n);
    bool operator==(const ShiftShape&) const = default;
  };
  // The shift's distance as a rank in [0, size()).
  int ShiftTarget(int distance) const { return static_cast<int>(((static_cast<int64_t>(rank()) + distance) % size() + size()) % size()); }
  // The argument check every backend runs before a collective when check_args() is on and the group
  // has more than one rank (protocol in communicator.cc). `max_all_reduce(v, n)` must all-reduce the n
  // int64 values at v in place with MAX over the group, on the host. InvalidArgument on every rank
  // when any rank disagrees on the collective, count, dtype, op or root.
  Status CheckCollective(Collective kind, int64_t count, DType dtype, ReduceOp op, int root,
                         const std::function<Status(int64_t* v, int n)>& max_all_reduce) const;
  bool check_args_ = true;
};

// Collective. Sends `s` (code and message, truncated to 4 KiB) from `root` to every rank.
Status BroadcastStatus(Communicator* comm, const Status& s, int root);
// Collective: OK on every rank if `local` is OK on every rank. Otherwise a failing rank returns its own
// error and the others the highest failing rank's, as "failed on rank r: ...". One all-reduce of a
// float, plus one broadcast on failure.
Status AgreeOnStatus(Communicator* comm, const Status& local);
// Collective: every rank's bytes, by rank (an all-gather of the lengths, then of the bytes padded to
// the longest).
Result<std::vector<std::string>> AllGatherStrings(Communicator* comm, const std::string& mine);

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
