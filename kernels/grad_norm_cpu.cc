// Gradient sum of squares on the CPU: per-item partials summed in a fixed order (deterministic).
#include "zrt/kernels/grad_norm.h"

#include "zrt/kernels/cpu_dispatch.h"

namespace zrt::kernels {

Result<GradStats> GradSumSquaresCpu(std::span<const GradRef> grads, DType dtype, const CpuKernelOptions& options) {
  RETURN_IF_ERROR(internal::CheckOptions(options), "grad sum of squares");
  ASSIGN_OR_RETURN(const int kind, internal::ElemKindOf(dtype, "gradient"), "grad sum of squares");
  std::vector<int64_t> numels(grads.size());
  for (size_t i = 0; i < grads.size(); ++i) {
    if (grads[i].numel < 0 || (grads[i].numel > 0 && grads[i].data == nullptr)) {
      return InvalidArgumentError("grad sum of squares: gradient ", i, " is null or has a negative size");
    }
    numels[i] = grads[i].numel;
  }
  ASSIGN_OR_RETURN(const internal::CpuKernelTable* table, internal::TableFor(options.isa), "grad sum of squares");
  const std::vector<internal::WorkItem> items = internal::SplitWork(numels, options.chunk);
  std::vector<double> partial(items.size());
  std::vector<char> bad(items.size());
  internal::RunWork(options, static_cast<int64_t>(items.size()), [&](int64_t k) {
    const internal::WorkItem& w = items[static_cast<size_t>(k)];
    bool nf = false;
    table->sum_squares(grads[static_cast<size_t>(w.tensor)].data, kind, w.begin, w.end, &partial[static_cast<size_t>(k)], &nf);
    bad[static_cast<size_t>(k)] = nf;
  });
  GradStats out;
  for (size_t k = 0; k < items.size(); ++k) {  // fixed order: deterministic whatever the threads
    out.sum_squares += partial[k];
    out.nonfinite = out.nonfinite || bad[k];
  }
  return out;
}

}  // namespace zrt::kernels
