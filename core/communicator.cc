// Communicator helpers shared by every backend.
//
// Argument check protocol: before the real operation every rank contributes its signature (collective
// kind, count, dtype, op, root) to one all-reduce (MAX) over {v, -v}; if max(v) != -max(-v) for any
// field, every rank learns it in the same call and returns InvalidArgument, so no rank enters a
// mismatched collective (which MPI and NCCL leave undefined: hangs, truncation, overruns). The kind is
// part of the signature: an all-reduce facing a reduce-scatter of the same count is refused too.
#include "zrt/core/communicator.h"

#include <algorithm>
#include <cstring>

namespace zrt {

namespace {

std::string_view CollectiveName(int64_t kind) {
  switch (kind) {
    case 1: return "broadcast";
    case 2: return "all_reduce";
    case 3: return "reduce_scatter";
    case 4: return "all_gather";
    case 5: return "shift";
  }
  return "?";
}

}  // namespace

Status Communicator::CheckCollective(Collective kind, int64_t count, DType dtype, ReduceOp op, int root,
                                     const std::function<Status(int64_t* v, int n)>& max_all_reduce) const {
  constexpr int kFields = 5;
  const int64_t mine[kFields] = {static_cast<int64_t>(kind), count, static_cast<int64_t>(dtype), static_cast<int64_t>(op), root};
  int64_t v[2 * kFields];
  for (int i = 0; i < kFields; ++i) {
    v[i] = mine[i];
    v[kFields + i] = -mine[i];
  }
  const std::string_view what = CollectiveName(mine[0]);
  RETURN_IF_ERROR(max_all_reduce(v, 2 * kFields), what, " argument check");
  static constexpr const char* kNames[] = {"collective", "count", "dtype", "op", "root"};
  for (int i = 0; i < kFields; ++i) {
    if (v[i] == -v[kFields + i]) continue;
    if (i == 0) {
      return InvalidArgumentError(what, " on rank ", rank(), " of ", size(), ": ranks disagree on the collective (this rank ",
                                  what, "; the group calls ", CollectiveName(-v[kFields]), " to ", CollectiveName(v[0]), ")");
    }
    return InvalidArgumentError(what, " on rank ", rank(), " of ", size(), ": ranks disagree on ", kNames[i], " (this rank ",
                                mine[i], ", range over ranks [", -v[kFields + i], ", ", v[i], "])");
  }
  return Status();
}

std::string_view ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
  }
  return "invalid";
}

CommHandle& CommHandle::operator=(CommHandle&& o) noexcept {
  if (this != &o) {
    // Waiting on an overwritten handle keeps its buffers from being reused while still in flight.
    if (impl_) Wait().IgnoreError();
    impl_ = std::move(o.impl_);
  }
  return *this;
}

CommHandle::~CommHandle() {
  // The caller dropped the handle; the operation must still finish before its buffers go away.
  if (impl_) Wait().IgnoreError();
}

Status CommHandle::Wait() {
  if (!impl_) return Status();
  Status s = impl_->Wait();
  impl_.reset();
  return s;
}

Result<bool> CommHandle::Test() {
  if (!impl_) return true;
  ASSIGN_OR_RETURN(bool done, impl_->Test());
  if (done) {
    Status s = impl_->Wait();  // completes the bookkeeping (conversions, scaling); returns at once
    impl_.reset();
    RETURN_IF_ERROR(s);
  }
  return done;
}

Status Communicator::AllReduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) {
  ASSIGN_OR_RETURN(CommHandle h, AllReduceAsync(send, recv, count, dtype, op));
  return h.Wait();
}

Status Communicator::ReduceScatter(const void* send, void* recv, size_t recv_count, DType dtype, ReduceOp op) {
  ASSIGN_OR_RETURN(CommHandle h, ReduceScatterAsync(send, recv, recv_count, dtype, op));
  return h.Wait();
}

Status Communicator::AllGather(const void* send, void* recv, size_t send_count, DType dtype) {
  ASSIGN_OR_RETURN(CommHandle h, AllGatherAsync(send, recv, send_count, dtype));
  return h.Wait();
}

Status Communicator::Shift(const void* send, size_t send_bytes, void* recv, size_t recv_bytes, int distance) {
  ASSIGN_OR_RETURN(CommHandle h, ShiftAsync(send, send_bytes, recv, recv_bytes, distance));
  return h.Wait();
}

Status BroadcastStatus(Communicator* comm, const Status& s, int root) {
  char buf[4096] = {};
  if (comm->rank() == root) {
    buf[0] = static_cast<char>(s.code());
    const std::string_view m = s.message();
    if (!m.empty()) std::memcpy(buf + 1, m.data(), std::min(m.size(), sizeof(buf) - 2));  // OK has no text (null data)
  }
  RETURN_IF_ERROR(comm->Broadcast(buf, sizeof(buf), DType::kBytes, root), "sharing a status");
  const auto code = static_cast<StatusCode>(buf[0]);
  return code == StatusCode::kOk ? Status() : Status(code, std::string(buf + 1));
}

Status AgreeOnStatus(Communicator* comm, const Status& local) {
  float failing = local.ok() ? -1.0f : static_cast<float>(comm->rank());
  RETURN_IF_ERROR(comm->AllReduce(&failing, &failing, 1, DType::kF32, ReduceOp::kMax), "agreeing on a status");
  if (failing < 0) return Status();
  const Status s = BroadcastStatus(comm, local, static_cast<int>(failing));
  if (!local.ok()) return local;
  return Status(s.code(), internal::StrCat("failed on rank ", static_cast<int>(failing), ": ", s.message()));
}

}  // namespace zrt
