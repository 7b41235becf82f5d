// Adam/AdamW on the CPU: argument checks, then the ISA kernel over fixed-size work items.
#include "zrt/kernels/adam.h"

#include <cmath>

#include "zrt/kernels/cpu_dispatch.h"

namespace zrt::kernels {

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
  RETURN_IF_ERROR(internal::CheckOptions(options), "adam");
  ASSIGN_OR_RETURN(const int grad_kind, internal::ElemKindOf(grad_dtype, "gradient"), "adam");
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
  ASSIGN_OR_RETURN(const internal::CpuKernelTable* table, internal::TableFor(options.isa), "adam");
  const std::vector<internal::WorkItem> items = internal::SplitWork(numels, options.chunk);
  internal::RunWork(options, static_cast<int64_t>(items.size()), [&](int64_t k) {
    const internal::WorkItem& w = items[static_cast<size_t>(k)];
    const AdamTensorArgs& t = tensors[static_cast<size_t>(w.tensor)];
    const internal::AdamRange r{t.param, t.grad, t.exp_avg, t.exp_avg_sq, s.amsgrad ? t.max_exp_avg_sq : nullptr,
                                t.param_copy, w.begin, w.end};
    table->adam(s, r, grad_kind, t.param_copy ? copy_kind : internal::kElemNone);
  });
  return Status();
}

}  // namespace zrt::kernels
