// One rank's snapshot file in the memory tier (tier_file.h).
#include "zrt/checkpoint/tier/tier_file.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "zrt/checkpoint/codec.h"
#include "zrt/checkpoint/files.h"
#include "zrt/checkpoint/fs_util.h"

namespace zrt::ckpt::internal {

namespace {

// Calls f(piece, first element, elements, byte offset in the file) for each chunk of the plan, in
// file order (the order of the index and of the checksums).
template <typename F>
void ForEachChunk(const Manifest& m, const std::vector<Piece>& plan, F&& f) {
  for (const Piece& p : plan) {
    for (int64_t e = 0; e < p.count; e += m.chunk_elements) f(p, e, std::min(m.chunk_elements, p.count - e), p.offset + p.Bytes(e));
  }
}

// The index of a data file laid out by PlanFile with the checksums of its chunks (in ForEachChunk's
// order: computed as the snapshot was taken, on the rank that took it).
RankIndex IndexFor(const Manifest& m, const std::vector<Piece>& plan, int shard, const std::vector<uint64_t>& sums, int64_t total) {
  RankIndex idx = IndexOf(m, shard);
  idx.data_bytes = total;
  ForEachChunk(m, plan, [&](const Piece& p, int64_t e, int64_t n, int64_t at) {
    idx.chunks.push_back(ChunkEntry{p.group, p.kind, e, n, at, p.Bytes(n), Codec::kRaw, sums[idx.chunks.size()]});
  });
  return idx;
}

}  // namespace

// Allocates the blocks of [offset, offset + bytes) of the file `fd`, so that writing them through a
// mapping cannot fault for want of space (a full tmpfs: SIGBUS); the error (ENOSPC) comes here.
Status ReserveBlocks(int fd, int64_t offset, int64_t bytes, const std::string& path) {
  if (bytes <= 0) return Status();
  struct stat st {};
  if (offset == 0 && ::fstat(fd, &st) == 0 && st.st_size <= bytes && static_cast<int64_t>(st.st_blocks) * 512 >= bytes) {
    return Status();  // a recycled file whose every block is there (the walk would cost ~6 ms per 150 MiB)
  }
  const int e = ::posix_fallocate(fd, offset, bytes);
  return e == 0 ? Status() : ErrnoStatus(e, "memory tier: no room for " + std::to_string(bytes) + " bytes in " + path);
}

Result<std::vector<Piece>> PlanFile(const Manifest& m, int file, int64_t* total) {
  ASSIGN_OR_RETURN(std::vector<ShardLayout> layouts, SavedLayouts(m));
  std::vector<Piece> plan;
  int64_t off = 0;
  for (size_t g = 0; g < m.groups.size(); ++g) {
    if (ShardIn(m, static_cast<int>(g), file) < 0) continue;  // another file's (a group over a mesh of its own)
    for (size_t k = 0; k < m.groups[g].kinds.size(); ++k) {
      const GroupEntry& ge = m.groups[g];
      const Piece& p = plan.emplace_back(Piece{static_cast<int>(g), static_cast<int>(k), layouts[g].shard_size(), off, ge.format(k)});
      off = AlignUp(off + p.Bytes(p.count));
    }
  }
  *total = plan.empty() ? 0 : plan.back().offset + plan.back().Bytes(plan.back().count);
  return plan;
}

// The chunks' positions in ForEachChunk's order: first[i] is piece i's first chunk; the total last.
std::vector<size_t> FirstChunks(const Manifest& m, const std::vector<Piece>& plan) {
  std::vector<size_t> first{0};
  for (const Piece& p : plan) first.push_back(first.back() + static_cast<size_t>((p.count + m.chunk_elements - 1) / m.chunk_elements));
  return first;
}

// Index and manifest beside a whole data file in `tmp`, then tmp renamed to `final` (replacing it).
Status Seal(const IoEngine& io, const std::string& tmp, const std::string& final, const Manifest& m,
            const std::vector<Piece>& plan, int shard, const std::vector<uint64_t>& sums, int64_t total) {
  RETURN_IF_ERROR(WriteFileDurably(io, tmp, IndexFileName(shard), EncodeIndex(IndexFor(m, plan, shard, sums, total)), kPrivateFileMode));
  RETURN_IF_ERROR(WriteFileDurably(io, tmp, std::string(kManifestFile), EncodeManifest(m), kPrivateFileMode));
  RETURN_IF_ERROR(RemoveTree(final));
  return RenamePath(tmp, final);
}

TierSink::TierSink(const Manifest& m, std::vector<Piece> plan, std::string path, int64_t bytes, std::vector<int> groups)
    : plan_(std::move(plan)), first_(FirstChunks(m, plan_)), groups_(std::move(groups)), chunk_(m.chunk_elements), path_(std::move(path)),
      bytes_(bytes) {
  sums_.assign(first_.back(), 0);
  parts_.resize(plan_.size());
  for (size_t i = 0; i < plan_.size(); ++i) {
    const auto g = static_cast<size_t>(plan_[i].group);
    if (piece_of_group_.size() <= g) piece_of_group_.resize(g + 1, i);
    left_ += plan_[i].count;
  }
}

// Whole chunks from a chunk boundary are copied and hashed in one pass; the rest is copied, and each
// chunk hashed once its last part is there.
Status TierSink::Copy(const Piece& p, Part& part, int64_t offset, int64_t n, const float* data) {
  if (p.format.compact()) return Pack(p, part, offset, n, data);
  char* base = into_.data() + p.offset;
  const size_t first = first_[static_cast<size_t>(&p - plan_.data())];
  int64_t done = 0;
  if (part.hashed == offset && offset % chunk_ == 0) {
    for (int64_t c; done < n && (c = std::min(chunk_, p.count - (offset + done))) <= n - done; done += c) {
      sums_[first + static_cast<size_t>((offset + done) / chunk_)] =
          CopyAndChecksum(base + (offset + done) * 4, data + done, static_cast<size_t>(c) * 4);
    }
    part.hashed = offset + done;
  }
  if (done < n) std::memcpy(base + (offset + done) * 4, data + done, static_cast<size_t>(n - done) * 4);
  HashFilled(p, part, offset + n);
  return Status();
}

// Compact state, packed chunk by chunk as in a disk checkpoint (each chunk's values or codes, then a
// q8 or q4 chunk's scales); each chunk hashed once its last part is there.
Status TierSink::Pack(const Piece& p, Part& part, int64_t offset, int64_t n, const float* data) {
  if (p.blockwise() && (offset % p.format.block != 0 || n % p.format.block != 0)) {
    return InternalError("memory tier: ", PrecisionName(p.format.precision), " state arrived at elements [", offset, ", ", offset + n,
                         "), not whole blocks of ", p.format.block);
  }
  char* base = into_.data() + p.offset;
  for (int64_t done = 0; done < n;) {
    const int64_t c0 = (offset + done) / chunk_ * chunk_, cn = std::min(chunk_, p.count - c0), at = offset + done - c0;
    const int64_t take = std::min(n - done, cn - at);
    char* chunk = base + p.Bytes(c0);
    const StateFormat& f = p.format;
    RETURN_IF_ERROR(f.EncodeExact(data + done, take, chunk + f.ValuesBytes(at), reinterpret_cast<float*>(chunk + f.ValuesBytes(cn)) + f.Scales(at)),
                    "memory tier: group ", p.group, " kind ", p.kind);
    done += take;
  }
  HashFilled(p, part, offset + n);
  return Status();
}

void TierSink::HashFilled(const Piece& p, Part& part, int64_t filled) {
  const char* base = into_.data() + p.offset;
  const size_t first = first_[static_cast<size_t>(&p - plan_.data())];
  part.filled = filled;
  while (part.hashed < part.filled && (part.filled - part.hashed >= chunk_ || part.filled == p.count)) {
    const int64_t c = std::min(chunk_, p.count - part.hashed);
    sums_[first + static_cast<size_t>(part.hashed / chunk_)] = Checksum(base + p.Bytes(part.hashed), static_cast<size_t>(p.Bytes(c)));
    part.hashed += c;
  }
}

Result<size_t> TierSink::Arriving(int view_group, int buffer, int64_t offset, int64_t n) {
  if (abandoned_) return FailedPreconditionError("memory tier: the snapshot no longer takes state");
  if (closed_) return FailedPreconditionError("memory tier: a part came after the snapshot's delivery ended");
  const int group = groups_.empty() ? view_group
                    : view_group >= 0 && static_cast<size_t>(view_group) < groups_.size() ? groups_[static_cast<size_t>(view_group)]
                                                                                             : -1;
  const size_t piece = group >= 0 && static_cast<size_t>(group) < piece_of_group_.size() ? piece_of_group_[static_cast<size_t>(group)] + static_cast<size_t>(buffer) : plan_.size();
  if (buffer < 0 || piece >= plan_.size() || plan_[piece].group != group) {
    return InternalError("memory tier: state arrived for group ", group, " buffer ", buffer, ", which the snapshot does not have");
  }
  const Piece& p = plan_[piece];
  if (offset != parts_[piece].filled || n <= 0 || n > p.count - offset) {
    return InternalError("memory tier: state of group ", group, " buffer ", buffer, " arrived at elements [", offset, ", ", offset + n,
                         "); expected from ", parts_[piece].filled, " of ", p.count);
  }
  if (into_.data() == nullptr && bytes_ > 0) {
    ASSIGN_OR_RETURN(into_, Mapping::Map(path_, bytes_, true));
  }
  return piece;
}

Status TierSink::Put(int group, int buffer, int64_t offset, int64_t n, const float* data) {
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(const size_t piece, Arriving(group, buffer, offset, n));
  RETURN_IF_ERROR(Copy(plan_[piece], parts_[piece], offset, n, data));
  left_ -= n;
  return Status();
}

// Each chunk of a compact piece holds its values or codes, then (q8, q4) its blocks' scales: the part's
// codes and scales are copied to their places in the chunks they fall in.
Status TierSink::PutStored(int group, int buffer, int64_t offset, int64_t n, const StateFormat& format, const void* values,
                           const float* scales) {
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(const size_t piece, Arriving(group, buffer, offset, n));
  const Piece& p = plan_[piece];
  const int64_t block = p.blockwise() ? format.block : 1;
  if (format != p.format || offset % block != 0 || (n % block != 0 && offset + n != p.count)) {
    return InternalError("memory tier: group ", group, " buffer ", buffer, " arrived stored otherwise than the snapshot keeps it");
  }
  char* base = into_.data() + p.offset;
  for (int64_t done = 0; done < n;) {
    const int64_t c0 = (offset + done) / chunk_ * chunk_, cn = std::min(chunk_, p.count - c0), at = offset + done - c0;
    const int64_t take = std::min(n - done, cn - at);
    char* chunk = base + p.Bytes(c0);
    std::memcpy(chunk + format.ValuesBytes(at), static_cast<const char*>(values) + format.ValuesBytes(done), static_cast<size_t>(format.ValuesBytes(take)));
    if (p.blockwise()) {
      std::memcpy(chunk + format.ValuesBytes(cn) + 4 * (at / block), scales + done / block, static_cast<size_t>(format.Scales(take)) * 4);
    }
    done += take;
  }
  HashFilled(p, parts_[piece], offset + n);
  left_ -= n;
  return Status();
}

void TierSink::Waited(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  waited_ += seconds;
}

void TierSink::Close(const Status& status) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return;
  closed_ = true;
  status_ = status.ok() && left_ != 0 ? InternalError("memory tier: the state's owner ended its delivery with ", left_, " elements missing")
                                      : status;
  if (status_.ok() && into_.data() == nullptr && bytes_ > 0) status_ = InternalError("memory tier: nothing of the state arrived");
  cv_.notify_all();
}

void TierSink::Abandon() {
  std::lock_guard<std::mutex> lock(mu_);
  abandoned_ = true;
  into_.Reset();
  if (status_.ok()) status_ = FailedPreconditionError("memory tier: the snapshot was dropped");
  cv_.notify_all();
}

Status TierSink::WaitClosed() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return closed_ || abandoned_; });
  return status_;
}

bool TierSink::closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_ || abandoned_;
}

double TierSink::waited() const {
  std::lock_guard<std::mutex> lock(mu_);
  return waited_;
}

}  // namespace zrt::ckpt::internal
