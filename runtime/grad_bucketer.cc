// Gradient buckets (see grad_bucketer.h for the rank-major layout).
//
// Add(group): for each slice [a, b) of the group's shard range that fits the filling bucket, copy
// element range [shard_begin(r) + a, shard_begin(r) + b) of the full gradient into region r at
// offset `used`, for every rank r (casting to the reduce dtype), and remember where rank-local results
// go. A full bucket is launched (reduce-scatter of regions x used elements, or all-reduce) and the
// other bucket becomes the filling one, after waiting for it if it is still in flight.
// A partial bucket is compacted (regions moved to stride `used`) before launch.
#include "zrt/runtime/grad_bucketer.h"

#include <algorithm>
#include <functional>
#include <utility>

#include "zrt/core/base.h"
#include "zrt/kernels/weight_quant.h"

namespace zrt {

namespace {

// A collective whose results need host work once it finished (qgZ's decode, `then`), optionally
// followed by a second collective that `second` launches (with the host work between) once the first
// finished (qgZ's second level).
class Staged final : public CommHandle::Impl {
 public:
  Staged(CommHandle first, std::function<Result<CommHandle>()> second, std::function<void()> then)
      : first_(std::move(first)), second_(std::move(second)), then_(std::move(then)) {
    if (!second_) {  // one collective
      handle_ = std::move(first_);
      started_ = true;
    }
  }
  Status Wait() override {
    if (!started_) {
      RETURN_IF_ERROR(first_.Wait());
      RETURN_IF_ERROR(Start());
    }
    RETURN_IF_ERROR(handle_.Wait());
    Finish();
    return Status();
  }
  Result<bool> Test() override {
    if (!started_) {
      ASSIGN_OR_RETURN(const bool done, first_.Test());
      if (!done) return false;
      RETURN_IF_ERROR(Start());
    }
    ASSIGN_OR_RETURN(const bool done, handle_.Test());
    if (done) Finish();
    return done;
  }

