#include "zrt/checkpoint/files.h"

#include <cstdlib>

#include "zrt/checkpoint/codec.h"
#include "zrt/checkpoint/fs_util.h"

namespace zrt::ckpt {

Result<Manifest> ReadManifest(const std::string& dir) {
  const std::string path = dir + "/" + std::string(kManifestFile);
  ASSIGN_OR_RETURN(std::string text, ReadWholeFile(path));
  return DecodeManifest(text, path);
}

Result<RankIndex> ReadIndex(const std::string& dir, int rank) {
  const std::string path = dir + "/" + IndexFileName(rank);
  ASSIGN_OR_RETURN(std::string text, ReadWholeFile(path));
  ASSIGN_OR_RETURN(RankIndex r, DecodeIndex(text, path));
  if (r.rank != rank) return DataLossError(path, ": index of rank ", r.rank, " under the name of rank ", rank);
  return r;
}

namespace {

struct AlignedBytes {
  explicit AlignedBytes(size_t n) : p(static_cast<char*>(std::aligned_alloc(kIoAlignment, (n / kIoAlignment + 1) * kIoAlignment))) {}
  ~AlignedBytes() { std::free(p); }
  AlignedBytes(const AlignedBytes&) = delete;
  AlignedBytes& operator=(const AlignedBytes&) = delete;
  char* p;
};

// "tensors a, b, c" overlapping elements [begin, end) of `rank`'s shard.
std::string TensorsIn(const Manifest& m, const ShardLayout& l, int group, int rank, int64_t begin, int64_t end) {
  std::string out;
  int named = 0;
  for (const ShardPiece& p : l.RankPieces(rank)) {
    if (p.shard_offset + p.count <= begin || p.shard_offset >= end) continue;
    if (named == 3) {
      out += ", ...";
      break;
    }
    out += (named++ ? ", " : "") + m.groups[static_cast<size_t>(group)].tensors[static_cast<size_t>(p.tensor)].name;
  }
  return named ? "tensors " + out : "padding only";
}

}  // namespace

std::string ChunkName(const Manifest& m, const ShardLayout& l, const RankIndex& r, size_t k) {
  const ChunkEntry& c = r.chunks[k];
  const GroupEntry& g = m.groups[static_cast<size_t>(c.group)];
  return ::zrt::internal::StrCat(r.data_file, " chunk ", k, " (group '", g.name, "', ",
                          c.kind >= 0 && c.kind < static_cast<int>(g.kinds.size()) ? g.kinds[static_cast<size_t>(c.kind)] : "?",
                          ", elements ", c.elem_offset, "..", c.elem_offset + c.elements, ", ",
                          TensorsIn(m, l, c.group, r.rank, c.elem_offset, c.elem_offset + c.elements), ")");
}

Status ReadChunk(IoEngine& io, const IoFile& f, const Manifest& m, const ShardLayout& l, const RankIndex& r, size_t k,
                 std::vector<float>* out, std::vector<char>* scratch, int64_t* bytes_read) {
  const ChunkEntry& c = r.chunks[k];
  AlignedBytes buf(static_cast<size_t>(c.stored_bytes));
  RETURN_IF_ERROR(io.ReadSync(f, buf.p, static_cast<size_t>(c.stored_bytes), c.file_offset), ChunkName(m, l, r, k));
  *bytes_read += c.stored_bytes;
  if (Checksum(buf.p, static_cast<size_t>(c.stored_bytes)) != c.xxh3) {
    return DataLossError(f.path(), ": ", ChunkName(m, l, r, k), ": checksum mismatch (the data is corrupt)");
  }
  out->resize(static_cast<size_t>(c.elements));
  RETURN_IF_ERROR(DecodeChunk(c.codec, buf.p, static_cast<size_t>(c.stored_bytes), out->data(),
                              static_cast<size_t>(c.elements) * 4, 4, scratch),
                  f.path(), ": ", ChunkName(m, l, r, k));
  return Status();
}

}  // namespace zrt::ckpt
