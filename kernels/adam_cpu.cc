// Adam/AdamW on the CPU: argument checks, then the ISA kernel over fixed-size work items (for compact
// state: whole q8 blocks, never across a 2^32 boundary of the global index, where the rounding key changes).
#include "zrt/kernels/adam.h"

#include <cmath>
#include <string>

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
  s.compact_step = static_cast<float>(-c.lr * std::sqrt(bc2) / bc1);
  s.compact_eps = static_cast<float>(c.eps * std::sqrt(bc2));
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

Status CheckCompactFormat(const CompactFormat& f) {
  for (Precision m : {f.exp_avg, f.exp_avg_sq}) {
    if (m != Precision::kF32 && m != Precision::kBF16 && m != Precision::kQ8 && m != Precision::kQ4) {
      return InvalidArgumentError("invalid moment format ", static_cast<int>(m));
    }
  }
  if (f.block < 8 || f.block > kMaxQuantBlock || (f.block & (f.block - 1)) != 0) {
    return InvalidArgumentError("q8/q4 block must be a power of two in [8, ", kMaxQuantBlock, "], got ", f.block);
  }
  return Status();
}

namespace {

Status CheckCompactArgs(const AdamCompactArgs& t, size_t i, DType copy_dtype) {
  RETURN_IF_ERROR(CheckCompactFormat(t.format), "adam: tensor ", i);
  const bool q8 = IsBlockwise(t.format.exp_avg) || IsBlockwise(t.format.exp_avg_sq);
  if (t.numel < 0 || t.index < 0) return InvalidArgumentError("adam: tensor ", i, " has negative numel or index");
  if (t.numel == 0) return Status();
  if (!t.param || !t.grad || !t.exp_avg || !t.exp_avg_sq) return InvalidArgumentError("adam: tensor ", i, " has a null param, grad or moment");
  if ((IsBlockwise(t.format.exp_avg) && !t.exp_avg_scale) || (IsBlockwise(t.format.exp_avg_sq) && !t.exp_avg_sq_scale)) {
    return InvalidArgumentError("adam: tensor ", i, ": a q8 or q4 moment needs its scales");
  }
  if (q8 && t.index % t.format.block != 0) {
    return InvalidArgumentError("adam: tensor ", i, ": index ", t.index, " is not a multiple of the block ", t.format.block);
  }
  if (!t.format.master && t.param_copy) return InvalidArgumentError("adam: tensor ", i, ": without a master the parameters are updated in place (no copy)");
  if (t.param_copy && copy_dtype != DType::kBF16 && copy_dtype != DType::kF16) {
    return InvalidArgumentError("adam: parameter copy dtype ", DTypeName(copy_dtype), " unsupported (bf16 or f16)");
  }
  return Status();
}

// The work items of one tensor: chunks of whole blocks, cut where the global index crosses 2^32.
void CompactItems(const AdamCompactArgs& t, int64_t tensor, int64_t chunk, std::vector<internal::WorkItem>& out) {
  const int64_t step = (chunk + t.format.block - 1) / t.format.block * t.format.block;
  for (int64_t b = 0; b < t.numel;) {
    int64_t e = std::min(t.numel, b + step);
    const int64_t wrap = ((t.index + b) >> 32) + 1;  // the next 2^32 boundary, as a local element
    e = std::min(e, (wrap << 32) - t.index);
    out.push_back({tensor, b, e});
    b = e;
  }
}

}  // namespace

Status AdamCompactCpu(const AdamStepScalars& s, int64_t step, std::span<const AdamCompactArgs> tensors, DType grad_dtype,
                      DType copy_dtype, const CpuKernelOptions& options) {
  RETURN_IF_ERROR(internal::CheckOptions(options), "adam");
  ASSIGN_OR_RETURN(const int grad_kind, internal::ElemKindOf(grad_dtype, "gradient"), "adam");
  if (s.amsgrad) return InvalidArgumentError("adam: amsgrad needs f32 moments and a master (the compact step has no max_exp_avg_sq)");
  if (step < 1) return InvalidArgumentError("adam: step must be >= 1, got ", step);
  std::vector<internal::WorkItem> items;
  for (size_t i = 0; i < tensors.size(); ++i) {
    RETURN_IF_ERROR(CheckCompactArgs(tensors[i], i, copy_dtype));
    CompactItems(tensors[i], static_cast<int64_t>(i), options.chunk, items);
  }
  const int copy_kind = copy_dtype == DType::kBF16 ? internal::kElemBf16 : copy_dtype == DType::kF16 ? internal::kElemF16 : internal::kElemNone;
  ASSIGN_OR_RETURN(const internal::CpuKernelTable* table, internal::TableFor(options.isa), "adam");
  internal::RunWork(options, static_cast<int64_t>(items.size()), [&](int64_t k) {
    const internal::WorkItem& w = items[static_cast<size_t>(k)];
    const AdamCompactArgs& t = tensors[static_cast<size_t>(w.tensor)];
    const CompactFormat& f = t.format;
    const auto global = static_cast<uint64_t>(t.index + w.begin);
    const internal::CompactRange r{t.param, t.grad, t.exp_avg, t.exp_avg_scale, t.exp_avg_sq, t.exp_avg_sq_scale, t.param_copy,
                                   w.begin, w.end, f.block, RoundingKey(f.seed, static_cast<uint64_t>(step), static_cast<uint32_t>(global >> 32)),
                                   static_cast<uint32_t>(t.index)};
    const internal::CompactKinds kinds{grad_kind, t.param_copy ? copy_kind : internal::kElemNone, static_cast<int>(f.exp_avg),
                                       static_cast<int>(f.exp_avg_sq), !f.master};
    table->adam_compact(s, r, kinds);
  });
  return Status();
}

}  // namespace zrt::kernels
