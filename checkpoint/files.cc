#include "zrt/checkpoint/files.h"

#include <algorithm>
#include <memory>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>

#include "zrt/checkpoint/codec.h"

namespace zrt::ckpt {

Result<CheckpointDir> CheckpointDir::Open(const std::string& path) {
  CheckpointDir d;
  d.path_ = path;
  d.fd_ = UniqueFd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!d.fd_.valid()) {
    const int err = errno;
    struct stat st;
    // O_NOFOLLOW | O_DIRECTORY on a link reports ELOOP or ENOTDIR, depending on the kernel.
    if (err == ELOOP || (err == ENOTDIR && ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode))) {
      return DataLossError(path, ": a symbolic link (checkpoint directories are never followed through links)");
    }
    if (err == ENOTDIR) return DataLossError(path, ": not a directory");
    return ErrnoStatus(err, "opening checkpoint directory " + path);
  }
  return d;
}

Result<std::string> CheckpointDir::ReadFile(std::string_view name, int64_t max_bytes) const {
  const std::string path = PathOf(name);
  ASSIGN_OR_RETURN(IoFile f, IoFile::OpenAt(fd(), std::string(name), path, IoFile::Mode::kRead, /*direct=*/false));
  ASSIGN_OR_RETURN(int64_t size, f.Size());
  if (size > max_bytes) return DataLossError(path, ": ", size, " bytes, more than the ", max_bytes, " a checkpoint file may have");
  std::string text(static_cast<size_t>(size), '\0');
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::pread(f.fd(), text.data() + done, text.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus(errno, "reading " + path);
    if (n == 0) return DataLossError(path, ": shorter than its size while being read");
    done += static_cast<size_t>(n);
  }
  return text;
}

Result<IoFile> CheckpointDir::OpenData(std::string_view name, int64_t expected_bytes) const {
  const std::string path = PathOf(name);
  ASSIGN_OR_RETURN(IoFile f, IoFile::OpenAt(fd(), std::string(name), path, IoFile::Mode::kRead));
  ASSIGN_OR_RETURN(int64_t size, f.Size());
  if (size != expected_bytes) {
    return DataLossError(path, ": ", size, " bytes, the index says ", expected_bytes, size < expected_bytes ? " (truncated)" : "");
  }
  return f;
}

