// TensorSpec: what a tensor is (name, shape, dtype), independent of where it lives.
#pragma once

#include <cstdint>
#include <span>
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


// TensorView: a typed window on one tensor's elements in some engine buffer (its gathered
// parameters, its gradient), with what the tensor is.
//
//   auto w = engine->Param(h).value();      // or engine->Param("layer0.w")
//   std::span<zrt::bf16> x = w.as<zrt::bf16>();
//   float first = x[0]; x[1] = 0.5f;         // bf16/f16 convert to and from float
//
// Lifetime: the buffer's (engine.h says how long each kind lives); a view owns nothing.
// as<T>() with a T that is not the tensor's dtype is a programming error: it aborts naming the tensor.
namespace internal {
[[noreturn]] void DieOnDTypeMismatch(const TensorSpec& spec, DType have, DType requested);
}  // namespace internal

struct TensorView {
  void* data = nullptr;
  const TensorSpec* spec = nullptr;  // name, shape, dtype (the engine's registration; lives as long)
  DType dtype = DType::kF32;         // of these elements (a gradient may be f32 for a bf16 tensor)

  int64_t numel() const { return spec->numel(); }
  const std::vector<int64_t>& shape() const { return spec->shape; }
  const std::string& name() const { return spec->name; }

  template <typename T>
  std::span<T> as() const {
    if (DTypeOf<T> != dtype) internal::DieOnDTypeMismatch(*spec, dtype, DTypeOf<T>);
    return {static_cast<T*>(data), static_cast<size_t>(numel())};
  }
};

}  // namespace zrt
