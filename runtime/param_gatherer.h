// ParamGatherer (stage 3): all-gathers a group's parameter shards into a pooled full buffer on
// Gather(group) and returns the buffer to the pool on Release(group).
//
// Prefetch: the order of Gather calls in the first step is recorded; in later steps, after each
// Gather the next `prefetch_depth` groups of that order are all-gathered asynchronously, as long as
// live gathered bytes (held + in flight) stay within `max_live_bytes`. A Gather that does not follow
// the recorded order still works (it just was not prefetched). Unused prefetches are dropped at
// EndStep. Not thread-safe.
//
// Offloaded shards (stage-3 parameters on NVMe): a group with a `load` function has no resident shard;
// its shard is read into a pooled buffer before the all-gather. Reads run one group further ahead
// than the all-gathers, so a prefetched group's read has usually finished when its all-gather starts.
// Reads are local; all-gathers start only at Gather/Release-determined points, so every rank issues
// its collectives in the same order whatever its disk does.
//
// Quantized gathers (qwZ, QuantizeGathers(block)): each shard is block-quantized to int8 codes with an
// f32 scale per block (kernels/weight_quant.h) when its all-gather starts; the codes and scales are
// all-gathered (about half a 16-bit shard's bytes) and every rank decodes every rank's codes, its own
// included, into the full parameters, so all ranks hold the same values. The shards themselves (the
// master's 16-bit copy) are untouched; a group of one rank gathers exactly (nothing moves). Host
// memory only (the engine checks).
//
// Secondary shards (hpZ, SecondaryShards(node)): the first gather of a group after EndStep keeps this
// rank's 1/P of the gathered parameters (P = the node group's ranks, consecutive ranks of the
// gather's communicator; the slice at the rank's place in the node group); the group's later gathers
// in the step (the backward's, a recomputation's) all-gather those slices inside the node group only:
// exactly what the first gather gave (qwZ's decoded values included), no byte across nodes. They are
// dropped at EndStep (the step changes the parameters) and by DropSecondary (a load did). Their
// memory, padded_size / P elements per group, is allocated at the first use and kept (parameters'
// category). Host memory only (the engine checks).
//
// Host-resident shards with device buffers (stage-3 parameters offloaded on a GPU; `compute` given):
// each shard is copied into a pooled device buffer on the compute queue right before its all-gather,
// which the communicator orders after it, so prefetching stays asynchronous.
#pragma once

#include <functional>
#include <vector>

#include "zrt/runtime/buffer_pool.h"
#include "zrt/runtime/compute.h"
#include "zrt/core/communicator.h"
#include "zrt/core/shard_layout.h"
#include "zrt/offload/io_engine.h"
#include "zrt/runtime/grad_bucketer.h"

namespace zrt {

class ParamGatherer {
 public:
  struct GroupRef {
    const void* shard;  // this rank's shard (layout.shard_size() elements of dtype), or null with `load`
    DType dtype;
    const ShardLayout* layout;
    std::string name;
    // Offloaded shard: reads it into dst (load_bytes, 4 KiB-aligned) asynchronously.
    std::function<Result<IoHandle>(void* dst)> load;
    size_t load_bytes = 0;
    // The ranks the group is sharded over (its own data-parallel group: ParamOptions::data_parallel);
    // null: the gatherer's communicator.
    Communicator* comm = nullptr;
  };
  // Gathered parameters come from `pool` (device memory); offloaded shards are read into `load_pool`
  // (host memory the I/O engine can write). `upload`: shards are in host memory and the pool's are
  // not; shards go through a device copy made by this Compute (null: all-gather from the shards).
  ParamGatherer(Communicator* comm, BufferPool* pool, BufferPool* load_pool, Compute* upload, int64_t max_live_bytes,
                int prefetch_depth)
      : comm_(comm), pool_(pool), load_pool_(load_pool), upload_(upload), max_live_bytes_(max_live_bytes),
        prefetch_depth_(prefetch_depth) {}

  void SetGroups(std::vector<GroupRef> groups);
  // qwZ: gathers move block-quantized int8 codes, `block` values per f32 scale (0: exact gathers).
  void QuantizeGathers(int64_t block) { quant_block_ = block; }
  // hpZ: `node` (split from the gatherer's communicator, groups of consecutive ranks whose size
  // divides it) gathers the secondary shards, allocated on `device`.
  void SecondaryShards(Communicator* node, Device* device) {
    node_ = node;
    secondary_device_ = device;
  }
  // Every secondary shard is stale (the parameters changed outside a step): the next gathers go whole.
  void DropSecondary();
  int64_t secondary_bytes() const { return secondary_bytes_; }
  // Full parameters of group g (padded_size elements of its dtype), valid until Release(g).
  Result<void*> Gather(int g);
  Status Release(int g);
  bool gathered(int g) const { return state_[static_cast<size_t>(g)].phase == Phase::kGathered; }
  // The full parameters of a gathered group (null otherwise), without Gather's bookkeeping.
  void* gathered_data(int g) { return gathered(g) ? state_[static_cast<size_t>(g)].buffer.data() : nullptr; }
  // Ends a step: drops unused prefetches; the first call freezes the recorded order.
  Status EndStep();
  int64_t live_bytes() const { return live_bytes_; }
  const CommStats& stats() const { return stats_; }

 private:
  enum class Phase { kReleased, kLoading, kInFlight, kGathered };
  struct State {
    Phase phase = Phase::kReleased;
    DeviceBuffer buffer;  // the full parameters
    CommHandle handle;
    DeviceBuffer shard;   // offloaded groups: the shard read from disk, until the all-gather is done
    DeviceBuffer device_shard;  // with `upload`: the shard's device copy, until the all-gather is done
    DeviceBuffer packed, packed_all;  // qwZ: this rank's codes and scales, every rank's, until decoded
    IoHandle io;
    DeviceBuffer secondary;       // hpZ: this rank's slice of the parameters as last gathered
    bool secondary_valid = false;  // ... and gathered in this step
  };
  Communicator* Comm(int g) const {  // the group's ranks
    Communicator* c = groups_[static_cast<size_t>(g)].comm;
    return c != nullptr ? c : comm_;
  }
  size_t Bytes(int g) const;       // the full (gathered) parameters
  size_t ShardBytes(int g) const;  // this rank's shard
  size_t PackedBytes(int g) const;  // qwZ: this rank's shard as codes and scales (a multiple of 4)
  Status Decode(int g);             // qwZ: every rank's codes into the full parameters
  Status Load(int g);
  Status Start(int g);
  Status StartFromSecondary(int g);  // hpZ: the node group's slices
  Status KeepSecondary(int g);       // hpZ: this rank's slice of the gathered parameters
  void DropShard(int g);
  void Prefetch(int g);

  Communicator* comm_;
  BufferPool* pool_;
  BufferPool* load_pool_;
  Compute* upload_;
  int64_t max_live_bytes_;
  int prefetch_depth_;
  std::vector<GroupRef> groups_;
  std::vector<State> state_;
  std::vector<int> order_;  // recorded in the first step
  bool recording_ = true;
  size_t cursor_ = 0;  // position in order_ of the next expected Gather
  int64_t live_bytes_ = 0;
  int64_t quant_block_ = 0;
  Communicator* node_ = nullptr;  // hpZ
  Device* secondary_device_ = nullptr;
  int64_t secondary_bytes_ = 0;
  CommStats stats_;
};

}  // namespace zrt