Result<std::vector<std::string>> CheckpointDir::List() const {
  // A second descriptor: readdir consumes the one it is given.
  UniqueFd copy(::openat(fd(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!copy.valid()) return ErrnoStatus(errno, "listing " + path_);
  DIR* d = ::fdopendir(copy.get());
  if (d == nullptr) return ErrnoStatus(errno, "listing " + path_);
  (void)std::move(copy).Release();  // owned by d now
  std::vector<std::string> names;
  while (const dirent* e = ::readdir(d)) {
    const std::string_view n = e->d_name;
    if (n != "." && n != "..") names.emplace_back(n);
  }
  ::closedir(d);
  return names;
}

Result<Manifest> ReadManifest(const CheckpointDir& dir) {
  const std::string path = dir.PathOf(kManifestFile);
  ASSIGN_OR_RETURN(std::string text, dir.ReadFile(kManifestFile));
  ASSIGN_OR_RETURN(Manifest m, DecodeManifest(text, path));
  // The directory's name, when it is a step name, is the manifest's step.
  std::string base = std::filesystem::path(dir.path()).filename().string();
  if (base.empty()) base = std::filesystem::path(dir.path()).parent_path().filename().string();  // a trailing '/'
  if (const size_t tmp = base.find(".tmp-"); tmp != std::string::npos) base.resize(tmp);
  if (auto named = ParseStepDirName(base); named.ok() && *named != m.step) {
    return DataLossError(path, ": step ", m.step, " in a directory named for step ", *named);
  }
  return m;
}

Result<Manifest> ReadManifest(const std::string& dir) {
  ASSIGN_OR_RETURN(CheckpointDir d, CheckpointDir::Open(dir));
  return ReadManifest(d);
}

Result<std::vector<RankIndex>> ReadShardIndexes(const CheckpointDir& dir, const Manifest& m, std::span<const ShardLayout> layouts,
                                                int rank) {
  std::vector<RankIndex> parts;
  for (int p = 0; p < m.parts; ++p) {
    const std::string name = IndexFileName(rank, p, m.parts), path = dir.PathOf(name);
    ASSIGN_OR_RETURN(std::string text, dir.ReadFile(name));
    ASSIGN_OR_RETURN(RankIndex r, DecodeIndex(text, path));
    RETURN_IF_ERROR(ValidateIndexFile(m, layouts, r, rank, p, path));
    parts.push_back(std::move(r));
  }
  RETURN_IF_ERROR(ValidateCover(m, layouts, parts, dir.PathOf(IndexFileName(rank, 0, m.parts)) + (m.parts > 1 ? " (and its other parts)" : "")));
  return parts;
}

Result<RankIndex> ReadIndex(const CheckpointDir& dir, const Manifest& m, std::span<const ShardLayout> layouts, int rank) {
  if (m.parts != 1) return DataLossError(dir.path(), ": shard ", rank, " was saved in ", m.parts, " parts (read them all)");
  ASSIGN_OR_RETURN(std::vector<RankIndex> parts, ReadShardIndexes(dir, m, layouts, rank));
  return std::move(parts[0]);
}

namespace {

struct AlignedBytes {
  explicit AlignedBytes(size_t n) : p(static_cast<char*>(std::aligned_alloc(kIoAlignment, (n / kIoAlignment + 1) * kIoAlignment))) {}
  bool ok() const { return p != nullptr; }
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
                          TensorsIn(m, l, c.group, std::max(0, ShardIn(m, c.group, r.rank)), c.elem_offset, c.elem_offset + c.elements), ")");
}

namespace {

// One aligned buffer per thread, grown to the largest chunk read (a fresh allocation per chunk paid
// for its page faults and zeroing on every read).
Result<char*> ThreadBuffer(size_t bytes) {
  thread_local std::unique_ptr<AlignedBytes> held;
  thread_local size_t held_bytes = 0;
  if (!held || held_bytes < bytes) {
    held.reset();
    held = std::make_unique<AlignedBytes>(bytes);
    held_bytes = held->ok() ? bytes : 0;
  }
  if (!held->ok()) return OutOfMemoryError("no memory for ", bytes, " bytes of chunk buffer");
  return held->p;
}

}  // namespace

bool ChunkInPlace(const Manifest& m, const ChunkEntry& c) {
  return c.codec == Codec::kRaw && m.groups[static_cast<size_t>(c.group)].stored_as(static_cast<size_t>(c.kind)) == Precision::kF32;
}

Status CheckRawChunkSize(const IoFile& f, const Manifest& m, const ShardLayout& l, const RankIndex& r, size_t k) {
  const ChunkEntry& c = r.chunks[k];
  const GroupEntry& ge = m.groups[static_cast<size_t>(c.group)];
  const int64_t bytes = ge.format(static_cast<size_t>(c.kind)).Bytes(c.elements);
  if (c.codec == Codec::kRaw && c.stored_bytes != bytes) {  // before reading: `out` holds the elements
    return DataLossError(f.path(), ": ", ChunkName(m, l, r, k), ": raw chunk of ", c.stored_bytes, " bytes, expected ", bytes);
  }
  return Status();
}

Status FinishChunkRead(const IoFile& f, const Manifest& m, const ShardLayout& l, const RankIndex& r, size_t k, const char* stored,
                       float* out, std::vector<char>* scratch) {
  const ChunkEntry& c = r.chunks[k];
  const GroupEntry& ge = m.groups[static_cast<size_t>(c.group)];
  const StateFormat form = ge.format(static_cast<size_t>(c.kind));
  // A raw f32 chunk stored elsewhere (a mapped file) is copied and hashed in one pass.
  const bool copy = ChunkInPlace(m, c) && stored != reinterpret_cast<const char*>(out);
  const uint64_t sum = copy ? CopyAndChecksum(out, stored, static_cast<size_t>(c.stored_bytes)) : Checksum(stored, static_cast<size_t>(c.stored_bytes));
  if (sum != c.xxh3) return DataLossError(f.path(), ": ", ChunkName(m, l, r, k), ": checksum mismatch (the data is corrupt)");
  if (!form.compact()) {
    if (c.codec != Codec::kRaw) {
      RETURN_IF_ERROR(DecodeChunk(c.codec, stored, static_cast<size_t>(c.stored_bytes), out, static_cast<size_t>(c.elements) * 4, 4, scratch),
                      f.path(), ": ", ChunkName(m, l, r, k));
    }
    return Status();
  }
  // A compact kind (core/state_view.h): its stored form, decompressed if need be, checked, decoded.
  const char* packed = stored;
  if (c.codec != Codec::kRaw) {
    thread_local std::vector<char> unpacked;
    unpacked.resize(static_cast<size_t>(form.Bytes(c.elements)));
    RETURN_IF_ERROR(DecodeChunk(c.codec, stored, static_cast<size_t>(c.stored_bytes), unpacked.data(), unpacked.size(),
                                static_cast<size_t>(form.value_bytes()), scratch),
                    f.path(), ": ", ChunkName(m, l, r, k));
    packed = unpacked.data();
  }
  RETURN_IF_ERROR(form.DecodeChecked(packed, reinterpret_cast<const float*>(packed + form.ValuesBytes(c.elements)), c.elements, out),
                  f.path(), ": ", ChunkName(m, l, r, k));
  return Status();
}

Status ReadChunkInto(IoEngine& io, const IoFile& f, const Manifest& m, const ShardLayout& l, const RankIndex& r, size_t k,
                     float* out, std::vector<char>* scratch, int64_t* bytes_read) {
  const ChunkEntry& c = r.chunks[k];
  RETURN_IF_ERROR(CheckRawChunkSize(f, m, l, r, k));
  char* buf = reinterpret_cast<char*>(out);  // raw f32: the stored bytes are the elements, read where they go
  if (!ChunkInPlace(m, c)) {
    ASSIGN_OR_RETURN(buf, ThreadBuffer(static_cast<size_t>(c.stored_bytes)), ChunkName(m, l, r, k));
  }
  RETURN_IF_ERROR(io.ReadSync(f, buf, static_cast<size_t>(c.stored_bytes), c.file_offset), ChunkName(m, l, r, k));
  *bytes_read += c.stored_bytes;
  return FinishChunkRead(f, m, l, r, k, buf, out, scratch);
}

Result<const char*> StoredChunk(IoEngine& io, const IoFile& f, const Manifest& m, const ShardLayout& l, const RankIndex& r, size_t k,
                                const char* mapped, std::vector<char>* unpacked, std::vector<char>* scratch, int64_t* bytes_read) {
  const ChunkEntry& c = r.chunks[k];
  const GroupEntry& ge = m.groups[static_cast<size_t>(c.group)];
  const StateFormat form = ge.format(static_cast<size_t>(c.kind));
  if (!form.compact()) return InvalidArgumentError(f.path(), ": ", ChunkName(m, l, r, k), " is f32 values, not a compact form");
  RETURN_IF_ERROR(CheckRawChunkSize(f, m, l, r, k));
  const char* stored = mapped;
  if (stored == nullptr) {
    ASSIGN_OR_RETURN(char* buf, ThreadBuffer(static_cast<size_t>(c.stored_bytes)), ChunkName(m, l, r, k));
    RETURN_IF_ERROR(io.ReadSync(f, buf, static_cast<size_t>(c.stored_bytes), c.file_offset), ChunkName(m, l, r, k));
    stored = buf;
  }
  if (Checksum(stored, static_cast<size_t>(c.stored_bytes)) != c.xxh3) {
    return DataLossError(f.path(), ": ", ChunkName(m, l, r, k), ": checksum mismatch (the data is corrupt)");
  }
  *bytes_read += c.stored_bytes;
  if (c.codec != Codec::kRaw) {
    unpacked->resize(static_cast<size_t>(form.Bytes(c.elements)));
    RETURN_IF_ERROR(DecodeChunk(c.codec, stored, static_cast<size_t>(c.stored_bytes), unpacked->data(), unpacked->size(),
                                static_cast<size_t>(form.value_bytes()), scratch),
                    f.path(), ": ", ChunkName(m, l, r, k));
    stored = unpacked->data();
  }
  RETURN_IF_ERROR(form.Check(stored, reinterpret_cast<const float*>(stored + form.ValuesBytes(c.elements)), c.elements), f.path(), ": ",
                  ChunkName(m, l, r, k));
  return stored;
}

Status ReadChunk(IoEngine& io, const IoFile& f, const Manifest& m, const ShardLayout& l, const RankIndex& r, size_t k,
                 std::vector<float>* out, std::vector<char>* scratch, int64_t* bytes_read) {
  const ChunkEntry& c = r.chunks[k];
  RETURN_IF_ERROR(CheckRawChunkSize(f, m, l, r, k));
  ASSIGN_OR_RETURN(char* buf, ThreadBuffer(static_cast<size_t>(c.stored_bytes)), ChunkName(m, l, r, k));
  RETURN_IF_ERROR(io.ReadSync(f, buf, static_cast<size_t>(c.stored_bytes), c.file_offset), ChunkName(m, l, r, k));
  *bytes_read += c.stored_bytes;
  out->resize(static_cast<size_t>(c.elements));
  return FinishChunkRead(f, m, l, r, k, buf, out->data(), scratch);
}

}  // namespace zrt::ckpt
