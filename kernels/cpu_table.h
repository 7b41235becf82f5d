// Internal: the function table each CPU instruction-set translation unit exports. Plain C types only,
// because the ISA units are compiled with their own -m flags (see core/hd.h).
#pragma once

#include <cstdint>

#include "zrt/kernels/adam_math.h"
#include "zrt/core/quant_math.h"

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

// Compact state (quant_math.h): the moments' formats, and where a range's parameters and moments are.
enum MomentKind : int { kMomF32 = 0, kMomBf16 = 1, kMomQ8 = 2, kMomQ4 = 3 };  // = Precision

struct CompactRange {
  void* param;         // f32 master, or bf16 parameters rounded stochastically (sr)
  const void* grad;
  void* exp_avg;       // f32, bf16, q8 codes (indexed by element) or q4 codes (two a byte)
  float* exp_avg_scale;  // q8, q4: one per block, indexed by block (element / block)
  void* exp_avg_sq;
  float* exp_avg_sq_scale;
  void* param_copy;    // null: no copy (always null with sr)
  int64_t begin;       // a multiple of block when a moment is q8
  int64_t end;
  int64_t block;       // q8 block, <= kMaxQuantBlock
  uint32_t key;        // stochastic rounding: RoundingKey(seed, step, global index >> 32) of [begin, end)
  uint32_t index_lo;   // low 32 bits of element 0's global index (element i: index_lo + i, no wrap in [begin, end))
};

struct CompactKinds {
  int grad, copy, exp_avg, exp_avg_sq;
  bool sr;
};

struct CpuKernelTable {
  // Updates elements [begin, end) of one tensor.
  void (*adam)(const AdamStepScalars& s, const AdamRange& r, int grad_kind, int copy_kind);
  // Sum of squares of g[begin, end) in double; sets *nonfinite when an element is inf/NaN.
  void (*sum_squares)(const void* g, int kind, int64_t begin, int64_t end, double* sum, bool* nonfinite);
  // dst[i] = src[i] for i in [begin, end), converted.
  void (*cast)(const void* src, int src_kind, void* dst, int dst_kind, int64_t begin, int64_t end);
  // Adam over compact state: elements [begin, end) of one tensor.
  void (*adam_compact)(const AdamStepScalars& s, const CompactRange& r, const CompactKinds& k);
};

const CpuKernelTable& ScalarKernels();
const CpuKernelTable& Avx2Kernels();
const CpuKernelTable& Avx512Kernels();
const CpuKernelTable& Avx512Bf16Kernels();  // cpu_avx512.cc built with AVX512-BF16 (cpu_avx512_bf16.cc)

}  // namespace zrt::kernels::internal
