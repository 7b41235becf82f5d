// NCCL communicator (see nccl_communicator.h).
#include "zrt/core/nccl_communicator.h"

#include "zrt/core/watchdog.h"
#include "zrt/core/base.h"

#include <nccl.h>

#include <chrono>
#include <thread>

#include "zrt/core/cuda_status.h"
#include "zrt/core/logging.h"

namespace zrt {
namespace {

Result<ncclDataType_t> NcclType(DType t) {
  switch (t) {
    case DType::kF32: return ncclFloat32;
    case DType::kBF16: return ncclBfloat16;
    case DType::kF16: return ncclFloat16;
    case DType::kBytes: return ncclUint8;
  }
  return InvalidArgumentError("invalid dtype");
}

Result<ncclRedOp_t> NcclOp(ReduceOp op, DType t) {
  if (t == DType::kBytes) return InvalidArgumentError("bytes cannot be reduced");
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAvg: return ncclAvg;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
  }
  return InvalidArgumentError("invalid reduce op");
}

bool OnDevice(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}


}  // namespace

// A queued collective: its completion event, and the communicator whose compute stream waits for it.
class NcclCommunicator::Handle final : public CommHandle::Impl {
 public:
  Handle(NcclCommunicator* c, std::shared_ptr<CudaEvent> done) : c_(c), done_(std::move(done)) {}
  Status Wait() override {
    RETURN_IF_ERROR(c_->error());
    return done_->MakeWait(c_->device_->stream());
  }
  Result<bool> Test() override {
    RETURN_IF_ERROR(c_->error());
    return done_->Done();  // when true, CommHandle::Test calls Wait, which orders the compute stream
  }

 private:
  NcclCommunicator* c_;
  std::shared_ptr<CudaEvent> done_;
};

NcclCommunicator::NcclCommunicator(CudaDevice* device, ncclComm* comm, int rank, int size, const NcclOptions& o)
    : device_(device), comm_(comm), rank_(rank), size_(size), o_(o) {}

Status NcclCommunicator::Init() {
  ASSIGN_OR_RETURN(stream_, CudaStream::Create(), "nccl communicator");
  ASSIGN_OR_RETURN(ready_, CudaEvent::Create(), "nccl communicator");
  Watchdog::Options w;
  w.timeout = std::chrono::milliseconds(static_cast<int64_t>(o_.timeout_seconds * 1000));
  w.name = internal::StrCat("nccl communicator (rank ", rank_, " of ", size_, ", ", device_->name(), ")");
  w.thread_init = [d = device_] { (void)d->MakeCurrent(); };
  w.check = [this]() -> Status {
    ncclResult_t async = ncclSuccess;
    RETURN_IF_ERROR(NcclStatus(ncclCommGetAsyncError(comm_, &async), "ncclCommGetAsyncError"));
    return NcclStatus(async, "asynchronous NCCL error");
  };
  w.abort = [this] { Abort(); };
  watchdog_ = std::make_unique<Watchdog>(std::move(w));
  return Status();
}

Result<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(Communicator* bootstrap, CudaDevice* device,
                                                                   const NcclOptions& o) {
  if (bootstrap == nullptr || device == nullptr) return InvalidArgumentError("nccl communicator: null bootstrap or device");
  if (!(o.timeout_seconds > 0)) return InvalidArgumentError("nccl communicator: timeout_seconds must be > 0");
  RETURN_IF_ERROR(device->MakeCurrent());
  ncclUniqueId id{};
  Status made;
  if (bootstrap->rank() == 0) made = NcclStatus(ncclGetUniqueId(&id), "ncclGetUniqueId");
  RETURN_IF_ERROR(BroadcastStatus(bootstrap, made, 0), "nccl communicator");
  RETURN_IF_ERROR(bootstrap->Broadcast(&id, sizeof(id), DType::kBytes, 0), "nccl communicator: broadcasting the unique id");
  ncclComm_t comm = nullptr;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 1;
  Status init = NcclStatus(ncclCommInitRankConfig(&comm, bootstrap->size(), id, bootstrap->rank(), &config),
                           "ncclCommInitRankConfig");
  if (!init.ok()) {
    init = init.WithContext(internal::StrCat("nccl communicator: rank ", bootstrap->rank(), " of ", bootstrap->size(), " on ",
                                             device->name(), " (NCCL needs a distinct GPU per rank)"));
  }
  Status all = AgreeOnStatus(bootstrap, init);
  if (!all.ok()) {
    if (comm != nullptr) (void)ncclCommDestroy(comm);
    return all;
  }
  std::unique_ptr<NcclCommunicator> c(new NcclCommunicator(device, comm, bootstrap->rank(), bootstrap->size(), o));
  RETURN_IF_ERROR(c->Init());
  return c;
}