 private:
  Status Start() {
    started_ = true;
    ASSIGN_OR_RETURN(handle_, second_());
    return Status();
  }
  void Finish() {
    if (then_) std::exchange(then_, nullptr)();
  }
  CommHandle first_, handle_;
  std::function<Result<CommHandle>()> second_;
  std::function<void()> then_;
  bool started_ = false;
};

}  // namespace

Result<std::unique_ptr<GradBucketer>> GradBucketer::Create(Communicator* comm, Device* device, Compute* compute,
                                                           const Options& o) {
  if (o.reduce_dtype == DType::kBytes) return InvalidArgumentError("gradient buckets: reduce dtype must be a float type");
  if (o.quantized_block > 0) RETURN_IF_ERROR(kernels::CheckWeightQuant(o.quantized_block, o.quantized_bits), "gradient buckets");
  if (o.replicas != nullptr && o.replicas->size() > 1 && comm->size() == 1) {
    // One rank per shard group: its whole shard is all-reduced across the replicas.
    Options all = o;
    all.all_reduce = true;
    all.replicas = nullptr;
    ASSIGN_OR_RETURN(std::unique_ptr<GradBucketer> g, Create(o.replicas, device, compute, all));
    g->across_replicas_ = true;
    return g;
  }
  if (o.all_reduce && o.replicas != nullptr && o.replicas->size() > 1) {
    return InvalidArgumentError("gradient buckets: an all-reduce over every rank has no replicas to reduce across");
  }
  const int regions = o.all_reduce ? 1 : comm->size();
  const int64_t configured = o.bucket_bytes / static_cast<int64_t>(DTypeSize(o.reduce_dtype)) / regions;
  if (configured < 1) {
    return InvalidArgumentError("gradient buckets: bucket_bytes ", o.bucket_bytes, " is too small for ", regions,
                                " ranks (needs at least one element per rank)");
  }
  const int64_t capacity = o.total < 0 ? configured : std::min(configured, o.total);
  std::unique_ptr<GradBucketer> g(new GradBucketer(comm, device, compute, o, capacity));
  if (capacity == 0 || g->alone()) return g;  // nothing is reduced
  RETURN_IF_ERROR(g->AllocateBucket(g->buckets_[0]));  // the second when a step needs it
  return g;
}

Status GradBucketer::AllocateBucket(Bucket& b) {
  const size_t esize = DTypeSize(o_.reduce_dtype);
  ASSIGN_OR_RETURN(b.in, device_->Allocate(static_cast<size_t>(capacity_ * regions()) * esize, MemCategory::kCommunication),
                   "gradient bucket");
  if (!o_.all_reduce) {
    ASSIGN_OR_RETURN(b.out, device_->Allocate(static_cast<size_t>(capacity_) * esize, MemCategory::kCommunication),
                     "gradient bucket output");
  }
  if (Quantized()) {
    const size_t packed = PackedBytes(capacity_) * static_cast<size_t>(regions());
    ASSIGN_OR_RETURN(b.qin, device_->Allocate(packed, MemCategory::kCommunication), "gradient bucket codes");
    ASSIGN_OR_RETURN(b.qout, device_->Allocate(packed, MemCategory::kCommunication), "gradient bucket codes");
    // A region's running sum and one rank's decoded part; two levels: the node's K partial sums too.
    if (sum_.empty()) sum_.resize(static_cast<size_t>((TwoLevel() ? 2 + o_.across->size() : 2) * capacity_));
  }
  return Status();
}

size_t GradBucketer::PackedBytes(int64_t used) const {
  return static_cast<size_t>(AlignUp(kernels::PackedWeightBytes(used, o_.quantized_block, o_.quantized_bits), 4));
}

Result<CommHandle> GradBucketer::LaunchQuantized(Bucket& b) {
  if (TwoLevel()) return LaunchTwoLevel(b);
  const size_t packed = PackedBytes(b.used), rsize = DTypeSize(o_.reduce_dtype);
  for (int r = 0; r < regions(); ++r) {
    kernels::QuantizeWeights(b.in.as<char>() + static_cast<size_t>(r * b.used) * rsize, o_.reduce_dtype, b.used, o_.quantized_block,
                             b.qin.as<char>() + packed * static_cast<size_t>(r), o_.quantized_bits);
  }
  ASSIGN_OR_RETURN(CommHandle h, comm_->AllToAllAsync(b.qin.data(), b.qout.data(), packed));
  stats_.reduce_bytes += static_cast<int64_t>(packed) * (regions() - 1);
  return CommHandle(std::make_unique<Staged>(std::move(h), nullptr, [this, &b] { DecodeQuantized(b, regions(), regions()); }));
}

// Rank r = k P + l (node k, place l): to each node rank l', the regions k' P + l' of every node k',
// node by node.
Result<CommHandle> GradBucketer::LaunchTwoLevel(Bucket& b) {
  const int p = o_.node->size(), k = o_.across->size();
  const size_t packed = PackedBytes(b.used), rsize = DTypeSize(o_.reduce_dtype);
  for (int l = 0; l < p; ++l) {
    for (int n = 0; n < k; ++n) {
      kernels::QuantizeWeights(b.in.as<char>() + static_cast<size_t>((n * p + l) * b.used) * rsize, o_.reduce_dtype, b.used,
                               o_.quantized_block, b.qin.as<char>() + packed * static_cast<size_t>(l * k + n), o_.quantized_bits);
    }
  }
  ASSIGN_OR_RETURN(CommHandle h, o_.node->AllToAllAsync(b.qin.data(), b.qout.data(), packed * static_cast<size_t>(k)));
  stats_.reduce_bytes += static_cast<int64_t>(packed) * k * (p - 1);
  return CommHandle(std::make_unique<Staged>(std::move(h), [this, &b] { return AcrossNodes(b); },
                                                [this, &b] { DecodeQuantized(b, o_.across->size(), regions()); }));
}

// The node's codes of this place's K regions summed in f32 in node-rank order, quantized again, and
// each sum sent to its node.
Result<CommHandle> GradBucketer::AcrossNodes(Bucket& b) {
  const int p = o_.node->size(), k = o_.across->size();
  const size_t packed = PackedBytes(b.used);
  float* part = sum_.data() + capacity_;
  float* node_sums = sum_.data() + 2 * capacity_;  // k x used
  std::fill(node_sums, node_sums + k * b.used, 0.0f);
  for (int l = 0; l < p; ++l) {
    for (int n = 0; n < k; ++n) {
      kernels::DequantizeWeights(b.qout.as<char>() + packed * static_cast<size_t>(l * k + n), b.used, o_.quantized_block, part,
                                 DType::kF32, o_.quantized_bits);
      float* sum = node_sums + n * b.used;
      for (int64_t i = 0; i < b.used; ++i) sum[i] += part[i];
    }
  }
  for (int n = 0; n < k; ++n) {
    kernels::QuantizeWeights(node_sums + n * b.used, DType::kF32, b.used, o_.quantized_block,
                             b.qin.as<char>() + packed * static_cast<size_t>(n), o_.quantized_bits);
  }
  ASSIGN_OR_RETURN(CommHandle h, o_.across->AllToAllAsync(b.qin.data(), b.qout.data(), packed), "reducing a gradient bucket across nodes");
  stats_.reduce_bytes += static_cast<int64_t>(packed) * (k - 1);
  stats_.across_nodes_bytes += static_cast<int64_t>(packed) * (k - 1);
  return h;
}

void GradBucketer::DecodeQuantized(Bucket& b, int sources, int divisor) {
  const size_t packed = PackedBytes(b.used);
  float* sum = sum_.data();
  float* part = sum_.data() + capacity_;
  std::fill(sum, sum + b.used, 0.0f);
  for (int r = 0; r < sources; ++r) {
    kernels::DequantizeWeights(b.qout.as<char>() + packed * static_cast<size_t>(r), b.used, o_.quantized_block, part, DType::kF32,
                               o_.quantized_bits);
    for (int64_t i = 0; i < b.used; ++i) sum[i] += part[i];
  }
  const float n = static_cast<float>(divisor);
  for (int64_t i = 0; i < b.used; ++i) StoreFromFloat(b.out.data(), i, o_.reduce_dtype, sum[i] / n);
}

Status GradBucketer::Add(const void* grad, DType grad_dtype, const ShardLayout& layout, void* shard_out, DType out_dtype) {
  if (layout.world_size() != regions()) {
    return InternalError("gradient bucket: layout for ", layout.world_size(), " ranks, bucket for ", regions());
  }
  const size_t gsize = DTypeSize(grad_dtype), rsize = DTypeSize(o_.reduce_dtype);
  const int64_t shard = layout.shard_size();
  if (alone()) return AddAlone(static_cast<const char*>(grad), grad_dtype, shard, static_cast<char*>(shard_out), out_dtype);
  for (int64_t a = 0; a < shard;) {
    Bucket* b = &Filling();
    if (b->used == capacity_) {
      RETURN_IF_ERROR(Launch(*b));
      filling_ ^= 1;
      b = &Filling();
      if (b->in_flight) RETURN_IF_ERROR(Complete(*b));
      if (b->in.empty()) RETURN_IF_ERROR(AllocateBucket(*b));
    }
    const int64_t n = std::min(shard - a, capacity_ - b->used);
    for (int r = 0; r < regions(); ++r) {
      const char* src = static_cast<const char*>(grad) + static_cast<size_t>(layout.shard_begin(r) + a) * gsize;
      char* dst = b->in.as<char>() + static_cast<size_t>(r * capacity_ + b->used) * rsize;
      RETURN_IF_ERROR(compute_->Cast(src, grad_dtype, dst, o_.reduce_dtype, n), "filling a gradient bucket");
    }
    b->dests.push_back(Dest{static_cast<char*>(shard_out) + static_cast<size_t>(a) * DTypeSize(out_dtype), out_dtype,
                            b->used, n});
    b->used += n;
    a += n;
  }
  return Poll();
}

Status GradBucketer::AddAlone(const char* grad, DType grad_dtype, int64_t count, char* shard_out, DType out_dtype) {
  const DType rd = o_.reduce_dtype;
  // f32 holds every bf16 and f16 value: only a 16-bit reduce dtype that neither side has rounds.
  if (rd == grad_dtype || rd == out_dtype || rd == DType::kF32) {
    if (grad == shard_out && grad_dtype == out_dtype) return Status();  // in place (stages 0-1): nothing to do
    return compute_->Cast(grad, grad_dtype, shard_out, out_dtype, count).WithContext("copying a gradient into its shard");
  }
  const int64_t chunk = std::min<int64_t>(count, int64_t{1} << 18);
  if (static_cast<int64_t>(scratch_.size()) < chunk * static_cast<int64_t>(DTypeSize(rd))) {
    ASSIGN_OR_RETURN(scratch_, device_->Allocate(static_cast<size_t>(chunk) * DTypeSize(rd), MemCategory::kCommunication), "gradient scratch");
  }
  for (int64_t a = 0; a < count; a += chunk) {
    const int64_t n = std::min(chunk, count - a);
    RETURN_IF_ERROR(compute_->Cast(grad + static_cast<size_t>(a) * DTypeSize(grad_dtype), grad_dtype, scratch_.data(), rd, n));
    RETURN_IF_ERROR(compute_->Cast(scratch_.data(), rd, shard_out + static_cast<size_t>(a) * DTypeSize(out_dtype), out_dtype, n));
  }
  return Status();
}

Status GradBucketer::Launch(Bucket& b) {
  const size_t rsize = DTypeSize(o_.reduce_dtype);
  const int n = regions();
  if (b.used < capacity_) {  // compact the regions to stride `used`
    for (int r = 1; r < n; ++r) {
      RETURN_IF_ERROR(compute_->Move(b.in.as<char>() + static_cast<size_t>(r * b.used) * rsize,
                                     b.in.as<char>() + static_cast<size_t>(r * capacity_) * rsize,
                                     static_cast<size_t>(b.used) * rsize), "compacting a gradient bucket");
    }
  }
  const int64_t bytes = b.used * n * static_cast<int64_t>(rsize);
  if (o_.all_reduce) {
    ASSIGN_OR_RETURN(b.handle, comm_->AllReduceAsync(b.in.data(), b.in.data(), static_cast<size_t>(b.used),
                                                     o_.reduce_dtype, ReduceOp::kAvg));
    stats_.reduce_bytes += 2 * bytes * (comm_->size() - 1) / comm_->size();
    if (across_replicas_) stats_.replica_bytes += 2 * bytes * (comm_->size() - 1) / comm_->size();
  } else if (Quantized()) {
    ASSIGN_OR_RETURN(b.handle, LaunchQuantized(b), "reducing a gradient bucket (quantized)");
  } else {
    ASSIGN_OR_RETURN(b.handle, comm_->ReduceScatterAsync(b.in.data(), b.out.data(), static_cast<size_t>(b.used),
                                                         o_.reduce_dtype, ReduceOp::kAvg));
    stats_.reduce_bytes += bytes * (n - 1) / n;
  }
  ++stats_.collectives;
  b.in_flight = true;
  b.replicating = false;
  b.seq = launches_++;
  b.launched = std::chrono::steady_clock::now();
  // On a device stream (NCCL) the replicas' all-reduce is queued at once, behind the reduce-scatter:
  // every rank then queues its collectives in the same order, which NCCL needs across communicators
  // (a poll-timed launch could order it before another rank's next reduce-scatter: a cross-group
  // wait). On the host (MPI) it starts when a poll finds the reduce-scatter done.
  if (Replicated() && comm_->backend() == "nccl") RETURN_IF_ERROR(LaunchReplicas(b));
  return Status();
}

// The shard group's reduce-scatter finished: the region reduced here is averaged across the replicas.
Status GradBucketer::LaunchReplicas(Bucket& b) {
  const int r = o_.replicas->size();
  ASSIGN_OR_RETURN(b.handle, o_.replicas->AllReduceAsync(b.out.data(), b.out.data(), static_cast<size_t>(b.used), o_.reduce_dtype,
                                                         ReduceOp::kAvg), "reducing a gradient bucket across replicas");
  const int64_t bytes = 2 * b.used * static_cast<int64_t>(DTypeSize(o_.reduce_dtype)) * (r - 1) / r;
  stats_.reduce_bytes += bytes;
  stats_.replica_bytes += bytes;
  ++stats_.collectives;
  b.replicating = true;
  return Status();
}

bool GradBucketer::Replicated() const { return o_.replicas != nullptr && o_.replicas->size() > 1; }

Status GradBucketer::Complete(Bucket& b) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point waiting = Clock::now();
  RETURN_IF_ERROR(b.handle.Wait(), "reducing a gradient bucket");
  if (Replicated() && !b.replicating) {
    RETURN_IF_ERROR(LaunchReplicas(b));
    RETURN_IF_ERROR(b.handle.Wait(), "reducing a gradient bucket across replicas");
  }
  const Clock::time_point done = Clock::now();
  stats_.reduce_seconds += std::chrono::duration<double>(done - b.launched).count();
  stats_.reduce_wait_seconds += std::chrono::duration<double>(done - waiting).count();
  const char* out = o_.all_reduce ? b.in.as<char>() : b.out.as<char>();
  const size_t rsize = DTypeSize(o_.reduce_dtype);
  for (const Dest& d : b.dests) {
    RETURN_IF_ERROR(compute_->Cast(out + static_cast<size_t>(d.out_offset) * rsize, o_.reduce_dtype, d.ptr, d.dtype, d.count),
                    "reading a reduced gradient bucket");
  }
  b.dests.clear();
  b.used = 0;
  b.in_flight = false;
  return Status();
}

