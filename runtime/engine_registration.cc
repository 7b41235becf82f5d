// EngineCore's registration checks (engine_core.h): every rank registered the same parameters over
// the engine's group, each data-parallel group of their own its same tensors (docs/engine.md
// "Tensors with their own data-parallel group"), and what such groups do not combine with. The
// registration itself and Finalize are engine.cc's.
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "zrt/runtime/engine_core.h"
#include "zrt/runtime/engine_internal.h"

namespace zrt {

namespace {

uint64_t Fnv(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

uint64_t SpecHash(const TensorSpec& s, const std::string& group, double lr_scale, double weight_decay, char frozen,
                  const StatePrecision& state) {
  uint64_t h = 1469598103934665603ull;
  h = Fnv(h, &frozen, 1);
  const int64_t st[] = {static_cast<int64_t>(state.exp_avg), static_cast<int64_t>(state.exp_avg_sq), state.master ? 1 : 0, state.q8_block};
  h = Fnv(h, st, sizeof(st));
  h = Fnv(h, s.name.data(), s.name.size());
  h = Fnv(h, s.shape.data(), s.shape.size() * sizeof(int64_t));
  h = Fnv(h, &s.dtype, sizeof(s.dtype));
  h = Fnv(h, &lr_scale, sizeof(lr_scale));
  h = Fnv(h, &weight_decay, sizeof(weight_decay));
  return Fnv(h, group.data(), group.size());
}

// The tensors `idx` of this rank against those of rank 0 of `c` (count first, then one hash per
// tensor); `whose` says which tensors in the errors.
Status CheckSameTensors(Communicator* c, const std::vector<size_t>& idx, const std::vector<uint64_t>& hash,
                        const std::function<std::string(size_t)>& describe, const std::string& whose) {
  int64_t count = static_cast<int64_t>(idx.size());
  int64_t root_count = count;
  RETURN_IF_ERROR(c->Broadcast(&root_count, sizeof(root_count), DType::kBytes, 0));
  float mismatch = root_count == count ? 0.0f : 1.0f;
  RETURN_IF_ERROR(c->AllReduce(&mismatch, &mismatch, 1, DType::kF32, ReduceOp::kMax));
  if (mismatch != 0) {
    return InvalidArgumentError("finalize: ranks registered different numbers of ", whose, " (rank 0", whose == "parameters" ? "" : " of that group",
                                ": ", root_count, ", rank ", c->rank(), ": ", count, ")");
  }
  std::vector<uint64_t> mine(idx.size()), root(idx.size());
  for (size_t k = 0; k < idx.size(); ++k) mine[k] = root[k] = hash[idx[k]];
  RETURN_IF_ERROR(c->Broadcast(root.data(), root.size() * sizeof(uint64_t), DType::kBytes, 0));
  size_t first = idx.size();
  for (size_t k = 0; k < idx.size(); ++k) {
    if (mine[k] != root[k]) {
      first = k;
      break;
    }
  }
  float first_f = static_cast<float>(first);  // exact below 2^24 parameters
  RETURN_IF_ERROR(c->AllReduce(&first_f, &first_f, 1, DType::kF32, ReduceOp::kMin));
  const auto f = static_cast<size_t>(first_f);
  if (f < idx.size()) {
    const std::string which = whose == "parameters" ? "" : " (#" + std::to_string(f) + " of the " + whose + ")";
    return InvalidArgumentError("finalize: parameter #", idx[f], which, " differs across ranks (rank ", c->rank(),
                                whose == "parameters" ? "" : " of that group", " has ", describe(idx[f]),
                                mine[f] == root[f] ? ", as rank 0 does" : ", rank 0 has something else", ")");
  }
  return Status();
}
}  // namespace

// Every rank registered the same parameters over the engine's group; the tensors over a group of
// their own are the same on every rank of that group (and every rank has such a group, of one size,
// or none does: agreed first, so that the group's check runs on all of its ranks or on none).
Status EngineCore::CheckRegistration() {
  std::vector<uint64_t> hash(params_.size());
  std::vector<size_t> dense, own;
  for (size_t i = 0; i < params_.size(); ++i) {
    hash[i] = SpecHash(params_[i], param_groups_[i], settings_[i].lr_scale, settings_[i].weight_decay, param_frozen_[i], param_state_[i]);
    (param_dp_[i] != nullptr ? own : dense).push_back(i);
  }
  auto describe = [this](size_t i) {
    std::ostringstream o;
    o << params_[i].ToString() << " in group '" << param_groups_[i] << "' with lr_scale " << settings_[i].lr_scale << " and weight_decay "
      << settings_[i].weight_decay << (param_frozen_[i] ? ", frozen" : "") << ", state " << StatePrecisionName(param_state_[i]);
    return o.str();
  };
  const float size = own_dp_ != nullptr ? static_cast<float>(own_dp_->size()) : 0.0f;
  float agreed[2] = {size, -size};
  RETURN_IF_ERROR(comm_->AllReduce(agreed, agreed, 2, DType::kF32, ReduceOp::kMax));
  if (agreed[0] != -agreed[1]) {
    const std::string mine = own_dp_ != nullptr ? "tensors over a data-parallel group of its own of " + std::to_string(own_dp_->size()) + " ranks"
                                                : "no tensors over a data-parallel group of its own";
    return InvalidArgumentError("finalize: rank ", comm_->rank(), " has ", mine, ", and other ranks differ (every rank has one such group, of ",
                                "one size, or none does)");
  }
  RETURN_IF_ERROR(CheckSameTensors(comm_, dense, hash, describe, "parameters"));
  // Judged inside each group, agreed over the world (a group that failed stops every rank).
  if (own_dp_ != nullptr) return AgreeOnStatus(comm_, CheckSameTensors(own_dp_, own, hash, describe, "tensors over the rank's own data-parallel group"));
  return Status();
}

Communicator* EngineCore::Dp(const Group& g) const { return g.dp != nullptr ? g.dp : shards_; }

// Tensors over a data-parallel group of their own: what they do not combine with yet (agreed: every
// rank has such a group or none, and the configuration is the same everywhere).
Status EngineCore::CheckOwnGroups() {
  if (own_dp_ == nullptr) return Status();
  const char* what = nullptr;
  if (shards_ != comm_) what = "hybrid sharding (shard_group_size)";
  if (config_.quantized_weights) what = "quantized_weights (qwZ)";
  if (config_.quantized_gradients) what = "quantized_gradients (qgZ)";
  if (config_.secondary_shard_group != 0) what = "secondary_shard_group (hpZ)";
  if (what != nullptr) {
    return InvalidArgumentError("finalize: tensors over a data-parallel group of their own (ParamOptions::data_parallel) do not combine with ", what,
                                " yet");
  }
  for (auto& g : groups_) {
    if (g->dp != nullptr) g->grad_scale = static_cast<float>(g->dp->size()) / static_cast<float>(comm_->size());
  }
  // The members' world ranks in the group's order: what a checkpoint records (StateGroup::own_group).
  std::vector<float> ranks(static_cast<size_t>(own_dp_->size()));
  const float mine = static_cast<float>(comm_->rank());
  RETURN_IF_ERROR(own_dp_->AllGather(&mine, ranks.data(), 1, DType::kF32), "finalize (the own data-parallel group's ranks)");
  own_ranks_.assign(ranks.begin(), ranks.end());
  return Status();
}

}  // namespace zrt
