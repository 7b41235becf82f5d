// CPU kernel dispatch: validates arguments, picks the instruction set, splits the work into fixed-size
// chunks (independent of the thread count, so results do not depend on it) and runs them on the pool.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "zrt/kernels/adam.h"
#include "zrt/kernels/cpu_table.h"
#include "zrt/core/thread_pool.h"

namespace zrt::kernels {
namespace {

using internal::CpuKernelTable;

Result<int> Kind(DType t, const char* what) {
  switch (t) {
    case DType::kF32: return internal::kElemF32;
    case DType::kBF16: return internal::kElemBf16;
    case DType::kF16: return internal::kElemF16;
    default: return InvalidArgumentError(what, " dtype ", DTypeName(t), " unsupported (f32, bf16 or f16)");
  }
}

Result<const CpuKernelTable*> Table(CpuIsa isa) {
  if (isa == CpuIsa::kAuto) isa = DetectCpuIsa();
  if (!CpuSupports(isa)) return UnavailableError("this CPU does not support ", CpuIsaName(isa));
  switch (isa) {
    case CpuIsa::kAvx512: return &internal::Avx512Kernels();
    case CpuIsa::kAvx2: return &internal::Avx2Kernels();
    default: return &internal::ScalarKernels();
  }
}

// [begin, end) of one tensor.
struct WorkItem {
  int64_t tensor;
  int64_t begin;
  int64_t end;
};

std::vector<WorkItem> Split(std::span<const int64_t> numels, int64_t chunk) {
  std::vector<WorkItem> items;
  for (size_t t = 0; t < numels.size(); ++t) {
    for (int64_t b = 0; b < numels[t]; b += chunk) items.push_back({static_cast<int64_t>(t), b, std::min(numels[t], b + chunk)});
  }
  return items;
}

void Run(const CpuKernelOptions& o, int64_t n, const std::function<void(int64_t)>& fn) {
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

}  // namespace

std::string_view CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAuto: return "auto";
    case CpuIsa::kScalar: return "scalar";
    case CpuIsa::kAvx2: return "avx2";
    case CpuIsa::kAvx512: return "avx512";
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
  }
  return false;
}

CpuIsa DetectCpuIsa() {
  if (CpuSupports(CpuIsa::kAvx512)) return CpuIsa::kAvx512;
  if (CpuSupports(CpuIsa::kAvx2)) return CpuIsa::kAvx2;
  return CpuIsa::kScalar;
}

Result<AdamStepScalars> MakeAdamStepScalars(const AdamConfig& c, int64_t step, double grad_scale) {
  if (step < 1) return InvalidArgumentError("adam: step must be >= 1 (counted from 1), got ", step);
  if (!(c.lr >= 0) || !std::isfinite(c.lr)) return InvalidArgumentError("adam: lr must be finite and >= 0, got ", c.lr);
  if (!(c.beta1 >= 0 && c.beta1 < 1)) return InvalidArgumentError("adam: beta1 must be in [0, 1), got ", c.beta1);
  if (!(c.beta2 >= 0 && c.beta2 < 1)) return InvalidArgumentError("adam: beta2 must be in [0, 1), got ", c.beta2);
  if (!(c.eps >= 0) || !std::isfinite(c.eps)) return InvalidArgumentError("adam: eps must be finite and >= 0, got ", c.eps);
  if (!(c.weight_decay >= 0) || !std::isfinite(c.weight_decay)) {
    return InvalidArgumentError("adam: weight_decay must be finite and >= 0, got ", c.weight_decay);
  }
  if (!(grad_scale > 0) || !std::isfinite(grad_scale)) {
    return InvalidArgumentError("adam: grad_scale must be finite and > 0, got ", grad_scale);
  }
  const double t = static_cast<double>(step);
  const double bc1 = c.bias_correction ? 1.0 - std::pow(c.beta1, t) : 1.0;
  const double bc2 = c.bias_correction ? 1.0 - std::pow(c.beta2, t) : 1.0;
  AdamStepScalars s{};
  s.beta1 = static_cast<float>(c.beta1);
  s.beta2 = static_cast<float>(c.beta2);
  s.one_minus_beta1 = static_cast<float>(1.0 - c.beta1);
  s.one_minus_beta2 = static_cast<float>(1.0 - c.beta2);
  s.eps = static_cast<float>(c.eps);
  s.use_l2 = c.mode == AdamMode::kAdamL2 && c.weight_decay != 0;
  s.l2 = s.use_l2 ? static_cast<float>(c.weight_decay) : 0.0f;
  s.use_decay = c.mode == AdamMode::kAdamW && c.weight_decay != 0;
  s.decay = s.use_decay ? static_cast<float>(1.0 - c.lr * c.weight_decay) : 1.0f;
  s.neg_step_size = static_cast<float>(-c.lr / bc1);
  s.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  s.grad_scale = static_cast<float>(grad_scale);
  s.amsgrad = c.amsgrad;
  return s;
}

