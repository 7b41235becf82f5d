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

namespace {

// Several pending collectives as one: done when all are.
class AllHandles final : public CommHandle::Impl {
 public:
  explicit AllHandles(std::vector<CommHandle> hs) : hs_(std::move(hs)) {}
  Status Wait() override {
    Status first;
    for (CommHandle& h : hs_) {
      Status s = h.Wait();
      if (first.ok()) first = s;
    }
    return first;
  }
  Result<bool> Test() override {
    bool all = true;
    for (CommHandle& h : hs_) {
      ASSIGN_OR_RETURN(const bool done, h.Test());
      all = all && done;
    }
    return all;
  }

 private:
  std::vector<CommHandle> hs_;
};

}  // namespace

Result<CommHandle> Communicator::AllToAllAsync(const void* send, void* recv, size_t bytes) {
  if (bytes > 0 && (send == nullptr || recv == nullptr)) return InvalidArgumentError("all_to_all: null buffer");
  std::vector<CommHandle> hs;
  for (int d = 0; d < size(); ++d) {  // to rank r + d its block, from rank r - d ours
    const int to = ShiftTarget(d), from = ShiftTarget(-d);
    ASSIGN_OR_RETURN(CommHandle h, ShiftAsync(static_cast<const char*>(send) + bytes * static_cast<size_t>(to), bytes,
                                              static_cast<char*>(recv) + bytes * static_cast<size_t>(from), bytes, d),
                     "all_to_all");
    hs.push_back(std::move(h));
  }
  return CommHandle(std::make_unique<AllHandles>(std::move(hs)));
}

void Communicator::ShiftShape::Add(size_t n) {
  ++pieces;
  bytes += n;
  uint64_t z = hash ^ (n + 0x632be59bd9b4e019 + (hash << 6) + (hash >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9;
  z = (z ^ (z >> 27)) * 0x94d049bb133111eb;
  hash = z ^ (z >> 31);
}

Status Communicator::ShiftV(std::span<const ShiftSend> send, std::span<const ShiftRecv> recv, int distance) {
  ShiftShape out, in, theirs;
  for (const ShiftSend& p : send) out.Add(p.bytes);
  for (const ShiftRecv& p : recv) in.Add(p.bytes);
  RETURN_IF_ERROR(Shift(&out, sizeof(out), &theirs, sizeof(theirs), distance), "shift sizes");
  // Whether every pair agrees, and the most pieces any rank moves (exact in f32: counts of buffers).
  float v[2] = {theirs == in ? 0.0f : 1.0f, static_cast<float>(std::max(send.size(), recv.size()))};
  RETURN_IF_ERROR(AllReduce(v, v, 2, DType::kF32, ReduceOp::kMax), "shift sizes");
  if (!(theirs == in)) {
    return InvalidArgumentError("shift: rank ", ShiftTarget(-distance), " sends ", theirs.bytes, " bytes in ", theirs.pieces, " piece(s), rank ",
                                rank(), " expects ", in.bytes, " in ", in.pieces);
  }
  if (v[0] != 0) return InvalidArgumentError("shift: sizes disagree on another rank");
  for (size_t i = 0; i < static_cast<size_t>(v[1]); ++i) {
    const ShiftSend o = i < send.size() ? send[i] : ShiftSend{nullptr, 0};
    const ShiftRecv r = i < recv.size() ? recv[i] : ShiftRecv{nullptr, 0};
    RETURN_IF_ERROR(Shift(o.data, o.bytes, r.data, r.bytes, distance));
  }
  return Status();
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

Result<std::vector<std::string>> AllGatherStrings(Communicator* comm, const std::string& mine) {
  const auto n = static_cast<size_t>(comm->size());
  std::vector<int64_t> lengths(n);
  const auto length = static_cast<int64_t>(mine.size());
  RETURN_IF_ERROR(comm->AllGather(&length, lengths.data(), sizeof(int64_t), DType::kBytes));
  const int64_t longest = std::max<int64_t>(1, *std::max_element(lengths.begin(), lengths.end()));
  std::string padded = mine;
  padded.resize(static_cast<size_t>(longest));
  std::string all(n * static_cast<size_t>(longest), '\0');
  RETURN_IF_ERROR(comm->AllGather(padded.data(), all.data(), static_cast<size_t>(longest), DType::kBytes));
  std::vector<std::string> out;
  for (size_t r = 0; r < n; ++r) {
    if (lengths[r] < 0 || lengths[r] > longest) return InternalError("gathered length ", lengths[r], " of rank ", r);
    out.push_back(all.substr(r * static_cast<size_t>(longest), static_cast<size_t>(lengths[r])));
  }
  return out;
}

}  // namespace zrt
