#include "runtime/param_gatherer.h"

namespace zrt {

void ParamGatherer::SetGroups(std::vector<GroupRef> groups) {
  groups_ = std::move(groups);
  state_.clear();
  state_.resize(groups_.size());
}

size_t ParamGatherer::Bytes(int g) const {
  const GroupRef& r = groups_[static_cast<size_t>(g)];
  return static_cast<size_t>(r.layout->padded_size()) * DTypeSize(r.dtype);
}

Status ParamGatherer::Start(int g) {
  State& s = state_[static_cast<size_t>(g)];
  const GroupRef& r = groups_[static_cast<size_t>(g)];
  ASSIGN_OR_RETURN(s.buffer, pool_->Acquire(Bytes(g)), "gathering group '", r.name, "'");
  ASSIGN_OR_RETURN(s.handle, comm_->AllGatherAsync(r.shard, s.buffer.data(), static_cast<size_t>(r.layout->shard_size()), r.dtype),
                   "gathering group '", r.name, "'");
  s.phase = Phase::kInFlight;
  live_bytes_ += static_cast<int64_t>(Bytes(g));
  stats_.gather_bytes += static_cast<int64_t>(Bytes(g)) * (comm_->size() - 1) / comm_->size();
  ++stats_.collectives;
  return Status();
}

void ParamGatherer::Prefetch(int g) {
  if (recording_ || order_.empty()) return;
  // Find g at or after the cursor; a call off the recorded order prefetches nothing.
  size_t pos = cursor_;
  while (pos < order_.size() && order_[pos] != g) ++pos;
  if (pos == order_.size()) return;
  cursor_ = pos + 1;
  for (size_t k = cursor_; k < order_.size() && k < cursor_ + static_cast<size_t>(prefetch_depth_); ++k) {
    const int h = order_[k];
    if (state_[static_cast<size_t>(h)].phase != Phase::kReleased) continue;
    if (live_bytes_ + static_cast<int64_t>(Bytes(h)) > max_live_bytes_) break;
    // A failed prefetch is not an error: the Gather that needs it starts (and reports) it again.
    if (!Start(h).ok()) break;
  }
}

Result<void*> ParamGatherer::Gather(int g) {
  if (g < 0 || static_cast<size_t>(g) >= groups_.size()) return NotFoundError("gather: no group with index ", g);
  State& s = state_[static_cast<size_t>(g)];
  if (recording_) order_.push_back(g);
  if (s.phase == Phase::kReleased) RETURN_IF_ERROR(Start(g));
  if (s.phase == Phase::kInFlight) {
    RETURN_IF_ERROR(s.handle.Wait(), "gathering group '", groups_[static_cast<size_t>(g)].name, "'");
    s.phase = Phase::kGathered;
  }
  Prefetch(g);
  return s.buffer.data();
}

Status ParamGatherer::Release(int g) {
  if (g < 0 || static_cast<size_t>(g) >= groups_.size()) return NotFoundError("release: no group with index ", g);
  State& s = state_[static_cast<size_t>(g)];
  if (s.phase != Phase::kGathered) {
    return FailedPreconditionError("release: group '", groups_[static_cast<size_t>(g)].name, "' is not gathered");
  }
  pool_->Release(std::move(s.buffer));
  s.phase = Phase::kReleased;
  live_bytes_ -= static_cast<int64_t>(Bytes(g));
  return Status();
}

Status ParamGatherer::EndStep() {
  Status first;
  for (size_t g = 0; g < state_.size(); ++g) {
    State& s = state_[g];
    if (s.phase == Phase::kInFlight) {  // prefetched but never used
      Status w = s.handle.Wait();
      if (first.ok()) first = w;
      pool_->Release(std::move(s.buffer));
      s.phase = Phase::kReleased;
      live_bytes_ -= static_cast<int64_t>(Bytes(static_cast<int>(g)));
    }
  }
  if (recording_ && !order_.empty()) recording_ = false;
  cursor_ = 0;
  return first;
}

}  // namespace zrt
