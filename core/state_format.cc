#include "zrt/core/state_view.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "zrt/core/dtype.h"
#include "zrt/core/quant_math.h"

namespace zrt {

std::string_view PrecisionName(Precision p) {
  switch (p) {
    case Precision::kF32: return "f32";
    case Precision::kBF16: return "bf16";
    case Precision::kQ8: return "q8";
    case Precision::kQ4: return "q4";
  }
  return "unknown";
}

Result<Precision> ParsePrecision(std::string_view name) {
  for (Precision p : {Precision::kF32, Precision::kBF16, Precision::kQ8, Precision::kQ4}) {
    if (name == PrecisionName(p)) return p;
  }
  return InvalidArgumentError("state precision must be f32, bf16, q8 or q4, got '", std::string(name), "'");
}

StateFormat StateFormat::Of(Precision p, std::string_view kind, int64_t block) {
  if (!IsBlockwise(p)) return {p, false, 0};
  return {p, kind == "exp_avg", block};
}

namespace {

float ScaleAt(const float* scales, int64_t b) {  // scales may lie unaligned in a file's bytes
  float s;
  std::memcpy(&s, scales + b, 4);
  return s;
}

}  // namespace

void StateFormat::Encode(const float* in, int64_t n, void* values, float* scales) const {
  switch (precision) {
    case Precision::kF32:
      std::memcpy(values, in, static_cast<size_t>(n) * 4);
      return;
    case Precision::kBF16: {
      auto* h = static_cast<uint16_t*>(values);
      for (int64_t i = 0; i < n; ++i) h[i] = FloatToBf16(in[i]);
      return;
    }
    case Precision::kQ8: {
      auto* codes = static_cast<uint8_t*>(values);
      for (int64_t b = 0; b < Scales(n); ++b) {
        const float s = Q8EncodeBlock(in + b * block, std::min(block, n - b * block), is_signed, codes + b * block);
        std::memcpy(scales + b, &s, 4);
      }
      return;
    }
    case Precision::kQ4: {
      auto* bytes = static_cast<uint8_t*>(values);
      for (int64_t b = 0; b < Scales(n); ++b) {  // blocks are whole bytes (a power of two >= 2)
        const float s = Q4EncodeBlock(in + b * block, std::min(block, n - b * block), is_signed, bytes + b * block / 2);
        std::memcpy(scales + b, &s, 4);
      }
      return;
    }
  }
}

Status StateFormat::EncodeExact(const float* in, int64_t n, void* values, float* scales) const {
  if (IsBlockwise(precision) && (block < 2 || (block & (block - 1)) != 0)) {
    return InternalError(PrecisionName(precision), " state in blocks of ", block);
  }
  Encode(in, n, values, scales);
  if (precision == Precision::kF32) return Status();
  // Decode piece by piece (a small buffer in cache; Decode starts anywhere in a block) and compare
  // values (a NaN is never one). q4's unsigned code has no zero: a 0 in a block with a positive scale
  // (the layout's padding, which a reshard or an import fills with zeros) is stored as code 0, the
  // block's smallest value, as the optimizer keeps it there.
  const bool zero_is_smallest = precision == Precision::kQ4 && !is_signed;
  constexpr int64_t kPiece = 1024;
  float back[kPiece];
  const auto* v = static_cast<const char*>(values);
  for (int64_t i = 0; i < n; i += kPiece) {
    const int64_t m = std::min(kPiece, n - i);
    Decode(v + ValuesBytes(i), Scales(1) > 0 ? scales + i / block : scales, i, m, back);
    for (int64_t k = 0; k < m; ++k) {
      if (back[k] != in[i + k] && !(zero_is_smallest && in[i + k] == 0.0f)) {
        return InvalidArgumentError("element ", i + k, " (", in[i + k], ") is not a ", PrecisionName(precision), " value",
                                    blockwise() ? " of its block" : "");
      }
    }
  }
  return Status();
}

void StateFormat::Decode(const void* values, const float* scales, int64_t first, int64_t n, float* out) const {
  switch (precision) {
    case Precision::kF32:
      std::memcpy(out, values, static_cast<size_t>(n) * 4);
      return;
    case Precision::kBF16: {
      const auto* h = static_cast<const uint16_t*>(values);
      for (int64_t i = 0; i < n; ++i) out[i] = Bf16ToFloat(h[i]);
      return;
    }
    case Precision::kQ8: {
      const auto* codes = static_cast<const uint8_t*>(values);
      const float* value = Q8Table(is_signed);
      for (int64_t i = 0; i < n;) {  // block by block from `first` (which may lie inside one)
        const int64_t end = std::min(n, (first + i) / block * block + block - first);
        const float scale = ScaleAt(scales, (first + i) / block - first / block);
        for (; i < end; ++i) out[i] = value[codes[i]] * scale;
      }
      return;
    }
    case Precision::kQ4: {
      const auto* bytes = static_cast<const uint8_t*>(values);
      const float* value = Q4Table(is_signed);
      const int64_t odd = first & 1;  // `values` holds element `first` in its high nibble
      for (int64_t i = 0; i < n;) {
        const int64_t end = std::min(n, (first + i) / block * block + block - first);
        const float scale = ScaleAt(scales, (first + i) / block - first / block);
        for (; i < end; ++i) out[i] = value[Q4CodeAt(bytes, i + odd)] * scale;
      }
      return;
    }
  }
}

Status StateFormat::Check(const void* values, const float* scales, int64_t n) const {
  if (!IsBlockwise(precision)) return Status();  // every f32 and bf16 value is one
  CodeScan scan(*this, n);
  scan.Take(static_cast<const char*>(values), static_cast<size_t>(ValuesBytes(n)));
  return scan.Check(values, scales);
}

Status StateFormat::DecodeChecked(const void* values, const float* scales, int64_t n, float* out) const {
  RETURN_IF_ERROR(Check(values, scales, n));
  Decode(values, scales, 0, n, out);
  return Status();
}

namespace {

#if defined(__SSE2__)
uint8_t LargestByte(__m128i v) {
  v = _mm_max_epu8(v, _mm_srli_si128(v, 8));
  v = _mm_max_epu8(v, _mm_srli_si128(v, 4));
  v = _mm_max_epu8(v, _mm_srli_si128(v, 2));
  v = _mm_max_epu8(v, _mm_srli_si128(v, 1));
  return static_cast<uint8_t>(_mm_cvtsi128_si32(v) & 0xff);
}
#endif

// A q8 block's largest magnitude (code & mask) and whether it holds the signed code's negative zero
// (0x80, never written): 16 codes at a time where the block allows (a restore checks every code).
uint8_t ScanQ8(const uint8_t* codes, int64_t n, bool is_signed, bool* negative_zero) {
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
    largest = LargestByte(top);
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

// The same over q4 bytes (two codes each): the largest magnitude (code & 7 signed, the code unsigned)
// and whether a signed negative zero (8) is there.
uint8_t ScanQ4(const uint8_t* bytes, int64_t n, bool is_signed, bool* negative_zero) {
  const uint8_t mask = is_signed ? 0x77 : 0xff;
  uint8_t largest = 0;
  int64_t i = 0;
#if defined(__SSE2__)
  if (n >= 16) {
    const __m128i m = _mm_set1_epi8(static_cast<char>(mask)), low = _mm_set1_epi8(0x0f), eight = _mm_set1_epi8(8);
    __m128i top = _mm_setzero_si128(), neg = _mm_setzero_si128();
    for (; i + 16 <= n; i += 16) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes + i));
      const __m128i lo = _mm_and_si128(v, low), hi = _mm_and_si128(_mm_srli_epi16(v, 4), low);
      top = _mm_max_epu8(top, _mm_max_epu8(_mm_and_si128(lo, m), _mm_and_si128(hi, m)));  // magnitudes first
      neg = _mm_or_si128(neg, _mm_or_si128(_mm_cmpeq_epi8(lo, eight), _mm_cmpeq_epi8(hi, eight)));
    }
    largest = LargestByte(top);
    *negative_zero |= is_signed && _mm_movemask_epi8(neg) != 0;
  }
#endif
  for (; i < n; ++i) {
    for (const uint8_t c : {static_cast<uint8_t>(bytes[i] & 15u), static_cast<uint8_t>(bytes[i] >> 4)}) {
      *negative_zero |= is_signed && c == 8;
      largest = std::max(largest, static_cast<uint8_t>(is_signed ? c & 7u : c));
    }
  }
  return largest;
}

