// TensorSpec: what a tensor is (name, shape, dtype), independent of where it lives.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zrt/core/dtype.h"
#include "zrt/core/status.h"

namespace zrt {

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;  // empty shape = scalar (numel 1); a zero dimension = empty tensor
  DType dtype = DType::kF32;

  // Product of the dimensions. Precondition: Validate() is OK (no negative dims, no overflow).
  int64_t numel() const;
  int64_t bytes() const { return numel() * static_cast<int64_t>(DTypeSize(dtype)); }

  // "name [2, 3] bf16"
  std::string ToString() const;

  friend bool operator==(const TensorSpec&, const TensorSpec&) = default;
};

// Checks a spec: non-empty name, no negative dimension, numel * dtype size fits in int64.
// The error names the tensor.
Status Validate(const TensorSpec& spec);

}  // namespace zrt
