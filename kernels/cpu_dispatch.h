// Internal: what every CPU op shares: dtype -> element kind, the ISA's function table, fixed-size work
// items (independent of the thread count, so results do not depend on it) run on the pool.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "zrt/core/dtype.h"
#include "zrt/core/status.h"
#include "zrt/kernels/cpu.h"
#include "zrt/kernels/cpu_table.h"

namespace zrt::kernels::internal {

// kElemF32/Bf16/F16 for a float dtype; InvalidArgument naming `what` otherwise.
Result<int> ElemKindOf(DType t, const char* what);
// The function table of `isa` (kAuto: the best this CPU supports); Unavailable if unsupported.
Result<const CpuKernelTable*> TableFor(CpuIsa isa);

// [begin, end) of one tensor.
struct WorkItem {
  int64_t tensor;
  int64_t begin;
  int64_t end;
};
// The tensors cut into items of `chunk` elements, in order.
std::vector<WorkItem> SplitWork(std::span<const int64_t> numels, int64_t chunk);
// fn(0..n-1), on the options' pool (with its thread bound) or the calling thread.
void RunWork(const CpuKernelOptions& o, int64_t n, const std::function<void(int64_t)>& fn);
Status CheckOptions(const CpuKernelOptions& o);

}  // namespace zrt::kernels::internal
