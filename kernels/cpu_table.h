// Internal: the function table each CPU instruction-set translation unit exports. Plain C types only,
// because the ISA units are compiled with their own -m flags (see core/hd.h).
#pragma once

#include <cstdint>

#include "zrt/kernels/adam_math.h"

namespace zrt::kernels::internal {

// Element kinds in the ISA units (mirrors DType for the float types).
enum ElemKind : int { kElemF32 = 0, kElemBf16 = 1, kElemF16 = 2, kElemNone = 3 };

struct AdamRange {
  float* param;
  const void* grad;
  float* exp_avg;
  float* exp_avg_sq;
  float* max_exp_avg_sq;  // null unless amsgrad
  void* param_copy;       // null: no copy
  int64_t begin;
  int64_t end;
};

struct CpuKernelTable {
  // Updates elements [begin, end) of one tensor.
  void (*adam)(const AdamStepScalars& s, const AdamRange& r, int grad_kind, int copy_kind);
  // Sum of squares of g[begin, end) in double; sets *nonfinite when an element is inf/NaN.
  void (*sum_squares)(const void* g, int kind, int64_t begin, int64_t end, double* sum, bool* nonfinite);
  // dst[i] = src[i] for i in [begin, end), converted.
  void (*cast)(const void* src, int src_kind, void* dst, int dst_kind, int64_t begin, int64_t end);
};

const CpuKernelTable& ScalarKernels();
const CpuKernelTable& Avx2Kernels();
const CpuKernelTable& Avx512Kernels();

}  // namespace zrt::kernels::internal
