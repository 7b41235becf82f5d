// One rank's snapshot file in the memory tier (memory_tier.cc is the protocol around it): the file's
// layout (raw chunks, each buffer 4 KiB-aligned: what WriteShard gives uncompressed state), its shared
// mapping with reserved blocks, the sink a capture streams the state into (one pass: each chunk copied
// and checksummed while it is in cache), and the index and manifest that make it an ordinary
// checkpoint directory. Internal to zrt_checkpoint.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "zrt/checkpoint/format.h"
#include "zrt/core/base.h"
#include "zrt/core/private_dir.h"
#include "zrt/core/state_view.h"
#include "zrt/core/status.h"
#include "zrt/core/unique_fd.h"
#include "zrt/offload/io_engine.h"

namespace zrt::ckpt::internal {

constexpr int64_t kAlign = static_cast<int64_t>(kIoAlignment);
inline int64_t AlignUp(int64_t x) { return zrt::AlignUp(x, kAlign); }

// Allocates the blocks of [offset, offset + bytes) of the file `fd`, so that writing them through a
// mapping cannot fault for want of space (a full tmpfs: SIGBUS); the error (ENOSPC) comes here.
Status ReserveBlocks(int fd, int64_t offset, int64_t bytes, const std::string& path);

// A read-only or writable shared mapping of a whole file, its page tables filled at once unless told
// otherwise (MAP_POPULATE: one pass instead of a fault per page while training waits or the replica
// arrives).
class Mapping {
 public:
  Mapping() = default;
  Mapping(Mapping&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)), fd_(std::move(o.fd_)), path_(std::move(o.path_)), reserved_(o.reserved_) {}
  Mapping& operator=(Mapping&& o) noexcept {
    if (this != &o) {
      Reset();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
      fd_ = std::move(o.fd_);
      path_ = std::move(o.path_);
      reserved_ = o.reserved_;
    }
    return *this;
  }
  ~Mapping() { Reset(); }
  void Reset() {
    if (p_ != nullptr) ::munmap(p_, n_);
    p_ = nullptr;
    n_ = 0;
    fd_ = UniqueFd();
  }
  char* data() const { return static_cast<char*>(p_); }
  size_t size() const { return n_; }

  // ReserveBlocks for part of a created mapping (nothing to do where Map reserved the whole file).
  Status Reserve(int64_t offset, int64_t bytes) const { return reserved_ ? Status() : ReserveBlocks(fd_.get(), offset, bytes, path_); }

  // `create`: a new file of `bytes` (writable), its blocks reserved (Reserve); else the existing file,
  // read-only, which must be `bytes` long (-1: whatever it is). `populate` false: nothing reserved or
  // mapped in advance (state that arrives with the next step reserves each part as it comes: a new
  // file's pages are then allocated there, not while training waits).
  static Result<Mapping> Map(const std::string& path, int64_t bytes, bool create, bool populate = true) {
    // Created files are not truncated: a recycled one (Recycle) keeps its memory pages.
    UniqueFd fd(::open(path.c_str(), create ? (O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC) : (O_RDONLY | O_NOFOLLOW | O_CLOEXEC), kPrivateFileMode));
    if (!fd.valid()) return ErrnoStatus(errno, "memory tier: opening " + path);
    if (create) {
      if (::fchmod(fd.get(), kPrivateFileMode) != 0) return ErrnoStatus(errno, "memory tier: " + path);  // a recycled file too
      if (::ftruncate(fd.get(), bytes) != 0) return ErrnoStatus(errno, "memory tier: sizing " + path);
    } else {
      struct stat st {};
      if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "memory tier: " + path);
      if (bytes >= 0 && st.st_size != bytes) return DataLossError(path, ": ", st.st_size, " bytes, expected ", bytes);
      bytes = st.st_size;
    }
    Mapping m;
    m.path_ = path;
    if (create && populate) {
      RETURN_IF_ERROR(ReserveBlocks(fd.get(), 0, bytes, path));
      m.reserved_ = true;
    }
    if (bytes == 0) return m;
    void* p = ::mmap(nullptr, static_cast<size_t>(bytes), create ? (PROT_READ | PROT_WRITE) : PROT_READ,
                     MAP_SHARED | (populate ? MAP_POPULATE : 0), fd.get(), 0);
    if (p == MAP_FAILED) return ErrnoStatus(errno, "memory tier: mapping " + path);
    m.p_ = p;
    m.n_ = static_cast<size_t>(bytes);
    if (create) m.fd_ = std::move(fd);
    return m;
  }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
  UniqueFd fd_;  // created mappings: for Reserve
  std::string path_;
  bool reserved_ = false;
};

