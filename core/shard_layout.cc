#include "zrt/core/shard_layout.h"

#include <algorithm>
#include <limits>

namespace zrt {
namespace {
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

// Rounds up to a multiple of `m` or fails on int64 overflow.
bool RoundUp(int64_t x, int64_t m, int64_t* out) {
  const int64_t r = x % m;
  if (r == 0) {
    *out = x;
    return true;
  }
  if (x > kMax - (m - r)) return false;
  *out = x + (m - r);
  return true;
}
}  // namespace

Result<ShardLayout> ShardLayout::Create(std::span<const int64_t> numels, int world_size, int64_t alignment) {
  if (world_size < 1) return InvalidArgumentError("shard layout: world size must be >= 1, got ", world_size);
  if (alignment < 1) return InvalidArgumentError("shard layout: alignment must be >= 1 element, got ", alignment);
  if (alignment > kMax / world_size) {
    return InvalidArgumentError("shard layout: world size ", world_size, " x alignment ", alignment, " overflows");
  }
  ShardLayout l;
  l.world_size_ = world_size;
  l.alignment_ = alignment;
  l.numels_.assign(numels.begin(), numels.end());
  l.offsets_.resize(numels.size());
  int64_t cursor = 0;
  for (size_t i = 0; i < numels.size(); ++i) {
    if (numels[i] < 0) return InvalidArgumentError("shard layout: tensor ", i, " has negative size ", numels[i]);
    if (!RoundUp(cursor, alignment, &cursor) || numels[i] > kMax - cursor) {
      return InvalidArgumentError("shard layout: flat size overflows int64 at tensor ", i);
    }
    l.offsets_[i] = cursor;
    cursor += numels[i];
    l.total_numel_ += numels[i];
  }
  int64_t padded = 0;
  // An empty model still gets one aligned element per rank, so shard_size() > 0 and owner() is defined.
  if (!RoundUp(std::max<int64_t>(cursor, 1), alignment * world_size, &padded)) {
    return InvalidArgumentError("shard layout: padded flat size overflows int64");
  }
  l.shard_size_ = padded / world_size;
  return l;
}

Result<ShardLayout> ShardLayout::Create(std::span<const TensorSpec> specs, int world_size, int64_t alignment) {
  std::vector<int64_t> numels;
  numels.reserve(specs.size());
  for (const TensorSpec& s : specs) {
    RETURN_IF_ERROR(Validate(s), "shard layout");
    numels.push_back(s.numel());
  }
  return Create(numels, world_size, alignment);
}

int64_t ShardLayout::TensorAt(int64_t flat) const {
  // Last tensor whose offset <= flat; several empty tensors may share an offset, and the last of them
  // is followed by the tensor that really contains `flat` (or by padding).
  auto it = std::upper_bound(offsets_.begin(), offsets_.end(), flat);
  if (it == offsets_.begin()) return -1;
  const int64_t t = (it - offsets_.begin()) - 1;
  return flat < offsets_[t] + numels_[t] ? t : -1;
}

std::vector<ShardPiece> ShardLayout::RankPieces(int rank) const {
  std::vector<ShardPiece> out;
  const int64_t b = shard_begin(rank), e = shard_end(rank);
  // First tensor that ends after b: tensors are in offset order and non-overlapping.
  int64_t t = std::upper_bound(offsets_.begin(), offsets_.end(), b) - offsets_.begin();
  if (t > 0) --t;
  for (; t < num_tensors() && offsets_[t] < e; ++t) {
    const int64_t lo = std::max(b, offsets_[t]);
    const int64_t hi = std::min(e, offsets_[t] + numels_[t]);
    if (lo >= hi) continue;
    out.push_back(ShardPiece{t, lo - offsets_[t], lo - b, hi - lo, rank});
  }
  return out;
}

std::vector<ShardPiece> ShardLayout::Locate(int64_t tensor, int64_t begin, int64_t end) const {
  std::vector<ShardPiece> out;
  if (begin >= end) return out;
  const int64_t fb = offsets_[tensor] + begin, fe = offsets_[tensor] + end;
  for (int r = owner(fb); r < world_size_ && shard_begin(r) < fe; ++r) {
    const int64_t lo = std::max(fb, shard_begin(r));
    const int64_t hi = std::min(fe, shard_end(r));
    out.push_back(ShardPiece{tensor, lo - offsets_[tensor], lo - shard_begin(r), hi - lo, r});
  }
  return out;
}

}  // namespace zrt
