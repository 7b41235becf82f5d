// LoopbackCommunicator: the protocol is in the header. Every collective is: check arguments, post,
// barrier, compute into scratch from the posted buffers, barrier, write the result out.
#include "zrt/core/communicator.h"

#include <condition_variable>
#include <mutex>

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <thread>

namespace zrt {

class LoopbackGroup {
 public:
  LoopbackGroup(int size, std::chrono::milliseconds timeout)
      : size_(size), timeout_(timeout), slots_(static_cast<size_t>(size)), split_(static_cast<size_t>(size)) {}
  int size() const { return size_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  // Everyone arrives, or (after the timeout) the group is broken and every call fails.
  Status Barrier() {
    std::unique_lock<std::mutex> lock(mu_);
    if (!broken_.ok()) return broken_;
    const uint64_t gen = generation_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return Status();
    }
    if (!cv_.wait_for(lock, timeout_, [&] { return generation_ != gen || !broken_.ok(); })) {
      broken_ = UnavailableError("loopback communicator: not every rank of ", size_, " reached the collective within ",
                                 timeout_.count(), " ms (did a rank return early?)");
      cv_.notify_all();
    }
    return generation_ != gen ? Status() : broken_;
  }

  // Posts `mine` for `rank` and waits until every rank has posted: then every slot may be read until
  // the matching Depart.
  Status Arrive(int rank, const void* mine) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      slots_[static_cast<size_t>(rank)] = mine;
    }
    return Barrier();
  }
  const void* slot(int r) const { return slots_[static_cast<size_t>(r)]; }
  Status Depart() { return Barrier(); }

  // Split's hand-over of the new groups (one per color, by the color's first rank).
  std::shared_ptr<LoopbackGroup>& split(int r) { return split_[static_cast<size_t>(r)]; }

 private:
  const int size_;
  const std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  Status broken_;
  std::vector<const void*> slots_;  // written under mu_ before a barrier, read after it
  std::vector<std::shared_ptr<LoopbackGroup>> split_;
};