NcclCommunicator::~NcclCommunicator() {
  // Pending collectives finish, or the watchdog aborts them after the timeout; then it stops (joining
  // an abort in progress) and a healthy communicator is destroyed.
  while (watchdog_ && watchdog_->error().ok() && watchdog_->pending() > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  watchdog_.reset();
  if (!aborted_.exchange(true) && comm_ != nullptr) {
    (void)device_->MakeCurrent();
    (void)ncclCommDestroy(comm_);
  }
}

void NcclCommunicator::Abort() {
  if (aborted_.exchange(true)) return;
  // Normally the issuing thread is not inside NCCL; if it is stuck there, abort anyway to free it.
  const bool locked = call_mu_.try_lock_for(std::chrono::seconds(1));
  (void)ncclCommAbort(comm_);
  if (locked) call_mu_.unlock();
}

template <class Fn>
Result<CommHandle> NcclCommunicator::Enqueue(std::string what, Fn fn) {
  RETURN_IF_ERROR(error());
  std::lock_guard<std::timed_mutex> lock(call_mu_);
  if (aborted_) return error();
  RETURN_IF_ERROR(device_->MakeCurrent());
  RETURN_IF_ERROR(ready_.Record(device_->stream()), what);
  RETURN_IF_ERROR(ready_.MakeWait(stream_), what);
  RETURN_IF_ERROR(NcclStatus(fn(stream_.get()), what), "rank ", rank_, " of ", size_);
  auto done = std::make_shared<CudaEvent>();
  ASSIGN_OR_RETURN(*done, CudaEvent::Create(), what);
  RETURN_IF_ERROR(done->Record(stream_), what);
  watchdog_->Track(std::move(what), [done] { return done->Done(); });
  return CommHandle(std::make_unique<Handle>(this, std::move(done)));
}

Status NcclCommunicator::WaitComputeStream() {
  for (;;) {
    const cudaError_t e = cudaStreamQuery(device_->stream());
    if (e == cudaSuccess) return Status();
    if (e != cudaErrorNotReady) return CudaStatus(e, "nccl communicator: waiting for the compute stream");
    (void)cudaGetLastError();
    RETURN_IF_ERROR(error());
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

template <class Fn>
Result<CommHandle> NcclCommunicator::Run(std::string what, const void* send, size_t send_bytes, void* recv, size_t recv_bytes,
                                         Fn fn) {
  const bool send_dev = send_bytes == 0 || OnDevice(send), recv_dev = recv_bytes == 0 || OnDevice(recv);
  if (send_dev && recv_dev) return Enqueue(std::move(what), [&](cudaStream_t s) { return fn(send, recv, s); });
  // Host memory: through scratch device memory, on the compute stream, completed here.
  const bool in_place = send == recv;
  const size_t need = static_cast<size_t>(AlignUp(static_cast<int64_t>(send_bytes), 256)) + recv_bytes;
  if (scratch_.size() < need) {
    scratch_.Reset();
    ASSIGN_OR_RETURN(scratch_, device_->Allocate(need, MemCategory::kCommunication), what, ": host-buffer staging");
  }
  const cudaStream_t cs = device_->stream();
  const void* dsend = send;
  if (!send_dev) {
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(scratch_.data(), send, send_bytes, cudaMemcpyHostToDevice, cs));
    dsend = scratch_.data();
  }
  void* drecv = recv;
  if (!recv_dev) drecv = in_place ? scratch_.data() : scratch_.as<char>() + static_cast<size_t>(AlignUp(static_cast<int64_t>(send_bytes), 256));
  ASSIGN_OR_RETURN(CommHandle h, Enqueue(what, [&](cudaStream_t s) { return fn(dsend, drecv, s); }));
  RETURN_IF_ERROR(h.Wait(), what);
  if (!recv_dev) CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(recv, drecv, recv_bytes, cudaMemcpyDeviceToHost, cs));
  RETURN_IF_ERROR(WaitComputeStream(), what);
  return CommHandle();
}

Status NcclCommunicator::CheckArgs(Collective kind, int64_t count, DType dtype, ReduceOp op, int root) {
  if (!check_args_ || size_ == 1) return Status();
  return CheckCollective(kind, count, dtype, op, root, [this](int64_t* v, int n) -> Status {
    const size_t bytes = static_cast<size_t>(n) * sizeof(int64_t);
    ASSIGN_OR_RETURN(CommHandle h, Run("argument check", v, bytes, v, bytes, [this, n](const void* s, void* r, cudaStream_t st) {
                       return ncclAllReduce(s, r, static_cast<size_t>(n), ncclInt64, ncclMax, comm_, st);
                     }));
    return h.Wait();
  });
}

Status NcclCommunicator::Barrier() {
  float x = 0;
  ASSIGN_OR_RETURN(CommHandle h, Run("barrier", &x, sizeof(x), &x, sizeof(x), [this](const void* s, void* r, cudaStream_t st) {
                     return ncclAllReduce(s, r, 1, ncclFloat32, ncclSum, comm_, st);
                   }));
  return h.Wait();
}

Status NcclCommunicator::Broadcast(void* buf, size_t count, DType dtype, int root) {
  if (root < 0 || root >= size_) return InvalidArgumentError("broadcast: root ", root, " outside [0, ", size_, ")");
  if (count > 0 && buf == nullptr) return InvalidArgumentError("broadcast: null buffer");
  ASSIGN_OR_RETURN(ncclDataType_t t, NcclType(dtype), "broadcast");
  RETURN_IF_ERROR(CheckArgs(Collective::kBroadcast, static_cast<int64_t>(count), dtype, ReduceOp::kSum, root));
  const size_t bytes = count * DTypeSize(dtype);
  ASSIGN_OR_RETURN(CommHandle h, Run(internal::StrCat("broadcast #", ++seq_, " (", count, " x ", DTypeName(dtype), ")"), buf,
                                     bytes, buf, bytes, [&](const void* s, void* r, cudaStream_t st) {
                                       return ncclBroadcast(s, r, count, t, root, comm_, st);
                                     }));
  // Broadcast is blocking in the Communicator contract: the data is there for the host or, on the
  // device, for everything queued next on the compute stream.
  return h.Wait();
}

Result<CommHandle> NcclCommunicator::AllReduceAsync(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) {
  if (count > 0 && (send == nullptr || recv == nullptr)) return InvalidArgumentError("all_reduce: null buffer");
  ASSIGN_OR_RETURN(ncclDataType_t t, NcclType(dtype), "all_reduce");
  ASSIGN_OR_RETURN(ncclRedOp_t o, NcclOp(op, dtype), "all_reduce");
  RETURN_IF_ERROR(CheckArgs(Collective::kAllReduce, static_cast<int64_t>(count), dtype, op, 0));
  const size_t bytes = count * DTypeSize(dtype);
  return Run(internal::StrCat("all_reduce #", ++seq_, " (", count, " x ", DTypeName(dtype), ", ", ReduceOpName(op), ")"), send,
             bytes, recv, bytes, [&](const void* s, void* r, cudaStream_t st) {
               return ncclAllReduce(s, r, count, t, o, comm_, st);
             });
}

Result<CommHandle> NcclCommunicator::ReduceScatterAsync(const void* send, void* recv, size_t recv_count, DType dtype,
                                                        ReduceOp op) {
  if (op != ReduceOp::kSum && op != ReduceOp::kAvg) return InvalidArgumentError("reduce_scatter: op must be sum or avg");
  if (recv_count > 0 && (send == nullptr || recv == nullptr)) return InvalidArgumentError("reduce_scatter: null buffer");
  ASSIGN_OR_RETURN(ncclDataType_t t, NcclType(dtype), "reduce_scatter");
  ASSIGN_OR_RETURN(ncclRedOp_t o, NcclOp(op, dtype), "reduce_scatter");
  RETURN_IF_ERROR(CheckArgs(Collective::kReduceScatter, static_cast<int64_t>(recv_count), dtype, op, 0));
  const size_t bytes = recv_count * DTypeSize(dtype);
  return Run(internal::StrCat("reduce_scatter #", ++seq_, " (", recv_count, " x ", DTypeName(dtype), " per rank)"), send,
             bytes * static_cast<size_t>(size_), recv, bytes, [&](const void* s, void* r, cudaStream_t st) {
               return ncclReduceScatter(s, r, recv_count, t, o, comm_, st);
             });
}

Result<CommHandle> NcclCommunicator::AllGatherAsync(const void* send, void* recv, size_t send_count, DType dtype) {
  if (send_count > 0 && (send == nullptr || recv == nullptr)) return InvalidArgumentError("all_gather: null buffer");
  ASSIGN_OR_RETURN(ncclDataType_t t, NcclType(dtype), "all_gather");
  RETURN_IF_ERROR(CheckArgs(Collective::kAllGather, static_cast<int64_t>(send_count), dtype, ReduceOp::kSum, 0));
  const size_t bytes = send_count * DTypeSize(dtype);
  return Run(internal::StrCat("all_gather #", ++seq_, " (", send_count, " x ", DTypeName(dtype), " per rank)"), send, bytes,
             recv, bytes * static_cast<size_t>(size_), [&](const void* s, void* r, cudaStream_t st) {
               return ncclAllGather(s, r, send_count, t, comm_, st);
             });
}

Result<CommHandle> NcclCommunicator::ShiftAsync(const void* send, size_t send_bytes, void* recv, size_t recv_bytes, int distance) {
  if ((send_bytes > 0 && send == nullptr) || (recv_bytes > 0 && recv == nullptr)) return InvalidArgumentError("shift: null buffer");
  const int to = ShiftTarget(distance), from = ShiftTarget(-distance);
  RETURN_IF_ERROR(CheckArgs(Collective::kShift, 0, DType::kBytes, ReduceOp::kSum, (to - rank_ + size_) % size_));
  if (to == rank_) {
    if (send_bytes != recv_bytes) return InvalidArgumentError("shift to itself: ", send_bytes, " bytes sent, ", recv_bytes, " expected");
    if (send_bytes == 0 || send == recv) return CommHandle();
  }
  {  // The sizes first: any pair that disagrees fails the shift on every rank before a byte of it moves.
    int64_t sizes[2] = {static_cast<int64_t>(send_bytes), -1};
    ASSIGN_OR_RETURN(CommHandle h, Run("shift sizes", &sizes[0], 8, &sizes[1], 8, [&](const void* s, void* r, cudaStream_t st) -> ncclResult_t {
                       ncclResult_t e = ncclGroupStart();
                       if (e == ncclSuccess) e = ncclSend(s, 1, ncclInt64, to, comm_, st);
                       if (e == ncclSuccess) e = ncclRecv(r, 1, ncclInt64, from, comm_, st);
                       const ncclResult_t end = ncclGroupEnd();
                       return e != ncclSuccess ? e : end;
                     }));
    RETURN_IF_ERROR(h.Wait());
    int64_t bad[2] = {sizes[1] != static_cast<int64_t>(recv_bytes) ? rank_ : -1, 0};
    ASSIGN_OR_RETURN(CommHandle a, Run("shift sizes", bad, 16, bad, 16, [&](const void* s, void* r, cudaStream_t st) {
                       return ncclAllReduce(s, r, 2, ncclInt64, ncclMax, comm_, st);
                     }));
    RETURN_IF_ERROR(a.Wait());
    if (bad[0] == rank_) return InvalidArgumentError("shift: rank ", from, " sends ", sizes[1], " bytes, rank ", rank_, " expects ", recv_bytes);
    if (bad[0] >= 0) return InvalidArgumentError("shift: sizes disagree on rank ", bad[0]);
  }
  return Run(internal::StrCat("shift #", ++seq_, " (", send_bytes, " bytes to rank ", to, ", ", recv_bytes, " from rank ", from, ")"),
             send, send_bytes, recv, recv_bytes, [&](const void* s, void* r, cudaStream_t st) -> ncclResult_t {
               ncclResult_t e = ncclGroupStart();
               if (e != ncclSuccess) return e;
               if (send_bytes > 0) e = ncclSend(s, send_bytes, ncclInt8, to, comm_, st);
               if (e == ncclSuccess && recv_bytes > 0) e = ncclRecv(r, recv_bytes, ncclInt8, from, comm_, st);
               const ncclResult_t end = ncclGroupEnd();
               return e != ncclSuccess ? e : end;
             });
}

Result<std::unique_ptr<Communicator>> NcclCommunicator::Split(int color, int key) {
  RETURN_IF_ERROR(error());
  ncclComm_t out = nullptr;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 1;
  {
    std::lock_guard<std::timed_mutex> lock(call_mu_);
    RETURN_IF_ERROR(device_->MakeCurrent());
    RETURN_IF_ERROR(WaitComputeStream(), "split");
    RETURN_IF_ERROR(NcclStatus(ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &out, &config), "ncclCommSplit"),
                    "split on rank ", rank_);
  }
  if (out == nullptr) return std::unique_ptr<Communicator>();
  int rank = 0, size = 0;
  Status s = NcclStatus(ncclCommUserRank(out, &rank), "ncclCommUserRank");
  if (s.ok()) s = NcclStatus(ncclCommCount(out, &size), "ncclCommCount");
  if (!s.ok()) {
    (void)ncclCommDestroy(out);
    return s;
  }
  std::unique_ptr<NcclCommunicator> c(new NcclCommunicator(device_, out, rank, size, o_));
  RETURN_IF_ERROR(c->Init());
  c->set_check_args(check_args_);
  return std::unique_ptr<Communicator>(std::move(c));
}

Status NcclCommunicator::error() const { return watchdog_->error(); }

}  // namespace zrt
