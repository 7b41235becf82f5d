#include "zrt/runtime/param_gatherer.h"

#include <cstring>

#include "zrt/core/base.h"
#include "zrt/kernels/weight_quant.h"

namespace zrt {

void ParamGatherer::SetGroups(std::vector<GroupRef> groups) {
  groups_ = std::move(groups);
  state_.clear();
  state_.resize(groups_.size());
}

size_t ParamGatherer::ShardBytes(int g) const {
  const GroupRef& r = groups_[static_cast<size_t>(g)];
  return static_cast<size_t>(r.layout->shard_size()) * DTypeSize(r.dtype);
}

size_t ParamGatherer::Bytes(int g) const {
  const GroupRef& r = groups_[static_cast<size_t>(g)];
  return static_cast<size_t>(r.layout->padded_size()) * DTypeSize(r.dtype);
}

size_t ParamGatherer::PackedBytes(int g) const {
  const int64_t n = groups_[static_cast<size_t>(g)].layout->shard_size();
  return static_cast<size_t>(AlignUp(kernels::PackedWeightBytes(n, quant_block_), 4));
}

Status ParamGatherer::Decode(int g) {
  State& s = state_[static_cast<size_t>(g)];
  const GroupRef& r = groups_[static_cast<size_t>(g)];
  const int64_t n = r.layout->shard_size();
  const size_t packed = PackedBytes(g), shard = ShardBytes(g);
  for (int q = 0; q < Comm(g)->size(); ++q) {
    kernels::DequantizeWeights(static_cast<const char*>(s.packed_all.data()) + packed * static_cast<size_t>(q), n, quant_block_,
                               static_cast<char*>(s.buffer.data()) + shard * static_cast<size_t>(q), r.dtype);
  }
  return Status();
}

Status ParamGatherer::Load(int g) {
  State& s = state_[static_cast<size_t>(g)];
  const GroupRef& r = groups_[static_cast<size_t>(g)];
  ASSIGN_OR_RETURN(s.shard, load_pool_->Acquire(r.load_bytes), "loading the shard of group '", r.name, "'");
  auto h = r.load(s.shard.data());
  if (!h.ok()) {
    load_pool_->Release(std::move(s.shard));
    return h.status().WithContext("loading the shard of group '" + r.name + "'");
  }
  s.io = std::move(*h);
  s.phase = Phase::kLoading;
  live_bytes_ += static_cast<int64_t>(r.load_bytes);
  return Status();
}

void ParamGatherer::DropShard(int g) {
  State& s = state_[static_cast<size_t>(g)];
  if (!s.packed.empty()) {
    live_bytes_ -= static_cast<int64_t>(PackedBytes(g) * static_cast<size_t>(1 + Comm(g)->size()));
    pool_->Release(std::move(s.packed));
    pool_->Release(std::move(s.packed_all));
  }
  if (!s.device_shard.empty()) {
    live_bytes_ -= static_cast<int64_t>(ShardBytes(g));
    pool_->Release(std::move(s.device_shard));
  }
  if (s.shard.empty()) return;
  live_bytes_ -= static_cast<int64_t>(groups_[static_cast<size_t>(g)].load_bytes);
  load_pool_->Release(std::move(s.shard));
}

Status ParamGatherer::StartFromSecondary(int g) {
  State& s = state_[static_cast<size_t>(g)];
  const GroupRef& r = groups_[static_cast<size_t>(g)];
  if (s.phase == Phase::kLoading) {  // a prefetched read of the shard, not needed now
    (void)s.io.Wait();
    DropShard(g);
  }
  ASSIGN_OR_RETURN(s.buffer, pool_->Acquire(Bytes(g)), "gathering group '", r.name, "'");
  live_bytes_ += static_cast<int64_t>(Bytes(g));
  const int p = node_->size();
  ASSIGN_OR_RETURN(s.handle, node_->AllGatherAsync(s.secondary.data(), s.buffer.data(), static_cast<size_t>(r.layout->padded_size() / p), r.dtype),
                   "gathering group '", r.name, "' in its secondary group");
  s.phase = Phase::kInFlight;
  const int64_t moved = static_cast<int64_t>(Bytes(g)) * (p - 1) / p;
  stats_.gather_bytes += moved;
  stats_.secondary_gather_bytes += moved;
  ++stats_.collectives;
  return Status();
}

Status ParamGatherer::KeepSecondary(int g) {
  State& s = state_[static_cast<size_t>(g)];
  const size_t bytes = Bytes(g) / static_cast<size_t>(node_->size());
  if (s.secondary.empty()) {
    ASSIGN_OR_RETURN(s.secondary, secondary_device_->Allocate(bytes, MemCategory::kParameters), "the secondary shard of group '",
                     groups_[static_cast<size_t>(g)].name, "'");
    secondary_bytes_ += static_cast<int64_t>(bytes);
  }
  std::memcpy(s.secondary.data(), s.buffer.as<char>() + bytes * static_cast<size_t>(node_->rank()), bytes);
  s.secondary_valid = true;
  return Status();
}

void ParamGatherer::DropSecondary() {
  for (State& s : state_) s.secondary_valid = false;
}

Status ParamGatherer::Start(int g) {
  State& s = state_[static_cast<size_t>(g)];
  const GroupRef& r = groups_[static_cast<size_t>(g)];
  if (node_ != nullptr && s.secondary_valid) return StartFromSecondary(g);
  const void* src = r.shard;
  if (r.load) {
    if (s.phase == Phase::kReleased) RETURN_IF_ERROR(Load(g));
    Status read = s.io.Wait();
    if (!read.ok()) {
      DropShard(g);
      s.phase = Phase::kReleased;
      return read.WithContext("loading the shard of group '" + r.name + "'");
    }
    src = s.shard.data();
  }
  if (upload_ != nullptr) {
    const size_t bytes = ShardBytes(g);
    ASSIGN_OR_RETURN(s.device_shard, pool_->Acquire(bytes), "gathering group '", r.name, "'");
    live_bytes_ += static_cast<int64_t>(bytes);
    Status up = upload_->CopyAsync(s.device_shard.data(), src, bytes);
    if (!up.ok()) {
      DropShard(g);
      s.phase = Phase::kReleased;
      return up.WithContext("copying the shard of group '" + r.name + "' to the device");
    }
    src = s.device_shard.data();
  }
  ASSIGN_OR_RETURN(s.buffer, pool_->Acquire(Bytes(g)), "gathering group '", r.name, "'");
  live_bytes_ += static_cast<int64_t>(Bytes(g));
  int64_t moved = static_cast<int64_t>(Bytes(g));
  Communicator* comm = Comm(g);
  if (quant_block_ > 0 && comm->size() > 1) {  // (one rank moves nothing: its shard is the gather, exact)
    const size_t packed = PackedBytes(g);
    auto mine = pool_->Acquire(packed);
    auto all = mine.ok() ? pool_->Acquire(packed * static_cast<size_t>(comm->size())) : Result<DeviceBuffer>(mine.status());
    if (!all.ok()) {
      if (mine.ok()) pool_->Release(std::move(*mine));
      pool_->Release(std::move(s.buffer));
      live_bytes_ -= static_cast<int64_t>(Bytes(g));
      DropShard(g);
      s.phase = Phase::kReleased;
      return all.status().WithContext("gathering group '" + r.name + "' (quantized)");
    }
    s.packed = std::move(*mine);
    s.packed_all = std::move(*all);
    live_bytes_ += static_cast<int64_t>(packed * static_cast<size_t>(1 + comm->size()));
    kernels::QuantizeWeights(src, r.dtype, r.layout->shard_size(), quant_block_, s.packed.data());
    ASSIGN_OR_RETURN(s.handle, comm->AllGatherAsync(s.packed.data(), s.packed_all.data(), packed, DType::kBytes),
                     "gathering group '", r.name, "' (quantized)");
    moved = static_cast<int64_t>(packed) * comm->size();
  } else {
    ASSIGN_OR_RETURN(s.handle, comm->AllGatherAsync(src, s.buffer.data(), static_cast<size_t>(r.layout->shard_size()), r.dtype),
                     "gathering group '", r.name, "'");
  }
  s.phase = Phase::kInFlight;
  stats_.gather_bytes += moved * (comm->size() - 1) / comm->size();
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
  const size_t depth = static_cast<size_t>(prefetch_depth_);
  size_t k = cursor_;
  for (; k < order_.size() && k < cursor_ + depth; ++k) {
    const int h = order_[k];
    const Phase p = state_[static_cast<size_t>(h)].phase;
    if (p != Phase::kReleased && p != Phase::kLoading) continue;
    const size_t shard = p == Phase::kReleased ? groups_[static_cast<size_t>(h)].load_bytes : 0;
    if (live_bytes_ + static_cast<int64_t>(Bytes(h) + shard) > max_live_bytes_) return;
    // A failed prefetch is not an error: the Gather that needs it starts (and reports) it again.
    if (!Start(h).ok()) return;
  }
  // One group further: only its shard's read (no collective), so it is on hand when its turn comes.
  if (depth > 0 && k < order_.size()) {
    const int h = order_[k];
    const GroupRef& r = groups_[static_cast<size_t>(h)];
    if (r.load && state_[static_cast<size_t>(h)].phase == Phase::kReleased && !state_[static_cast<size_t>(h)].secondary_valid &&
        live_bytes_ + static_cast<int64_t>(r.load_bytes) <= max_live_bytes_) {
      (void)Load(h);
    }
  }
}

Result<void*> ParamGatherer::Gather(int g) {
  if (g < 0 || static_cast<size_t>(g) >= groups_.size()) return NotFoundError("gather: no group with index ", g);
  State& s = state_[static_cast<size_t>(g)];
  if (recording_) order_.push_back(g);
  if (s.phase == Phase::kReleased || s.phase == Phase::kLoading) RETURN_IF_ERROR(Start(g));
  if (s.phase == Phase::kInFlight) {
    Status w = s.handle.Wait();
    if (w.ok() && !s.packed.empty()) w = Decode(g);
    DropShard(g);
    if (w.ok() && node_ != nullptr && !s.secondary_valid) w = KeepSecondary(g);
    RETURN_IF_ERROR(w, "gathering group '", groups_[static_cast<size_t>(g)].name, "'");
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
      live_bytes_ -= static_cast<int64_t>(Bytes(static_cast<int>(g)));
    }
    if (s.phase == Phase::kLoading) {
      Status w = s.io.Wait();
      if (first.ok()) first = w;
    }
    if (s.phase == Phase::kInFlight || s.phase == Phase::kLoading) {
      DropShard(static_cast<int>(g));
      s.phase = Phase::kReleased;
    }
  }
  if (recording_ && !order_.empty()) recording_ = false;
  cursor_ = 0;
  DropSecondary();  // the step is about to change the parameters
  return first;
}

}  // namespace zrt
