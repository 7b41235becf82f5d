#include "zrt/checkpoint/codec.h"

#include <zstd.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>

#include "zrt/core/dtype.h"
#include "zrt/core/quant_math.h"

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

Status PackState(StoredAs s, bool is_signed, int64_t block, const float* in, int64_t n, char* out) {
  return PackStateInto(s, is_signed, block, in, n, out, s == StoredAs::kQ8 ? out + n : nullptr);
}

Status PackStateInto(StoredAs s, bool is_signed, int64_t block, const float* in, int64_t n, char* out, char* scales) {
  if (s == StoredAs::kBF16) {
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t h = FloatToBf16(in[i]);
      if (Bf16ToFloat(h) != in[i]) return InvalidArgumentError("element ", i, " (", in[i], ") is not a bf16 value");
      std::memcpy(out + 2 * i, &h, 2);
    }
    return Status();
  }
  if (s != StoredAs::kQ8 || n % block != 0) return InternalError("PackState: ", n, " elements as ", static_cast<int>(s));
  auto* codes = reinterpret_cast<uint8_t*>(out);
  const float* value = Q8Table(is_signed);
  for (int64_t b = 0; b < n / block; ++b) {
    const float* x = in + b * block;
    const float scale = Q8EncodeBlock(x, block, is_signed, codes + b * block);
    for (int64_t i = 0; i < block; ++i) {
      if (value[codes[b * block + i]] * scale != x[i]) {
        return InvalidArgumentError("element ", b * block + i, " (", x[i], ") is not what its q8 block decodes to");
      }
    }
    std::memcpy(scales + 4 * b, &scale, 4);
  }
  return Status();
}

namespace {

// A q8 block's largest magnitude (code & mask) and whether it holds the signed code's negative zero
// (0x80, never written): 16 codes at a time where the block allows (a restore checks every code).
uint8_t ScanBlock(const uint8_t* codes, int64_t n, bool is_signed, bool* negative_zero) {
  const uint8_t mask = is_signed ? 0x7f : 0xff;
  uint8_t largest = 0;
  int64_t i = 0;
#if defined(__SSE2__)
  if (n >= 16) {
    const __m128i m = _mm_set1_epi8(static_cast<char>(mask)), zero = _mm_set1_epi8(static_cast<char>(0x80));
    __m128i top = _mm_setzero_si128(), neg = _mm_setzero_si128();
    for (; i + 16 <= n; i += 16) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i));
      top = _mm_max_epu8(top, _mm_and_si128(v, m));
      neg = _mm_or_si128(neg, _mm_cmpeq_epi8(v, zero));
    }
    top = _mm_max_epu8(top, _mm_srli_si128(top, 8));
    top = _mm_max_epu8(top, _mm_srli_si128(top, 4));
    top = _mm_max_epu8(top, _mm_srli_si128(top, 2));
    top = _mm_max_epu8(top, _mm_srli_si128(top, 1));
    largest = static_cast<uint8_t>(_mm_cvtsi128_si32(top) & 0xff);
    *negative_zero |= is_signed && _mm_movemask_epi8(neg) != 0;
  }
#endif
  for (; i < n; ++i) {
    const uint8_t mag = codes[i] & mask;
    *negative_zero |= mag == 0 && codes[i] != 0;
    largest = std::max(largest, mag);
  }
  return largest;
}

}  // namespace

Status CheckStoredState(StoredAs s, bool is_signed, int64_t block, const char* in, int64_t n) {
  return CheckStoredState(s, is_signed, block, in, s == StoredAs::kQ8 ? in + n : nullptr, n);
}

Status CheckStoredState(StoredAs s, bool is_signed, int64_t block, const char* values, const char* scales, int64_t n) {
  if (s == StoredAs::kBF16) return Status();  // every bf16 value is one
  if (s != StoredAs::kQ8 || block <= 0 || n % block != 0) return DataLossError("q8 state of ", n, " elements in blocks of ", block);
  Q8Scan scan(is_signed, block, n);
  scan.Take(values, static_cast<size_t>(n));
  return scan.Check(values, scales);
}

Q8Scan::Q8Scan(bool is_signed, int64_t block, int64_t n)
    : is_signed_(is_signed), block_(block), n_(n), largest_(static_cast<size_t>(block > 0 ? n / block : 0)), negative_zero_(largest_.size()) {}

void Q8Scan::Take(const char* codes, size_t bytes) {
  const auto* c = reinterpret_cast<const uint8_t*>(codes);
  while (bytes > 0 && at_ < n_ && block_ > 0) {
    const auto b = static_cast<size_t>(at_ / block_);
    const int64_t take = std::min({static_cast<int64_t>(bytes), block_ - at_ % block_, n_ - at_});
    bool negative_zero = false;
    largest_[b] = std::max(largest_[b], ScanBlock(c, take, is_signed_, &negative_zero));
    negative_zero_[b] |= negative_zero ? 1 : 0;
    c += take;
    bytes -= static_cast<size_t>(take);
    at_ += take;
  }
}

Status Q8Scan::Check(const char* values, const char* scales) const {
  if (block_ <= 0 || n_ % block_ != 0 || at_ != n_) return DataLossError("q8 state of ", n_, " elements in blocks of ", block_);
  const auto* codes = reinterpret_cast<const uint8_t*>(values);
  const uint8_t top = kQ8MaxCode[is_signed_ ? 1 : 0];
  const uint8_t mag_mask = is_signed_ ? 0x7f : 0xff;
  const int64_t block = block_;
  for (int64_t b = 0; b < n_ / block; ++b) {
    float scale;
    std::memcpy(&scale, scales + 4 * b, 4);
    if (!std::isfinite(scale) || !(scale >= 0)) return DataLossError("q8 block ", b, ": scale ", scale, " is not finite and >= 0");
    const uint8_t largest = largest_[static_cast<size_t>(b)];
    if (largest > top || negative_zero_[static_cast<size_t>(b)] != 0) {
      for (int64_t i = b * block; i < (b + 1) * block; ++i) {
        const uint8_t mag = codes[i] & mag_mask;
        if (mag > top || (mag == 0 && codes[i] != 0)) return DataLossError("q8 block ", b, ": code ", int{codes[i]}, " is never written");
      }
    }
    if (largest != (scale > 0 ? top : 0)) {
      return DataLossError("q8 block ", b, ": its largest code ", int{largest}, " does not match its scale ", scale);
    }
  }
  return Status();
}

Status UnpackState(StoredAs s, bool is_signed, int64_t block, const char* in, int64_t n, float* out) {
  RETURN_IF_ERROR(CheckStoredState(s, is_signed, block, in, n));
  if (s == StoredAs::kBF16) {
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, in + 2 * i, 2);
      out[i] = Bf16ToFloat(h);
    }
    return Status();
  }
  const auto* codes = reinterpret_cast<const uint8_t*>(in);
  const float* value = Q8Table(is_signed);
  for (int64_t b = 0; b < n / block; ++b) {
    float scale;
    std::memcpy(&scale, in + n + 4 * b, 4);
    for (int64_t i = b * block; i < (b + 1) * block; ++i) out[i] = value[codes[i]] * scale;
  }
  return Status();
}

}  // namespace zrt::ckpt
