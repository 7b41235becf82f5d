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
  }
  return "unknown";
}

Result<Precision> ParsePrecision(std::string_view name) {
  for (Precision p : {Precision::kF32, Precision::kBF16, Precision::kQ8}) {
    if (name == PrecisionName(p)) return p;
  }
  return InvalidArgumentError("state precision must be f32, bf16 or q8, got '", std::string(name), "'");
}

StateFormat StateFormat::Of(Precision p, std::string_view kind, int64_t block) {
  if (p != Precision::kQ8) return {p, false, 0};
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
  }
}

Status StateFormat::EncodeExact(const float* in, int64_t n, void* values, float* scales) const {
  if (precision == Precision::kQ8 && block <= 0) return InternalError("q8 state without a block size");
  Encode(in, n, values, scales);
  if (precision == Precision::kF32) return Status();
  // Decode piece by piece (a small buffer in cache; Decode starts anywhere in a block) and compare
  // values (a NaN is never one).
  constexpr int64_t kPiece = 1024;
  float back[kPiece];
  const auto* v = static_cast<const char*>(values);
  for (int64_t i = 0; i < n; i += kPiece) {
    const int64_t m = std::min(kPiece, n - i);
    Decode(v + ValuesBytes(i), Scales(1) > 0 ? scales + i / block : scales, i, m, back);
    for (int64_t k = 0; k < m; ++k) {
      if (back[k] != in[i + k]) {
        return InvalidArgumentError("element ", i + k, " (", in[i + k], ") is not a ", PrecisionName(precision), " value",
                                    precision == Precision::kQ8 ? " of its block" : "");
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
  }
}

Status StateFormat::Check(const void* values, const float* scales, int64_t n) const {
  if (precision != Precision::kQ8) return Status();  // every f32 and bf16 value is one
  if (block <= 0 || n % block != 0) return DataLossError("q8 state of ", n, " elements in blocks of ", block);
  Q8Scan scan(is_signed, block, n);
  scan.Take(static_cast<const char*>(values), static_cast<size_t>(n));
  return scan.Check(values, scales);
}

Status StateFormat::DecodeChecked(const void* values, const float* scales, int64_t n, float* out) const {
  RETURN_IF_ERROR(Check(values, scales, n));
  Decode(values, scales, 0, n, out);
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

Status Q8Scan::Check(const void* values, const float* scales) const {
  if (block_ <= 0 || n_ % block_ != 0 || at_ != n_) return DataLossError("q8 state of ", n_, " elements in blocks of ", block_);
  const auto* codes = static_cast<const uint8_t*>(values);
  const uint8_t top = kQ8MaxCode[is_signed_ ? 1 : 0];
  const uint8_t mag_mask = is_signed_ ? 0x7f : 0xff;
  const int64_t block = block_;
  for (int64_t b = 0; b < n_ / block; ++b) {
    const float scale = ScaleAt(scales, b);
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

}  // namespace zrt