Status AdamCpu(const AdamStepScalars& s, std::span<const AdamTensorArgs> tensors, DType grad_dtype, DType copy_dtype,
               const CpuKernelOptions& options) {
  RETURN_IF_ERROR(CheckOptions(options), "adam");
  ASSIGN_OR_RETURN(const int grad_kind, Kind(grad_dtype, "gradient"), "adam");
  int copy_kind = internal::kElemNone;
  std::vector<int64_t> numels(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const AdamTensorArgs& t = tensors[i];
    if (t.numel < 0) return InvalidArgumentError("adam: tensor ", i, " has negative numel ", t.numel);
    if (t.numel > 0 && (!t.param || !t.grad || !t.exp_avg || !t.exp_avg_sq)) {
      return InvalidArgumentError("adam: tensor ", i, " has a null param, grad, exp_avg or exp_avg_sq");
    }
    if (t.numel > 0 && s.amsgrad && !t.max_exp_avg_sq) {
      return InvalidArgumentError("adam: tensor ", i, ": amsgrad needs max_exp_avg_sq");
    }
    if (t.param_copy != nullptr && copy_kind == internal::kElemNone) {
      if (copy_dtype != DType::kBF16 && copy_dtype != DType::kF16) {
        return InvalidArgumentError("adam: parameter copy dtype ", DTypeName(copy_dtype), " unsupported (bf16 or f16)");
      }
      copy_kind = copy_dtype == DType::kBF16 ? internal::kElemBf16 : internal::kElemF16;
    }
    numels[i] = t.numel;
  }
  ASSIGN_OR_RETURN(const CpuKernelTable* table, Table(options.isa), "adam");
  const std::vector<WorkItem> items = Split(numels, options.chunk);
  Run(options, static_cast<int64_t>(items.size()), [&](int64_t k) {
    const WorkItem& w = items[static_cast<size_t>(k)];
    const AdamTensorArgs& t = tensors[static_cast<size_t>(w.tensor)];
    const internal::AdamRange r{t.param, t.grad, t.exp_avg, t.exp_avg_sq, s.amsgrad ? t.max_exp_avg_sq : nullptr,
                                t.param_copy, w.begin, w.end};
    table->adam(s, r, grad_kind, t.param_copy ? copy_kind : internal::kElemNone);
  });
  return Status();
}

Result<GradStats> GradSumSquaresCpu(std::span<const GradRef> grads, DType dtype, const CpuKernelOptions& options) {
  RETURN_IF_ERROR(CheckOptions(options), "grad sum of squares");
  ASSIGN_OR_RETURN(const int kind, Kind(dtype, "gradient"), "grad sum of squares");
  std::vector<int64_t> numels(grads.size());
  for (size_t i = 0; i < grads.size(); ++i) {
    if (grads[i].numel < 0 || (grads[i].numel > 0 && grads[i].data == nullptr)) {
      return InvalidArgumentError("grad sum of squares: gradient ", i, " is null or has a negative size");
    }
    numels[i] = grads[i].numel;
  }
  ASSIGN_OR_RETURN(const CpuKernelTable* table, Table(options.isa), "grad sum of squares");
  const std::vector<WorkItem> items = Split(numels, options.chunk);
  std::vector<double> partial(items.size());
  std::vector<char> bad(items.size());
  Run(options, static_cast<int64_t>(items.size()), [&](int64_t k) {
    const WorkItem& w = items[static_cast<size_t>(k)];
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

Status CastCpu(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n, const CpuKernelOptions& options) {
  RETURN_IF_ERROR(CheckOptions(options), "cast");
  ASSIGN_OR_RETURN(const int sk, Kind(src_dtype, "cast source"));
  ASSIGN_OR_RETURN(const int dk, Kind(dst_dtype, "cast destination"));
  if (n < 0) return InvalidArgumentError("cast: negative element count ", n);
  if (n > 0 && (src == nullptr || dst == nullptr)) return InvalidArgumentError("cast: null buffer");
  if (n == 0) return Status();
  if (sk == dk) {
    if (src != dst) std::memmove(dst, src, static_cast<size_t>(n) * DTypeSize(src_dtype));
    return Status();
  }
  ASSIGN_OR_RETURN(const CpuKernelTable* table, Table(options.isa), "cast");
  const int64_t items = (n + options.chunk - 1) / options.chunk;
  Run(options, items, [&](int64_t k) {
    table->cast(src, sk, dst, dk, k * options.chunk, std::min(n, (k + 1) * options.chunk));
  });
  return Status();
}

}  // namespace zrt::kernels
