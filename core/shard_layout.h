// ShardLayout: how an ordered list of tensors is packed into one flat buffer and split across ranks.
//
//   flat buffer: | t0 | pad | t1 | pad | ... | tail pad |     (each tensor starts at a multiple of
//                |<- rank 0 ->|<- rank 1 ->| ... |<- rank N-1 ->|   `alignment` elements)
//
// Each tensor's offset is a multiple of `alignment`; the padded flat size is a multiple of
// world_size * alignment, so every rank owns the same number of elements, shard_size, which is itself a
// multiple of `alignment`. Padding belongs to no tensor and is always zero in engine buffers.
// Both the ZeRO engine (partitioning) and checkpoint resharding (which bytes an M-rank job needs from
// an N-rank checkpoint) use this class, so it is the single definition of "who owns what".
//
// Build: O(tensors). Memory: one int64 per tensor (+ the numels). Lookups are O(log tensors) plus the
// size of the answer. Immutable after construction; thread-safe to share.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "zrt/core/status.h"
#include "zrt/core/tensor_spec.h"

namespace zrt {

// A contiguous run of one tensor's elements that lies inside one rank's shard.
struct ShardPiece {
  int64_t tensor = 0;         // index into the layout's tensor list
  int64_t tensor_offset = 0;  // first element, counted within the tensor
  int64_t shard_offset = 0;   // where that element sits within the rank's shard
  int64_t count = 0;          // elements
  int rank = 0;               // owner
  friend bool operator==(const ShardPiece&, const ShardPiece&) = default;
};

class ShardLayout {
 public:
  ShardLayout() = default;

  // numels[i] >= 0 is the element count of tensor i; world_size >= 1; alignment >= 1 (elements).
  static Result<ShardLayout> Create(std::span<const int64_t> numels, int world_size, int64_t alignment);
  // Convenience: from specs (uses their numel()).
  static Result<ShardLayout> Create(std::span<const TensorSpec> specs, int world_size, int64_t alignment);

  int world_size() const { return world_size_; }
  int64_t alignment() const { return alignment_; }
  int64_t num_tensors() const { return static_cast<int64_t>(numels_.size()); }
  int64_t numel(int64_t tensor) const { return numels_[tensor]; }
  // Offset of tensor i in the flat buffer.
  int64_t tensor_offset(int64_t tensor) const { return offsets_[tensor]; }
  // Elements that belong to tensors (excludes padding).
  int64_t total_numel() const { return total_numel_; }
  // Flat buffer size including padding: shard_size() * world_size().
  int64_t padded_size() const { return shard_size_ * world_size_; }
  int64_t shard_size() const { return shard_size_; }
  // Rank r owns flat elements [shard_begin(r), shard_end(r)).
  int64_t shard_begin(int rank) const { return shard_size_ * rank; }
  int64_t shard_end(int rank) const { return shard_size_ * (rank + 1); }
  // Rank that owns flat element `flat` (0 <= flat < padded_size()).
  int owner(int64_t flat) const { return static_cast<int>(flat / shard_size_); }

  // The tensor whose range [offset, offset + numel) contains flat element `flat`, or -1 for padding.
  int64_t TensorAt(int64_t flat) const;

  // The pieces that rank `rank` owns, ordered by shard_offset. Precondition: 0 <= rank < world_size.
  std::vector<ShardPiece> RankPieces(int rank) const;

  // The pieces covering elements [begin, end) of tensor `tensor`, ordered by tensor_offset (one per rank
  // they touch). Preconditions: valid tensor index, 0 <= begin <= end <= numel(tensor).
  std::vector<ShardPiece> Locate(int64_t tensor, int64_t begin, int64_t end) const;

  friend bool operator==(const ShardLayout&, const ShardLayout&) = default;

 private:
  int world_size_ = 1;
  int64_t alignment_ = 1;
  int64_t shard_size_ = 0;
  int64_t total_numel_ = 0;
  std::vector<int64_t> numels_;
  std::vector<int64_t> offsets_;
};

}  // namespace zrt
