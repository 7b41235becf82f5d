// Bulk casts on the CPU: equal dtypes move, others run the ISA kernel over fixed-size items.
#include "zrt/kernels/cast.h"

#include <algorithm>
#include <cstring>

#include "zrt/kernels/cpu_dispatch.h"

namespace zrt::kernels {

Status CastCpu(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n, const CpuKernelOptions& options) {
  RETURN_IF_ERROR(internal::CheckOptions(options), "cast");
  ASSIGN_OR_RETURN(const int sk, internal::ElemKindOf(src_dtype, "cast source"));
  ASSIGN_OR_RETURN(const int dk, internal::ElemKindOf(dst_dtype, "cast destination"));
  if (n < 0) return InvalidArgumentError("cast: negative element count ", n);
  if (n > 0 && (src == nullptr || dst == nullptr)) return InvalidArgumentError("cast: null buffer");
  if (n == 0) return Status();
  if (sk == dk) {
    if (src != dst) std::memmove(dst, src, static_cast<size_t>(n) * DTypeSize(src_dtype));
    return Status();
  }
  ASSIGN_OR_RETURN(const internal::CpuKernelTable* table, internal::TableFor(options.isa), "cast");
  const int64_t items = (n + options.chunk - 1) / options.chunk;
  internal::RunWork(options, items, [&](int64_t k) {
    table->cast(src, sk, dst, dk, k * options.chunk, std::min(n, (k + 1) * options.chunk));
  });
  return Status();
}

}  // namespace zrt::kernels
