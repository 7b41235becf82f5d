// EngineCore::SplitMesh: the engine's mesh (EngineConfig::shard_group_size, docs/engine.md "Hybrid
// sharding"): the shard group its layouts are over and the replica group that all-reduces each
// reduced shard; and where the quantized collectives over it can work.
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <string_view>
#include <vector>

#include "zrt/core/thread_pool.h"
#include "zrt/kernels/weight_quant.h"
#include "zrt/runtime/engine_core.h"
#include "zrt/runtime/engine_internal.h"

namespace zrt {

Status internal::CheckQuantizedCollectives(const EngineConfig& c, const Device& device) {
  if (c.secondary_shard_group != 0) {
    if (c.stage != 3) return InvalidArgumentError("engine: secondary_shard_group (hpZ) needs stage 3 (only stage 3 gathers parameters)");
    if (c.secondary_shard_group < EngineConfig::kShardGroupNode || c.secondary_shard_group == 1) {
      return InvalidArgumentError("engine: secondary_shard_group must be 0 (off), -1 (a node) or >= 2, got ", c.secondary_shard_group);
    }
    if (!device.host_accessible()) {
      return InvalidArgumentError("engine: secondary_shard_group works on host memory (CPU ranks); device ", device.name(),
                                  " is not addressable from the host");
    }
  }
  if (!c.quantized_weights && !c.quantized_gradients) return Status();
  if (c.quantized_weights && c.stage != 3) {
    return InvalidArgumentError("engine: quantized_weights needs stage 3 (at stage ", c.stage,
                                " the gathered parameters are kept, and quantizing them would lose precision every step)");
  }
  if (c.quantized_gradients && c.stage == 0) {
    return InvalidArgumentError("engine: quantized_gradients needs stage 1-3 (it quantizes the reduce-scatter; stage 0 all-reduces)");
  }
  if (c.quantization_block < 0 || c.quantization_block > kernels::kWeightQuantMaxBlock) {
    return InvalidArgumentError("engine: quantization_block must be 0 (each width's own) or in [1, ", kernels::kWeightQuantMaxBlock,
                                "], got ", c.quantization_block);
  }
  if (c.quantized_gradients) {
    RETURN_IF_ERROR(kernels::CheckWeightQuant(kernels::QuantBlockFor(c.quantization_block, c.quantized_gradient_bits), c.quantized_gradient_bits),
                    "engine: quantized_gradient_bits");
  }
  if (!device.host_accessible()) {
    return InvalidArgumentError("engine: quantized_weights and quantized_gradients work on host memory (CPU ranks); device ", device.name(),
                                " is not addressable from the host");
  }
  return Status();
}

// Shard groups of S consecutive ranks (rank / S), replica groups of the ranks with the same place in
// theirs (rank % S): checkpoints and the memory tier rely on this numbering (core/state_view.h).
Status EngineCore::SplitMesh() {
  shards_ = comm_;
  const int n = comm_->size();
  if (config_.stage == 0) return Status();
  int s = config_.shard_group_size == 0 ? n : config_.shard_group_size;
  if (s == EngineConfig::kShardGroupNode) {
    ASSIGN_OR_RETURN(s, NodeRanks("shard_group_size"));
  }
  if (s < n) {
    ASSIGN_OR_RETURN(own_shards_, comm_->Split(comm_->rank() / s, comm_->rank()), "the shard group");
    ASSIGN_OR_RETURN(replicas_, comm_->Split(comm_->rank() % s, comm_->rank()), "the replica group");
    if (!own_shards_ || !replicas_ || own_shards_->size() != s || replicas_->size() != n / s) {
      return InternalError("splitting ", n, " ranks into shard groups of ", s, " gave groups of the wrong size");
    }
    own_shards_->set_check_args(comm_->check_args());
    // Never checked: the replicas' all-reduce of a bucket starts whenever the shard group's reduce-
    // scatter finished (in a poll on one rank, at the bucket's completion on another), so a blocking
    // argument check there would wait on ranks blocked in their shard group's next check: a cycle.
    // Its count is the checked reduce-scatter's, the same everywhere (Finalize checks the model).
    replicas_->set_check_args(false);
    shards_ = own_shards_.get();
  }
  if (config_.shard_group_size == EngineConfig::kShardGroupNode) RETURN_IF_ERROR(OnOneHost(shards_, "shard_group_size"));
  RETURN_IF_ERROR(SplitSecondary());
  return SplitNodes();
}

// qgZ goes two levels where the shard group spans nodes of P > 1 of its ranks each (the launcher's
// ranks per node, placed node by node): one all-to-all inside the node, one across the nodes.
Status EngineCore::SplitNodes() {
  if (!config_.quantized_gradients) return Status();
  const int s = shards_->size(), p = ThreadPool::LauncherRanksPerNode();
  float v[2] = {static_cast<float>(p), -static_cast<float>(p)};
  RETURN_IF_ERROR(comm_->AllReduce(v, v, 2, DType::kF32, ReduceOp::kMax), "qgZ's levels");
  if (v[0] != -v[1] || p < 2 || p >= s || s % p != 0) return Status();  // one level
  ASSIGN_OR_RETURN(node_, shards_->Split(shards_->rank() / p, shards_->rank()), "qgZ's node group");
  ASSIGN_OR_RETURN(across_, shards_->Split(shards_->rank() % p, shards_->rank()), "qgZ's group across nodes");
  if (!node_ || !across_ || node_->size() != p || across_->size() != s / p) return InternalError("splitting qgZ's levels");
  node_->set_check_args(false);  // (as the replicas': the second level starts whenever a poll finds the first done)
  across_->set_check_args(false);
  if (!OnOneHost(node_.get(), "qgZ's node group").ok()) {  // agreed on every rank: ranks not placed node by node
    node_.reset();
    across_.reset();
  }
  return Status();
}

// hpZ's groups: P consecutive ranks of the shard group.
Status EngineCore::SplitSecondary() {
  int p = config_.secondary_shard_group;
  if (p == 0) return Status();
  if (p == EngineConfig::kShardGroupNode) {
    ASSIGN_OR_RETURN(p, NodeRanks("secondary_shard_group"));
  }
  const int s = shards_->size();
  if (p < 2 || p >= s || s % p != 0) {
    return InvalidArgumentError("engine: secondary_shard_group ", p, " must be in [2, ", s, ") and divide the shard group's ", s,
                                " ranks (a secondary copy over the whole shard group would be the shards themselves)");
  }
  ASSIGN_OR_RETURN(secondary_, shards_->Split(shards_->rank() / p, shards_->rank()), "the secondary shard group");
  if (!secondary_ || secondary_->size() != p) return InternalError("splitting ", s, " ranks into secondary groups of ", p, " failed");
  secondary_->set_check_args(comm_->check_args());
  if (config_.secondary_shard_group == EngineConfig::kShardGroupNode) RETURN_IF_ERROR(OnOneHost(secondary_.get(), "secondary_shard_group"));
  return Status();
}

// A node: the launcher's ranks per node, the same on every rank and dividing the world.
Result<int> EngineCore::NodeRanks(const char* setting) {
  const int n = comm_->size(), s = ThreadPool::LauncherRanksPerNode();
  float v[2] = {static_cast<float>(s), -static_cast<float>(s)};
  RETURN_IF_ERROR(comm_->AllReduce(v, v, 2, DType::kF32, ReduceOp::kMax), setting, " of a node");
  if (v[0] != -v[1] || n % s != 0) {
    return InvalidArgumentError(setting, " = node: the launcher's ranks per node (", s, " here) differ between nodes or do not "
                                "divide the world size ", n, "; set ", setting, " explicitly");
  }
  return s;
}

// Each of the groups `group` is one of must be one node: every rank of it on the same host.
Status EngineCore::OnOneHost(Communicator* group, const char* setting) {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  const uint64_t mine = std::hash<std::string_view>{}(host);
  const int s = group->size();
  std::vector<uint64_t> all(static_cast<size_t>(s));
  RETURN_IF_ERROR(group->AllGather(&mine, all.data(), sizeof(mine), DType::kBytes), setting, " of a node");
  const bool one_host = std::all_of(all.begin(), all.end(), [&](uint64_t h) { return h == all[0]; });
  const int first = comm_->rank() - group->rank();
  return AgreeOnStatus(comm_, one_host ? Status() : InvalidArgumentError(
      setting, " = node: ranks ", first, "..", first + s - 1, " are not all on host ", host,
      " (place ranks node by node, mpirun --map-by slot, or set ", setting, " explicitly)")).WithContext(std::string(setting) + " of a node");
}

}  // namespace zrt
