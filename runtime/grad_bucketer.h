// GradBucketer: reduces full group gradients into per-rank shards with large asynchronous collectives.
//
// Buckets are rank-major: region r of a bucket holds, back to back, rank r's slices of every group
// added to it, so one reduce-scatter of the bucket hands each rank exactly its own shard slices even
// when a bucket mixes several groups (and a group larger than a bucket spans several). Stage 0 uses
// the same code with a one-region bucket and an all-reduce. Two buckets alternate: one fills while
// the other is in flight; results are averaged over ranks and cast into the destination shard when
// the bucket completes (Poll or Flush).
//
// Buckets are sized to the model: never larger than everything one step adds (`total`), the second
// allocated only when a step fills the first, and none at all on one rank, where nothing is reduced
// (Add casts the gradient into the shard directly, rounding through the reduce dtype as a reduction
// would).
//
// Hybrid sharding (Options::replicas): a bucket's reduce-scatter over the shard group is followed by
// an all-reduce of the reduced region across the replica groups (on the host: started when a poll
// finds the first complete, so both overlap the rest of backward; on a device stream: queued behind
// it at once, in the same order on every rank); the averages over both make the average over every
// rank.
// With one rank per shard group the bucket is all-reduced over the replicas alone.
//
// Every rank must add the same groups in the same order (they run the same model). Not thread-safe.
// Source gradients may be reused as soon as Add returns (they are copied into the bucket).
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "zrt/runtime/compute.h"
#include "zrt/core/communicator.h"
#include "zrt/core/device.h"
#include "zrt/core/shard_layout.h"
#include "zrt/runtime/stats.h"

namespace zrt {

class GradBucketer {
 public:
  struct Options {
    int64_t bucket_bytes = 32 << 20;  // per bucket (all ranks' regions together); two are allocated
    DType reduce_dtype = DType::kF32;  // f32, or bf16/f16 on the wire (reductions accumulate in f32)
    bool all_reduce = false;           // stage 0: every rank gets the whole reduced gradient
    // Elements per region of everything one step adds (the trained groups' shard_size summed; their
    // padded sizes with all_reduce); 0: nothing is added; < 0: not known (buckets of bucket_bytes).
    // Caps the buckets.
    int64_t total = -1;
    // Hybrid sharding: the ranks that hold the same shards (null or one rank: none). Outlives the
    // bucketer.
    Communicator* replicas = nullptr;
    // qgZ (reduce-scatter only): each region travels as int8 (or int4) codes with an f32 scale per
    // this many values (kernels/weight_quant.h), an all-to-all of the codes; each rank decodes every
    // rank's codes of its region and sums them in f32 in rank order, rounding once to reduce_dtype.
    // 0: off. Host memory only.
    int64_t quantized_block = 0;
    int quantized_bits = 8;  // 8 or 4 (then quantized_block is even): kernels::CheckWeightQuant
    // qgZ over two levels (ZeRO++'s hierarchical reduction): `node`, the P consecutive ranks of
    // `comm` a node holds (rank / P), and `across`, the K = size / P ranks at the same place in each
    // node (rank % P), both split from `comm` and outliving the bucketer. Each rank sends its node's
    // ranks the regions of their places (an all-to-all of codes inside the node), sums the node's
    // codes of its place's K regions in f32, quantizes those sums again and sends each to its node (an
    // all-to-all of codes across nodes, 1/P of the bytes), where they are summed in node order: the
    // same result layout, each value quantized twice. Null: one level.
    Communicator* node = nullptr;
    Communicator* across = nullptr;
  };
  // Buckets live on `device`; `compute` (for that device) does the copies and casts into and out of them.
  static Result<std::unique_ptr<GradBucketer>> Create(Communicator* comm, Device* device, Compute* compute,
                                                      const Options& options);

  // Queues the reduction of a full group gradient (`grad`, dtype `grad_dtype`, laid out by `layout`)
  // into this rank's shard `shard_out` (layout.shard_size() elements of `out_dtype`; all of it for
  // all-reduce). `shard_out` must stay valid until Flush.
  Status Add(const void* grad, DType grad_dtype, const ShardLayout& layout, void* shard_out, DType out_dtype);
  // Completes whatever finished (drives MPI progress); never blocks.
  Status Poll();
  // Launches the partial bucket and waits for everything; afterwards every shard_out is final.
  Status Flush();

  const CommStats& stats() const { return stats_; }

 private:
  struct Dest {
    void* ptr;
    DType dtype;
    int64_t out_offset;  // in the bucket's per-rank region
    int64_t count;
  };
  struct Bucket {
    DeviceBuffer in;   // regions() x capacity_ elements of reduce_dtype
    DeviceBuffer out;  // capacity_ elements (reduce-scatter) or none (all-reduce: in place)
    DeviceBuffer qin, qout;  // qgZ: every region's codes and scales, sent and received
    int64_t used = 0;  // elements per region
    std::vector<Dest> dests;
    CommHandle handle;
    bool in_flight = false;
    bool replicating = false;  // the handle is the replicas' all-reduce (the shard group's finished)
    int64_t seq = 0;           // launch order (two-level qgZ finishes buckets in it)
    std::chrono::steady_clock::time_point launched;
  };

  GradBucketer(Communicator* comm, Device* device, Compute* compute, const Options& o, int64_t capacity)
      : comm_(comm), device_(device), compute_(compute), o_(o), capacity_(capacity) {}
  int regions() const { return o_.all_reduce ? 1 : comm_->size(); }
  bool alone() const { return comm_->size() == 1; }
  bool Replicated() const;
  bool Quantized() const { return o_.quantized_block > 0 && !o_.all_reduce; }
  size_t PackedBytes(int64_t used) const;  // qgZ: one region of `used` elements as codes and scales
  bool TwoLevel() const { return Quantized() && o_.node != nullptr && o_.across != nullptr && o_.node->size() > 1 && o_.across->size() > 1; }
  Result<CommHandle> LaunchQuantized(Bucket& b);
  Result<CommHandle> LaunchTwoLevel(Bucket& b);
  Result<CommHandle> AcrossNodes(Bucket& b);
  // `sources` ranks' codes of this rank's region in qout, decoded and summed in their order, divided
  // by `divisor`, rounded once into `out`.
  void DecodeQuantized(Bucket& b, int sources, int divisor);
  Status AddAlone(const char* grad, DType grad_dtype, int64_t count, char* shard_out, DType out_dtype);
  Status AllocateBucket(Bucket& b);
  Status Launch(Bucket& b);
  Status LaunchReplicas(Bucket& b);
  Status Complete(Bucket& b);
  Bucket& Filling() { return buckets_[filling_]; }

  Communicator* comm_;
  Device* device_;
  Compute* compute_;
  Options o_;
  int64_t capacity_;  // elements per region
  Bucket buckets_[2];  // empty when alone()
  DeviceBuffer scratch_;  // alone(): the reduce dtype's rounding, when neither side has that dtype
  std::vector<float> sum_;  // qgZ: a region's running sum and one rank's decoded part
  int filling_ = 0;
  int64_t launches_ = 0;
  bool across_replicas_ = false;  // one rank per shard group: the all-reduce is the replicas'
  CommStats stats_;
};

}  // namespace zrt