Status GradBucketer::Poll() {
  // Oldest first; with two levels a bucket finishes only after the older one did, so that every rank
  // launches the second level's collectives in the same order.
  const bool fifo = TwoLevel();
  const int older = buckets_[0].seq <= buckets_[1].seq ? 0 : 1;
  for (int k : {older, older ^ 1}) {
    Bucket& b = buckets_[k];
    if (!b.in_flight) continue;
    if (fifo && k != older && buckets_[older].in_flight) break;
    const auto testing = std::chrono::steady_clock::now();  // CPU MPI progresses the collective inside Test: not hidden
    ASSIGN_OR_RETURN(bool done, b.handle.Test(), "reducing a gradient bucket");
    if (done && Replicated() && !b.replicating) {
      RETURN_IF_ERROR(LaunchReplicas(b));
      ASSIGN_OR_RETURN(done, b.handle.Test(), "reducing a gradient bucket across replicas");
    }
    stats_.reduce_wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - testing).count();
    if (done) RETURN_IF_ERROR(Complete(b));
  }
  return Status();
}

Status GradBucketer::Flush() {
  // Oldest first: the other bucket was launched before the filling one.
  Bucket& other = buckets_[filling_ ^ 1];
  if (other.in_flight) RETURN_IF_ERROR(Complete(other));
  Bucket& b = Filling();
  if (b.used > 0) {
    RETURN_IF_ERROR(Launch(b));
    RETURN_IF_ERROR(Complete(b));
  }
  return Status();
}

}  // namespace zrt
