#include "zrt/checkpoint/codec.h"

#include <zstd.h>

#include <cstring>

namespace zrt::ckpt {
namespace {

// planes[k][i] = byte k of element i.
void Group(const char* in, size_t n, size_t esize, char* out) {
  for (size_t i = 0; i < n; ++i) {
    for (size_t k = 0; k < esize; ++k) out[k * n + i] = in[i * esize + k];
  }
}
void Ungroup(const char* in, size_t n, size_t esize, char* out) {
  for (size_t i = 0; i < n; ++i) {
    for (size_t k = 0; k < esize; ++k) out[i * esize + k] = in[k * n + i];
  }
}

}  // namespace

std::string_view CodecName(Codec c) {
  switch (c) {
    case Codec::kRaw: return "raw";
    case Codec::kZstd: return "zstd";
    case Codec::kByteGroupZstd: return "bg+zstd";
  }
  return "invalid";
}

Result<Codec> ParseCodec(std::string_view name) {
  if (name == "raw" || name == "none") return Codec::kRaw;
  if (name == "zstd") return Codec::kZstd;
  if (name == "bg+zstd") return Codec::kByteGroupZstd;
  return InvalidArgumentError("unknown codec '", name, "' (raw, zstd, bg+zstd)");
}

namespace {
bool HasAvx2() {
#if defined(__x86_64__)
  static const bool yes = __builtin_cpu_supports("avx2");
  return yes;
#else
  return false;
#endif
}
}  // namespace

uint64_t Checksum(const void* data, size_t bytes) { return HasAvx2() ? avx2::Checksum(data, bytes) : generic::Checksum(data, bytes); }

uint64_t Checksum(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  return HasAvx2() ? avx2::Checksum(a, a_bytes, b, b_bytes) : generic::Checksum(a, a_bytes, b, b_bytes);
}

uint64_t CopyAndChecksum(void* to, const void* from, size_t bytes) {
  return HasAvx2() ? avx2::CopyAndChecksum(to, from, bytes) : generic::CopyAndChecksum(to, from, bytes);
}

uint64_t CopyAndChecksum(void* to, size_t to_bytes, void* then, const void* from, size_t bytes, SeenFn seen, void* ctx) {
  return HasAvx2() ? avx2::CopyAndChecksum(to, to_bytes, then, from, bytes, seen, ctx) : generic::CopyAndChecksum(to, to_bytes, then, from, bytes, seen, ctx);
}

Result<Codec> EncodeChunk(const void* raw, size_t bytes, size_t elem_size, const CompressOptions& o,
                          std::vector<char>* scratch, std::vector<char>* out) {
  out->clear();
  if (o.codec == Codec::kRaw || bytes == 0) return Codec::kRaw;
  const char* src = static_cast<const char*>(raw);
  if (o.codec == Codec::kByteGroupZstd && elem_size > 1 && bytes % elem_size == 0) {
    scratch->resize(bytes);
    Group(src, bytes / elem_size, elem_size, scratch->data());
    src = scratch->data();
  }
  out->resize(ZSTD_compressBound(bytes));
  const size_t n = ZSTD_compress(out->data(), out->size(), src, bytes, o.level);
  if (ZSTD_isError(n)) return InternalError("zstd compression failed: ", ZSTD_getErrorName(n));
  if (n >= bytes) {  // did not shrink: store raw
    out->clear();
    return Codec::kRaw;
  }
  out->resize(n);
  return src == scratch->data() ? Codec::kByteGroupZstd : Codec::kZstd;
}

Status DecodeChunk(Codec codec, const void* stored, size_t stored_bytes, void* raw_out, size_t raw_bytes,
                   size_t elem_size, std::vector<char>* scratch) {
  switch (codec) {
    case Codec::kRaw:
      if (stored_bytes != raw_bytes) return DataLossError("raw chunk of ", stored_bytes, " bytes, expected ", raw_bytes);
      std::memcpy(raw_out, stored, raw_bytes);
      return Status();
    case Codec::kZstd:
    case Codec::kByteGroupZstd: {
      const bool grouped = codec == Codec::kByteGroupZstd;
      char* dst = static_cast<char*>(raw_out);
      if (grouped) {
        scratch->resize(raw_bytes);
        dst = scratch->data();
      }
      const size_t n = ZSTD_decompress(dst, raw_bytes, stored, stored_bytes);
      if (ZSTD_isError(n)) return DataLossError("zstd: ", ZSTD_getErrorName(n));
      if (n != raw_bytes) return DataLossError("chunk decompressed to ", n, " bytes, expected ", raw_bytes);
      if (grouped) Ungroup(dst, raw_bytes / elem_size, elem_size, static_cast<char*>(raw_out));
      return Status();
    }
  }
  return DataLossError("unknown codec ", static_cast<int>(codec));
}

}  // namespace zrt::ckpt
