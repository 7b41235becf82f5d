// CPU kernel dispatch shared by every op (see cpu_dispatch.h) and the ISA detection of cpu.h.
#include "zrt/kernels/cpu_dispatch.h"

#include <algorithm>

#include "zrt/core/thread_pool.h"

namespace zrt::kernels {
namespace internal {

Result<int> ElemKindOf(DType t, const char* what) {
  switch (t) {
    case DType::kF32: return kElemF32;
    case DType::kBF16: return kElemBf16;
    case DType::kF16: return kElemF16;
    default: return InvalidArgumentError(what, " dtype ", DTypeName(t), " unsupported (f32, bf16 or f16)");
  }
}

Result<const CpuKernelTable*> TableFor(CpuIsa isa) {
  if (isa == CpuIsa::kAuto) isa = DetectCpuIsa();
  if (!CpuSupports(isa)) return UnavailableError("this CPU does not support ", CpuIsaName(isa));
  switch (isa) {
    case CpuIsa::kAvx512Bf16: return &Avx512Bf16Kernels();
    case CpuIsa::kAvx512: return &Avx512Kernels();
    case CpuIsa::kAvx2: return &Avx2Kernels();
    default: return &ScalarKernels();
  }
}

std::vector<WorkItem> SplitWork(std::span<const int64_t> numels, int64_t chunk) {
  std::vector<WorkItem> items;
  for (size_t t = 0; t < numels.size(); ++t) {
    for (int64_t b = 0; b < numels[t]; b += chunk) items.push_back({static_cast<int64_t>(t), b, std::min(numels[t], b + chunk)});
  }
  return items;
}

void RunWork(const CpuKernelOptions& o, int64_t n, const std::function<void(int64_t)>& fn) {
  if (o.pool == nullptr) {
    for (int64_t i = 0; i < n; ++i) fn(i);
  } else {
    o.pool->ParallelFor(n, fn, o.threads);
  }
}

Status CheckOptions(const CpuKernelOptions& o) {
  if (o.chunk < 1) return InvalidArgumentError("kernel chunk must be >= 1 element, got ", o.chunk);
  return Status();
}

}  // namespace internal

std::string_view CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAuto: return "auto";
    case CpuIsa::kScalar: return "scalar";
    case CpuIsa::kAvx2: return "avx2";
    case CpuIsa::kAvx512: return "avx512";
    case CpuIsa::kAvx512Bf16: return "avx512bf16";
  }
  return "invalid";
}

bool CpuSupports(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAuto:
    case CpuIsa::kScalar: return true;
    case CpuIsa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    case CpuIsa::kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("f16c");
    case CpuIsa::kAvx512Bf16:
      return CpuSupports(CpuIsa::kAvx512) && __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512vbmi");
  }
  return false;
}

CpuIsa DetectCpuIsa() {
  if (CpuSupports(CpuIsa::kAvx512Bf16)) return CpuIsa::kAvx512Bf16;
  if (CpuSupports(CpuIsa::kAvx512)) return CpuIsa::kAvx512;
  if (CpuSupports(CpuIsa::kAvx2)) return CpuIsa::kAvx2;
  return CpuIsa::kScalar;
}

}  // namespace zrt::kernels
