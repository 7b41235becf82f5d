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
