#include "zrt/core/tensor_spec.h"

#include <cstdio>
#include <cstdlib>
#include <limits>
#include <sstream>

namespace zrt {

int64_t TensorSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorSpec::ToString() const {
  std::ostringstream os;
  os << name << " [";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "] " << DTypeName(dtype);
  return std::move(os).str();
}

Status Validate(const TensorSpec& spec) {
  if (spec.name.empty()) return InvalidArgumentError("tensor ", spec.ToString(), ": empty name");
  if (spec.dtype > DType::kBytes) return InvalidArgumentError("tensor '", spec.name, "': invalid dtype");
  const int64_t limit = std::numeric_limits<int64_t>::max() / static_cast<int64_t>(DTypeSize(spec.dtype));
  int64_t n = 1;
  for (int64_t d : spec.shape) {
    if (d < 0) return InvalidArgumentError("tensor ", spec.ToString(), ": negative dimension ", d);
    if (d != 0 && n > limit / d) return InvalidArgumentError("tensor ", spec.ToString(), ": size overflows int64");
    n *= d;
  }
  return Status();
}

namespace internal {
void DieOnDTypeMismatch(const TensorSpec& spec, DType have, DType requested) {
  std::fprintf(stderr, "zrt: TensorView::as<%s>() of tensor '%s', whose elements are %s\n", std::string(DTypeName(requested)).c_str(),
               spec.name.c_str(), std::string(DTypeName(have)).c_str());
  std::abort();
}
}  // namespace internal

}  // namespace zrt
