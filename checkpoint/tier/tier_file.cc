// One rank's snapshot file in the memory tier (tier_file.h).
#include "zrt/checkpoint/tier/tier_file.h"

#include <algorithm>
#include <cstring>

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
    for (int64_t e = 0; e < p.count; e += m.chunk_elements) f(p, e, std::min(m.chunk_elements, p.count - e), p.offset + e * 4);
  }
}

// The index of a data file laid out by PlanFile with the checksums of its chunks (in ForEachChunk's
// order: computed as the snapshot was taken, on the rank that took it).
RankIndex IndexFor(const Manifest& m, const std::vector<Piece>& plan, int shard, const std::vector<uint64_t>& sums, int64_t total) {
  RankIndex idx = IndexOf(m, shard);
  idx.data_bytes = total;
  ForEachChunk(m, plan, [&](const Piece& p, int64_t e, int64_t n, int64_t at) {
    idx.chunks.push_back(ChunkEntry{p.group, p.kind, e, n, at, n * 4, Codec::kRaw, sums[idx.chunks.size()]});
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

Result<std::vector<Piece>> PlanFile(const Manifest& m, int64_t* total) {
  ASSIGN_OR_RETURN(std::vector<ShardLayout> layouts, SavedLayouts(m));
  std::vector<Piece> plan;
  int64_t off = 0;
  for (size_t g = 0; g < m.groups.size(); ++g) {
    for (size_t k = 0; k < m.groups[g].kinds.size(); ++k) {
      const int64_t count = layouts[g].shard_size();
      plan.push_back({static_cast<int>(g), static_cast<int>(k), count, off});
      off = AlignUp(off + count * 4);
    }
  }
  *total = plan.empty() ? 0 : plan.back().offset + plan.back().count * 4;
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
  RETURN_IF_ERROR(WriteFileDurably(io, tmp, IndexFileName(shard), EncodeIndex(IndexFor(m, plan, shard, sums, total))));
  RETURN_IF_ERROR(WriteFileDurably(io, tmp, std::string(kManifestFile), EncodeManifest(m)));
  RETURN_IF_ERROR(RemoveTree(final));
  return RenamePath(tmp, final);
}

// This rank's state copied into `into` (a mapping of the new data file) chunk by chunk, each chunk
// checksummed while it is still in cache: the one pass over the state training waits for. Buffers
// that arrive later (Arrives) are left to the Arrival; their checksums too.
Status Snapshot(const StateView& state, const Manifest& m, const std::vector<Piece>& plan, const Mapping& into,
                std::vector<uint64_t>* sums) {
  const std::vector<size_t> first = FirstChunks(m, plan);
  sums->assign(first.back(), 0);
  size_t i = 0;
  for (const StateGroup& g : state.groups) {
    for (const StateBuffer& b : g.buffers) {
      const Piece& p = plan[i];
      size_t sum = first[i++];
      if (b.count != p.count) return InternalError("memory tier: group '", g.name, "' ", b.kind, " has ", b.count, " elements, planned ", p.count);
      if (Arrives(state, b)) continue;
      if (!b.resident() && !b.read) {
        return InvalidArgumentError("memory tier: state '", b.kind, "' of group '", g.name, "' is not resident and has no read");
      }
      RETURN_IF_ERROR(into.Reserve(p.offset, p.count * 4));  // beside state that arrives later, the file is not reserved whole
      for (int64_t e = 0; e < p.count; e += m.chunk_elements) {
        const int64_t n = std::min(m.chunk_elements, p.count - e);
        char* to = into.data() + p.offset + e * 4;
        const size_t bytes = static_cast<size_t>(n) * 4;
        if (b.data != nullptr) {
          (*sums)[sum++] = CopyAndChecksum(to, static_cast<const float*>(b.data) + e, bytes);
        } else {
          RETURN_IF_ERROR(b.read(e, n, to), "memory tier: reading state '", b.kind, "' of group '", g.name, "'");
          (*sums)[sum++] = Checksum(to, bytes);
        }
      }
    }
  }
  return Status();
}

Arrival::Arrival(const StateView& state, const Manifest& m, const std::vector<Piece>& plan, const Mapping& into, std::vector<uint64_t>* sums)
    : plan_(plan), first_(FirstChunks(m, plan)), chunk_(m.chunk_elements), into_(into), base_(into.data()), sums_(sums) {
  size_t i = 0;
  for (const StateGroup& g : state.groups) {
    std::vector<Part>& parts = parts_.emplace_back();
    for (const StateBuffer& b : g.buffers) {
      parts.push_back({i++, Arrives(state, b)});
      if (parts.back().arrives) left_ += b.count;
    }
  }
}

Status Arrival::Put(int group, int buffer, int64_t offset, int64_t n, const float* data) {
  if (abandoned_) return FailedPreconditionError("memory tier: the snapshot no longer takes state");
  if (group < 0 || static_cast<size_t>(group) >= parts_.size() || buffer < 0 ||
      static_cast<size_t>(buffer) >= parts_[static_cast<size_t>(group)].size()) {
    return InternalError("memory tier: state arrived for group ", group, " buffer ", buffer, ", which the snapshot does not have");
  }
  Part& part = parts_[static_cast<size_t>(group)][static_cast<size_t>(buffer)];
  const Piece& p = plan_[part.piece];
  if (!part.arrives || offset != part.filled || n <= 0 || n > p.count - offset) {
    return InternalError("memory tier: state of group ", group, " buffer ", buffer, " arrived at elements [", offset, ", ",
                         offset + n, "); expected from ", part.filled, " of ", part.arrives ? p.count : 0);
  }
  RETURN_IF_ERROR(into_.Reserve(p.offset + offset * 4, n * 4));
  std::memcpy(base_ + p.offset + offset * 4, data, static_cast<size_t>(n) * 4);
  part.filled += n;
  left_ -= n;
  while (part.hashed < part.filled && (part.filled - part.hashed >= chunk_ || part.filled == p.count)) {
    const int64_t c = std::min(chunk_, p.count - part.hashed);
    (*sums_)[first_[part.piece] + static_cast<size_t>(part.hashed / chunk_)] =
        Checksum(base_ + p.offset + part.hashed * 4, static_cast<size_t>(c) * 4);
    part.hashed += c;
  }
  return Status();
}

}  // namespace zrt::ckpt::internal