// Code i of a blockwise buffer, and the magnitude of a code.
uint8_t CodeOf(const StateFormat& f, const uint8_t* codes, int64_t i) { return f.precision == Precision::kQ4 ? Q4CodeAt(codes, i) : codes[i]; }
uint8_t Magnitude(const StateFormat& f, uint8_t code) {
  if (!f.is_signed) return code;
  return f.precision == Precision::kQ4 ? code & 7u : code & 0x7fu;
}

}  // namespace

CodeScan::CodeScan(const StateFormat& format, int64_t n) : format_(format), n_(n) {
  if (!format.blockwise() || n % format.block != 0) return;  // Check says why (an empty buffer passes)
  whole_ = true;
  block_bytes_ = format.ValuesBytes(format.block);
  bytes_ = format.ValuesBytes(n);
  largest_.resize(static_cast<size_t>(n / format.block));
  negative_zero_.resize(largest_.size());
}

void CodeScan::Take(const char* codes, size_t bytes) {
  const auto* c = reinterpret_cast<const uint8_t*>(codes);
  while (bytes > 0 && at_ < bytes_) {
    const auto b = static_cast<size_t>(at_ / block_bytes_);
    const int64_t take = std::min({static_cast<int64_t>(bytes), block_bytes_ - at_ % block_bytes_, bytes_ - at_});
    bool negative_zero = false;
    const uint8_t largest = format_.precision == Precision::kQ4 ? ScanQ4(c, take, format_.is_signed, &negative_zero)
                                                                 : ScanQ8(c, take, format_.is_signed, &negative_zero);
    largest_[b] = std::max(largest_[b], largest);
    negative_zero_[b] |= negative_zero ? 1 : 0;
    c += take;
    bytes -= static_cast<size_t>(take);
    at_ += take;
  }
}

