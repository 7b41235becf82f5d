#include "runtime/core/communicator.h"

namespace zrt {

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

}  // namespace zrt
