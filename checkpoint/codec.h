// Chunk encoding (compression.h's codecs): a chunk that does not shrink is stored raw. xxh3-64 over
// the stored bytes.
#pragma once

#include <cstdint>
#include <vector>

#include "zrt/checkpoint/options.h"
#include "zrt/core/state_view.h"
#include "zrt/core/status.h"

namespace zrt::ckpt {

// Encodes `bytes` of elements of `elem_size` bytes into `out` and returns the codec used (kRaw when
// compression is off or does not shrink the chunk; then `out` is left empty and the caller writes
// `raw` itself). `scratch` is reused between calls.
Result<Codec> EncodeChunk(const void* raw, size_t bytes, size_t elem_size, const CompressOptions& options,
                          std::vector<char>* scratch, std::vector<char>* out);

// Decodes a stored chunk into exactly `raw_bytes` bytes at `raw_out`. DataLoss on any inconsistency.
Status DecodeChunk(Codec codec, const void* stored, size_t stored_bytes, void* raw_out, size_t raw_bytes,
                   size_t elem_size, std::vector<char>* scratch);

// The stored form of `n` f32 state values (format.h StoredAs; docs/checkpoint-format.md "Stored
// state"): bf16 values, or q8 codes of whole blocks of `block` (signed for exp_avg) followed by the
// blocks' f32 scales; f32 is stored as it is and never comes here. The values must be exactly what
// such a form decodes to (the owner keeps its state so): InvalidArgument naming the element otherwise,
// so a save never changes a value. `out` holds StoredBytes(s, n, block) bytes.
Status PackState(StoredAs s, bool is_signed, int64_t block, const float* in, int64_t n, char* out);
// The same with a q8 form's codes and scales in places of their own (`scales` unused for bf16): a
// chunk filled part by part.
Status PackStateInto(StoredAs s, bool is_signed, int64_t block, const float* in, int64_t n, char* values, char* scales);
// The values a stored form decodes to, after checking that it is one PackState writes: q8 scales
// finite and >= 0, codes no larger than 1.0's, a block with a positive scale holding 1.0's code and
// one with a zero scale only zeros. DataLoss naming the element or block otherwise.
Status UnpackState(StoredAs s, bool is_signed, int64_t block, const char* in, int64_t n, float* out);
// UnpackState's check alone: the form is one PackState writes (a load that keeps it as stored).
Status CheckStoredState(StoredAs s, bool is_signed, int64_t block, const char* in, int64_t n);
// The same with a q8 form's codes and scales in places of their own (`scales` unused for bf16).
Status CheckStoredState(StoredAs s, bool is_signed, int64_t block, const char* values, const char* scales, int64_t n);
// That check of q8 codes in two halves: the codes scanned as they go by, in pieces of any size and
// in order (CopyAndChecksum's `seen`: each piece while it is in cache), then judged with the scales
// once they are all there (Check: the same verdicts and messages as CheckStoredState).
class Q8Scan {
 public:
  Q8Scan(bool is_signed, int64_t block, int64_t n);
  void Take(const char* codes, size_t bytes);  // the next codes (any beyond n are ignored)
  static void Seen(void* scan, const char* codes, size_t bytes) { static_cast<Q8Scan*>(scan)->Take(codes, bytes); }
  Status Check(const char* codes, const char* scales) const;  // every code taken, and where they are now

 private:
  bool is_signed_;
  int64_t block_, n_, at_ = 0;
  std::vector<uint8_t> largest_, negative_zero_;  // per block
};

uint64_t Checksum(const void* data, size_t bytes);  // xxh3-64 (with AVX2 where the CPU has it)
// Checksum of the bytes of `a` followed by those of `b` (a q8 chunk's codes and scales kept apart).
uint64_t Checksum(const void* a, size_t a_bytes, const void* b, size_t b_bytes);
// Copies `bytes` from `from` to `to` and returns Checksum(to, bytes), reading memory once.
uint64_t CopyAndChecksum(void* to, const void* from, size_t bytes);
// The same with the first `to_bytes` copied to `to` and the rest to `then` (a q8 chunk's codes and
// scales, placed apart): the checksum of all `bytes` as they are in `from`. `seen` (optional) gets
// the first `to_bytes` in order, piece by piece as they are hashed and written (what lands).
using SeenFn = void (*)(void* ctx, const char* data, size_t bytes);
uint64_t CopyAndChecksum(void* to, size_t to_bytes, void* then, const void* from, size_t bytes, SeenFn seen = nullptr, void* ctx = nullptr);
// The two builds those choose between at run time (checksum.inc; the tests compare them). avx2's
// only on a CPU with AVX2.
namespace generic {
uint64_t Checksum(const void* data, size_t bytes);
uint64_t Checksum(const void* a, size_t a_bytes, const void* b, size_t b_bytes);
uint64_t CopyAndChecksum(void* to, const void* from, size_t bytes);
uint64_t CopyAndChecksum(void* to, size_t to_bytes, void* then, const void* from, size_t bytes, SeenFn seen, void* ctx);
}  // namespace generic
namespace avx2 {
uint64_t Checksum(const void* data, size_t bytes);
uint64_t Checksum(const void* a, size_t a_bytes, const void* b, size_t b_bytes);
uint64_t CopyAndChecksum(void* to, const void* from, size_t bytes);
uint64_t CopyAndChecksum(void* to, size_t to_bytes, void* then, const void* from, size_t bytes, SeenFn seen, void* ctx);
}  // namespace avx2

}  // namespace zrt::ckpt