Status CodeScan::Check(const void* values, const float* scales) const {
  const std::string_view name = PrecisionName(format_.precision);
  const int64_t block = format_.block;
  if (!whole_) return n_ == 0 ? Status() : DataLossError(name, " state of ", n_, " elements in blocks of ", block);
  if (at_ != bytes_) return DataLossError(name, " state: ", at_, " of its ", bytes_, " bytes of codes were taken");
  const auto* codes = static_cast<const uint8_t*>(values);
  const bool q4 = format_.precision == Precision::kQ4;
  const uint8_t top = (q4 ? kQ4MaxCode : kQ8MaxCode)[format_.is_signed ? 1 : 0];
  const uint8_t sign = q4 ? 8 : 0x80;
  for (int64_t b = 0; b < static_cast<int64_t>(largest_.size()); ++b) {
    const float scale = ScaleAt(scales, b);
    if (!std::isfinite(scale) || !(scale >= 0)) return DataLossError(name, " block ", b, ": scale ", scale, " is not finite and >= 0");
    const uint8_t largest = largest_[static_cast<size_t>(b)];
    if (largest > top || negative_zero_[static_cast<size_t>(b)] != 0) {
      for (int64_t i = b * block; i < (b + 1) * block; ++i) {
        const uint8_t code = CodeOf(format_, codes, i), mag = Magnitude(format_, code);
        if (mag > top || (format_.is_signed && code == sign)) return DataLossError(name, " block ", b, ": code ", int{code}, " is never written");
      }
    }
    if (largest != (scale > 0 ? top : 0)) {
      return DataLossError(name, " block ", b, ": its largest code ", int{largest}, " does not match its scale ", scale);
    }
  }
  return Status();
}

}  // namespace zrt