// Where each (group, kind) of a shard lies in its data file: raw chunks, each buffer 4 KiB-aligned
// (the layout WriteShard gives uncompressed state); `group` is the manifest's.
struct Piece {
  int group, kind;
  int64_t count, offset;
  StateFormat format;  // compact state: stored as kept (format.h), packed as it arrives
  bool blockwise() const { return format.blockwise(); }  // q8, q4: codes with blocks' scales
  int64_t Bytes(int64_t elements) const { return format.Bytes(elements); }
};
// The pieces of file `file` (rank-<file>.data): every (group, kind) of the groups it holds (all of
// them unless groups list their files: format.h ShardIn), in manifest order.
Result<std::vector<Piece>> PlanFile(const Manifest& m, int file, int64_t* total);

// The chunks' positions in ForEachChunk's order: first[i] is piece i's first chunk; the total last.
std::vector<size_t> FirstChunks(const Manifest& m, const std::vector<Piece>& plan);

// Index and manifest beside a whole data file in `tmp`, then tmp renamed to `final` (replacing it).
Status Seal(const IoEngine& io, const std::string& tmp, const std::string& final, const Manifest& m,
            const std::vector<Piece>& plan, int shard, const std::vector<uint64_t>& sums, int64_t total);

// The memory tier's sink of a capture (core/state_view.h): each part is copied into the snapshot's
// data file, a shared mapping of `path` (created, its blocks reserved and its pages populated at the
// first part, on that producer's thread: the owner's capture thread for memory), each chunk
// checksummed while it is still in cache when a part brings it whole from a chunk boundary, else once
// its last part came. The generation waits for Close (WaitClosed) before it reads the mapping and the
// checksums; Abandon (the generation is dropped) unmaps at once and refuses what comes after.
// Thread-safety: every method from any thread (a mutex; Put holds it while it copies).
class TierSink final : public StateSink {
 public:
  // `groups`: the view's group g is the manifest's groups[g] (SnapshotStart::groups; empty: g).
  TierSink(const Manifest& m, std::vector<Piece> plan, std::string path, int64_t bytes, std::vector<int> groups = {});

  Status Put(int group, int buffer, int64_t offset, int64_t n, const float* data) override;
  // Compact state as the owner keeps it: copied into its chunks as they are stored (nothing encoded).
  Status PutStored(int group, int buffer, int64_t offset, int64_t n, const StateFormat& format, const void* values,
                   const float* scales) override;
  void Waited(double seconds) override;
  void Close(const Status& status) override;
  void Abandon();
  // Blocks until closed (or abandoned); the delivery's outcome.
  Status WaitClosed();
  bool closed() const;
  double waited() const;
  // After WaitClosed returned OK: the data file's mapping and the chunks' checksums (FirstChunks' order).
  const Mapping& mapping() const { return into_; }
  const std::vector<uint64_t>& sums() const { return sums_; }

 private:
  struct Part {
    int64_t filled = 0, hashed = 0;
  };
  Status Copy(const Piece& p, Part& part, int64_t offset, int64_t n, const float* data);
  Status Pack(const Piece& p, Part& part, int64_t offset, int64_t n, const float* data);  // compact pieces
  // The piece a part of (group, buffer) at [offset, offset + n) fills, checked (the mapping made at the first part).
  Result<size_t> Arriving(int group, int buffer, int64_t offset, int64_t n);
  // The piece filled up to `filled`: each chunk not hashed yet hashed once its last part is there.
  void HashFilled(const Piece& p, Part& part, int64_t filled);
  const std::vector<Piece> plan_;
  const std::vector<size_t> first_;  // per piece: its first chunk's checksum
  std::vector<size_t> piece_of_group_;  // the manifest's group g's buffer b is piece piece_of_group_[g] + b
  const std::vector<int> groups_;       // the view's group -> the manifest's (empty: the same)
  const int64_t chunk_;
  const std::string path_;
  const int64_t bytes_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  Mapping into_;
  std::vector<uint64_t> sums_;
  std::vector<Part> parts_;
  int64_t left_ = 0;  // elements still to come
  bool closed_ = false, abandoned_ = false;
  Status status_;
  double waited_ = 0;
};

}  // namespace zrt::ckpt::internal
