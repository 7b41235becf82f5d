// Reading a checkpoint directory's files as untrusted input (../shared/DESIGN.md "Checkpoints" 7): the
// manifest, the per-rank indexes and data chunks, each checked against the format's rules
// (docs/checkpoint-format.md) before anything it says is used, with errors that name the file, chunk,
// group, kind and tensors. Shared by verify, catalog and load.
//
// Every file is opened beneath the directory's descriptor: names are single path components (a
// data_file of "../x" is refused by ValidateIndex before any open, and OpenAt refuses '/' again) and
// O_NOFOLLOW on that one component means no symbolic link is ever followed; the directory itself must
// not be a symbolic link either. One component and no links is what openat2's RESOLVE_BENEATH |
// RESOLVE_NO_SYMLINKS would enforce, without needing a 5.6 kernel.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "zrt/checkpoint/format.h"
#include "zrt/core/shard_layout.h"
#include "zrt/core/unique_fd.h"
#include "zrt/offload/io_engine.h"

namespace zrt::ckpt {

// A checkpoint directory opened for reading. Move-only.
class CheckpointDir {
 public:
  // NotFound when `path` does not exist; DataLoss when it is a symbolic link or not a directory.
  static Result<CheckpointDir> Open(const std::string& path);
  const std::string& path() const { return path_; }
  int fd() const { return fd_.get(); }
  std::string PathOf(std::string_view name) const { return path_ + "/" + std::string(name); }

  // A whole small file (manifest, index): refused beyond `max_bytes`; NotFound when missing.
  Result<std::string> ReadFile(std::string_view name, int64_t max_bytes = kMaxJsonBytes) const;
  // A data file for the I/O engine; its size must be `expected_bytes` (a truncated or grown file is
  // DataLoss).
  Result<IoFile> OpenData(std::string_view name, int64_t expected_bytes) const;
  // The names of the directory's entries (what is there, bounding every loop over shards).
  Result<std::vector<std::string>> List() const;

 private:
  std::string path_;
  UniqueFd fd_;
};

// The manifest, decoded and checked (format.h DecodeManifest); when the directory is named step-N
// (or step-N.tmp-...), N must be the manifest's step.
Result<Manifest> ReadManifest(const CheckpointDir& dir);
// The index files of shard `rank`'s parts (one unless the save was spread: Manifest::parts), each
// decoded and checked against the manifest, and their chunks covering every (group, kind) of the
// shard exactly once (format.h ValidateIndexFile, ValidateCover); `layouts` are SavedLayouts(m).
Result<std::vector<RankIndex>> ReadShardIndexes(const CheckpointDir& dir, const Manifest& m, std::span<const ShardLayout> layouts,
                                                int rank);
// The same for a checkpoint of one part per shard: its index (a spread one is refused).
Result<RankIndex> ReadIndex(const CheckpointDir& dir, const Manifest& m, std::span<const ShardLayout> layouts, int rank);

// "rank-00001.data chunk 17 (group 'layer0', exp_avg, elements 0..4096, tensors w1, w2)".
// `l` is the saved layout of the chunk's group.
std::string ChunkName(const Manifest& m, const ShardLayout& l, const RankIndex& r, size_t k);

// Reads chunk k of a rank's data file `f` (the index validated), checks its checksum and decodes it
// into `out` (its elements, fp32; a bf16 or q8 kind's stored form checked and decoded:
// StateFormat::DecodeChecked, core/state_view.h). `scratch` is reused between calls; *bytes_read grows
// by the stored bytes.
Status ReadChunk(IoEngine& io, const IoFile& f, const Manifest& m, const ShardLayout& l, const RankIndex& r, size_t k,
                 std::vector<float>* out, std::vector<char>* scratch, int64_t* bytes_read);
// The same into `out`, kIoAlignment-aligned with room for max(elements * 4, stored bytes) rounded up
// to kIoAlignment: a raw f32 chunk (ChunkInPlace) is read straight into it (O_DIRECT) and checked in
// place, no copy.
Status ReadChunkInto(IoEngine& io, const IoFile& f, const Manifest& m, const ShardLayout& l, const RankIndex& r, size_t k,
                     float* out, std::vector<char>* scratch, int64_t* bytes_read);
// Whether a chunk's stored bytes are its f32 elements (raw and an f32 kind): read where they go.
bool ChunkInPlace(const Manifest& m, const ChunkEntry& c);
// The halves of ReadChunkInto for a caller that issues the read itself (Load's read-ahead): a raw
// chunk's stored size must be its stored form's (checked before reading into `out`); then `stored`
// (chunk k's bytes as read: `out` itself for a chunk read in place, or anywhere else, such as a mapped
// file) is checked against its checksum and decoded into out (a raw f32 chunk stored elsewhere: copied
// and hashed in one pass, so `out` holds the bytes even when they fail the check).
Status CheckRawChunkSize(const IoFile& f, const Manifest& m, const ShardLayout& l, const RankIndex& r, size_t k);
// Chunk k of a compact kind as it is stored (bf16 values, or q8 codes then their blocks' scales):
// read (or, `mapped` not null, its bytes there), checked against its checksum, decompressed into
// `unpacked` where compressed, and checked to be a form encoding writes (StateFormat::Check).
// Returns where the form is, valid until the next call on this thread or `unpacked` changes.
Result<const char*> StoredChunk(IoEngine& io, const IoFile& f, const Manifest& m, const ShardLayout& l, const RankIndex& r, size_t k,
                                const char* mapped, std::vector<char>* unpacked, std::vector<char>* scratch, int64_t* bytes_read);
Status FinishChunkRead(const IoFile& f, const Manifest& m, const ShardLayout& l, const RankIndex& r, size_t k, const char* stored,
                       float* out, std::vector<char>* scratch);

}  // namespace zrt::ckpt