namespace {

struct Args {
  const void* send;
  size_t count;
  DType dtype;
  ReduceOp op;
};

float Load(const void* p, size_t i, DType t) {
  switch (t) {
    case DType::kBF16: return Bf16ToFloat(static_cast<const uint16_t*>(p)[i]);
    case DType::kF16: return F16ToFloat(static_cast<const uint16_t*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

void Store(void* p, size_t i, float x, DType t) {
  switch (t) {
    case DType::kBF16: static_cast<uint16_t*>(p)[i] = FloatToBf16(x); break;
    case DType::kF16: static_cast<uint16_t*>(p)[i] = FloatToF16(x); break;
    default: static_cast<float*>(p)[i] = x; break;
  }
}

float Combine(float a, float b, ReduceOp op) {
  switch (op) {
    case ReduceOp::kMax: return std::max(a, b);
    case ReduceOp::kMin: return std::min(a, b);
    default: return a + b;
  }
}

class DoneHandle final : public CommHandle::Impl {
 public:
  Status Wait() override { return Status(); }
  Result<bool> Test() override { return true; }
};

CommHandle Done() { return CommHandle(std::make_unique<DoneHandle>()); }

}  // namespace

std::vector<std::unique_ptr<LoopbackCommunicator>> LoopbackCommunicator::CreateGroup(int size,
                                                                                     std::chrono::milliseconds timeout) {
  auto group = std::make_shared<LoopbackGroup>(std::max(size, 1), timeout);
  std::vector<std::unique_ptr<LoopbackCommunicator>> out;
  for (int r = 0; r < group->size(); ++r) out.push_back(std::unique_ptr<LoopbackCommunicator>(new LoopbackCommunicator(group, r)));
  return out;
}

LoopbackCommunicator::~LoopbackCommunicator() = default;

int LoopbackCommunicator::size() const { return group_->size(); }

Status LoopbackCommunicator::CheckArgs(Collective kind, int64_t count, DType dtype, ReduceOp op, int root) {
  if (!check_args_ || size() == 1) return Status();
  return CheckCollective(kind, count, dtype, op, root, [this](int64_t* v, int n) -> Status {
    RETURN_IF_ERROR(group_->Arrive(rank_, v));
    std::vector<int64_t> max(v, v + n);
    for (int r = 0; r < size(); ++r) {
      const auto* o = static_cast<const int64_t*>(group_->slot(r));
      for (int i = 0; i < n; ++i) max[static_cast<size_t>(i)] = std::max(max[static_cast<size_t>(i)], o[i]);
    }
    RETURN_IF_ERROR(group_->Depart());
    std::copy(max.begin(), max.end(), v);
    return Status();
  });
}

Status LoopbackCommunicator::Barrier() { return group_->Barrier(); }

Status LoopbackCommunicator::Broadcast(void* buf, size_t count, DType dtype, int root) {
  if (root < 0 || root >= size()) return InvalidArgumentError("broadcast: root ", root, " outside [0, ", size(), ")");
  if (count > 0 && buf == nullptr) return InvalidArgumentError("broadcast: null buffer");
  RETURN_IF_ERROR(CheckArgs(Collective::kBroadcast, static_cast<int64_t>(count), dtype, ReduceOp::kSum, root));
  const size_t bytes = count * DTypeSize(dtype);
  RETURN_IF_ERROR(group_->Arrive(rank_, buf));
  std::vector<char> scratch(static_cast<const char*>(group_->slot(root)), static_cast<const char*>(group_->slot(root)) + bytes);
  RETURN_IF_ERROR(group_->Depart());
  if (rank_ != root && bytes != 0) std::memcpy(buf, scratch.data(), bytes);
  return Status();
}

Result<CommHandle> LoopbackCommunicator::AllReduceAsync(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) {
  if (!IsFloating(dtype)) return InvalidArgumentError("all_reduce: dtype ", DTypeName(dtype), " cannot be reduced");
  if (count > 0 && (send == nullptr || recv == nullptr)) return InvalidArgumentError("all_reduce: null buffer");
  RETURN_IF_ERROR(CheckArgs(Collective::kAllReduce, static_cast<int64_t>(count), dtype, op, 0));
  const Args mine{send, count, dtype, op};
  RETURN_IF_ERROR(group_->Arrive(rank_, &mine));
  std::vector<float> acc(count);
  for (int r = 0; r < size(); ++r) {
    const auto* a = static_cast<const Args*>(group_->slot(r));
    for (size_t i = 0; i < count; ++i) {
      const float x = Load(a->send, i, dtype);
      acc[i] = r == 0 ? x : Combine(acc[i], x, op);
    }
  }
  RETURN_IF_ERROR(group_->Depart());
  const float n = static_cast<float>(size());
  for (size_t i = 0; i < count; ++i) Store(recv, i, op == ReduceOp::kAvg ? acc[i] / n : acc[i], dtype);
  return Done();
}

Result<CommHandle> LoopbackCommunicator::ReduceScatterAsync(const void* send, void* recv, size_t recv_count, DType dtype,
                                                            ReduceOp op) {
  if (op != ReduceOp::kSum && op != ReduceOp::kAvg) {
    return InvalidArgumentError("reduce_scatter: op ", ReduceOpName(op), " unsupported (sum or avg)");
  }
  if (!IsFloating(dtype)) return InvalidArgumentError("reduce_scatter: dtype ", DTypeName(dtype), " cannot be reduced");
  if (recv_count > 0 && (send == nullptr || recv == nullptr)) return InvalidArgumentError("reduce_scatter: null buffer");
  RETURN_IF_ERROR(CheckArgs(Collective::kReduceScatter, static_cast<int64_t>(recv_count), dtype, op, 0));
  const Args mine{send, recv_count, dtype, op};
  RETURN_IF_ERROR(group_->Arrive(rank_, &mine));
  std::vector<float> acc(recv_count);
  const size_t base = static_cast<size_t>(rank_) * recv_count;
  for (int r = 0; r < size(); ++r) {
    const auto* a = static_cast<const Args*>(group_->slot(r));
    for (size_t i = 0; i < recv_count; ++i) {
      const float x = Load(a->send, base + i, dtype);
      acc[i] = r == 0 ? x : acc[i] + x;
    }
  }
  RETURN_IF_ERROR(group_->Depart());
  const float n = static_cast<float>(size());
  for (size_t i = 0; i < recv_count; ++i) Store(recv, i, op == ReduceOp::kAvg ? acc[i] / n : acc[i], dtype);
  return Done();
}

Result<CommHandle> LoopbackCommunicator::AllGatherAsync(const void* send, void* recv, size_t send_count, DType dtype) {
  if (send_count > 0 && (send == nullptr || recv == nullptr)) return InvalidArgumentError("all_gather: null buffer");
  RETURN_IF_ERROR(CheckArgs(Collective::kAllGather, static_cast<int64_t>(send_count), dtype, ReduceOp::kSum, 0));
  const size_t block = send_count * DTypeSize(dtype);
  const Args mine{send, send_count, dtype, ReduceOp::kSum};
  RETURN_IF_ERROR(group_->Arrive(rank_, &mine));
  std::vector<char> scratch(block * static_cast<size_t>(size()));
  for (int r = 0; r < size() && block != 0; ++r) {
    std::memcpy(scratch.data() + static_cast<size_t>(r) * block, static_cast<const Args*>(group_->slot(r))->send, block);
  }
  RETURN_IF_ERROR(group_->Depart());
  if (!scratch.empty()) std::memcpy(recv, scratch.data(), scratch.size());
  return Done();
}

Result<CommHandle> LoopbackCommunicator::ShiftAsync(const void* send, size_t send_bytes, void* recv, size_t recv_bytes,
                                                    int distance) {
  if ((send_bytes > 0 && send == nullptr) || (recv_bytes > 0 && recv == nullptr)) return InvalidArgumentError("shift: null buffer");
  const int n = size(), d = (ShiftTarget(distance) - rank_ + n) % n, from = ShiftTarget(-distance);
  RETURN_IF_ERROR(CheckArgs(Collective::kShift, 0, DType::kBytes, ReduceOp::kSum, d));
  struct Posted {
    const void* send;
    size_t send_bytes, recv_bytes;
  };
  const Posted mine{send, send_bytes, recv_bytes};
  RETURN_IF_ERROR(group_->Arrive(rank_, &mine));
  // Every pair checked on every rank: sizes that disagree anywhere fail the shift everywhere.
  Status s;
  for (int r = 0; r < n && s.ok(); ++r) {
    const auto* rx = static_cast<const Posted*>(group_->slot(r));
    const auto* tx = static_cast<const Posted*>(group_->slot((r - d + n) % n));
    if (tx->send_bytes != rx->recv_bytes) {
      s = InvalidArgumentError("shift: rank ", (r - d + n) % n, " sends ", tx->send_bytes, " bytes, rank ", r, " expects ", rx->recv_bytes);
    }
  }
  std::vector<char> scratch;
  if (s.ok() && recv_bytes != 0) {
    const auto* tx = static_cast<const Posted*>(group_->slot(from));
    scratch.assign(static_cast<const char*>(tx->send), static_cast<const char*>(tx->send) + recv_bytes);
  }
  RETURN_IF_ERROR(group_->Depart());
  RETURN_IF_ERROR(s);
  if (!scratch.empty()) std::memcpy(recv, scratch.data(), scratch.size());
  return Done();
}

Result<std::unique_ptr<Communicator>> LoopbackCommunicator::Split(int color, int key) {
  const int64_t mine[2] = {color, key};
  RETURN_IF_ERROR(group_->Arrive(rank_, mine));
  // The members of this rank's color, ordered by (key, rank).
  std::vector<std::pair<int64_t, int>> members;
  for (int r = 0; r < size(); ++r) {
    const auto* o = static_cast<const int64_t*>(group_->slot(r));
    if (color >= 0 && o[0] == color) members.emplace_back(o[1], r);
  }
  RETURN_IF_ERROR(group_->Depart());
  std::sort(members.begin(), members.end());
  const int leader = members.empty() ? -1 : members.front().second;
  if (leader == rank_) group_->split(rank_) = std::make_shared<LoopbackGroup>(static_cast<int>(members.size()), group_->timeout());
  RETURN_IF_ERROR(group_->Barrier());  // the new groups are posted
  std::shared_ptr<LoopbackGroup> g = leader >= 0 ? group_->split(leader) : nullptr;
  RETURN_IF_ERROR(group_->Barrier());  // everyone has taken theirs
  if (leader == rank_) group_->split(rank_).reset();
  if (!g) return std::unique_ptr<Communicator>();
  int new_rank = 0;
  while (members[static_cast<size_t>(new_rank)].second != rank_) ++new_rank;
  auto c = std::unique_ptr<LoopbackCommunicator>(new LoopbackCommunicator(std::move(g), new_rank));
  c->set_check_args(check_args_);
  return std::unique_ptr<Communicator>(std::move(c));
}

Status RunLoopbackRanks(int size, const std::function<Status(Communicator& comm)>& fn, std::chrono::milliseconds timeout) {
  auto comms = LoopbackCommunicator::CreateGroup(size, timeout);
  std::vector<Status> results(comms.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < comms.size(); ++r) {
    threads.emplace_back([&, r] { results[r] = fn(*comms[r]); });
    pthread_setname_np(threads.back().native_handle(), ("zrt-rank" + std::to_string(r)).c_str());
  }
  for (std::thread& t : threads) t.join();
  for (size_t r = 0; r < results.size(); ++r) {
    if (!results[r].ok()) return results[r].WithContext("rank " + std::to_string(r));
  }
  return Status();
}

}  // namespace zrt
