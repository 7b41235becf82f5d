#include "zrt/core/dtype.h"

#include <algorithm>
#include <cctype>
#include <string>

namespace zrt {

std::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "f16";
    case DType::kBytes: return "bytes";
  }
  return "invalid";
}

Result<DType> ParseDType(std::string_view name) {
  std::string n(name);
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return std::tolower(c); });
  if (n == "f32" || n == "fp32" || n == "float32" || n == "float") return DType::kF32;
  if (n == "bf16" || n == "bfloat16") return DType::kBF16;
  if (n == "f16" || n == "fp16" || n == "float16" || n == "half") return DType::kF16;
  if (n == "bytes" || n == "u8" || n == "uint8") return DType::kBytes;
  return InvalidArgumentError("unknown dtype '", name, "' (expected one of f32, bf16, f16, bytes)");
}

}  // namespace zrt
