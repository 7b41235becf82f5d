// The Adam/AdamW update of one element: the single definition shared by the scalar, AVX2 and AVX-512
// CPU kernels and the CUDA kernel (../shared/STYLE.md item 3).
//
// AdamElement is a template over the value type: `float` for the scalar and CUDA paths, a SIMD vector
// type with the same operators for the CPU kernels. Every path performs the same IEEE operations in
// the same order (kernels build with -ffp-contract=off and nvcc --fmad=false), so all of them produce
// bit-identical results; the tests rely on it. Where a fused multiply-add is wanted it is explicit
// (Fma), so it is the same on every path.
//
// Convention (PyTorch, ../shared/reference/*/case.json), with PyTorch's CPU operation order and
// roundings (fma marks where its kernels fuse: Tensor.add_(x, alpha=a) is fma(x, a, self)). With this
// order every parameter and moment in ../shared/reference is reproduced bit for bit.
//   g  = grad * grad_scale                       (unscale and clip in one multiply; skipped when 1)
//   Adam (L2):  g = fma(p, wd, g)                AdamW: p = p * (1 - lr * wd)
//   m  = fma(g, 1 - b1, b1 * m)
//   v  = fma((1 - b2) * g, g, b2 * v)           (Tensor.addcmul_ fuses too)
//   v^ = max(v^, v) if amsgrad, else v
//   p  = p + ((-lr / (1 - b1^t)) * m) / (sqrt(v^) / sqrt(1 - b2^t) + eps)
// Compact state (CompactAdamElement; no PyTorch state to match: bf16, q8 or q4 moments, or no master)
// takes Kingma & Ba's form of the same update, with one divide where PyTorch's order has two:
//   p  = p + ((-lr sqrt(1 - b2^t) / (1 - b1^t)) * m) / (sqrt(v) + eps sqrt(1 - b2^t))
#pragma once

#include <cstdint>

#include "zrt/core/dtype.h"
#include "zrt/kernels/adam_config.h"

namespace zrt::kernels {


// Per-step scalars, computed once on the host in double and rounded to float (MakeAdamStepScalars in
// kernels/adam.h). Plain data: passed by value to CUDA kernels.
struct AdamStepScalars {
  float beta1;
  float beta2;
  float one_minus_beta1;
  float one_minus_beta2;
  float eps;
  float l2;            // Adam(L2): weight decay added to the gradient; 0 for AdamW
  float decay;         // AdamW: 1 - lr * wd, applied to the parameter first; 1 for Adam(L2)
  float neg_step_size;  // -lr / (1 - beta1^t)
  float bc2_sqrt;       // sqrt(1 - beta2^t)
  float compact_step;   // -lr * sqrt(1 - beta2^t) / (1 - beta1^t): CompactAdamElement's step size
  float compact_eps;    // eps * sqrt(1 - beta2^t): CompactAdamElement's eps
  float grad_scale;    // gradients are multiplied by this first: 1 / (loss_scale * clip_coef)
  bool amsgrad;
  bool use_l2;
  bool use_decay;
};

ZRT_HD float Sqrt(float x) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(x);
#else
  return __builtin_sqrtf(x);
#endif
}
// Same semantics as x86 maxps(a, b): b when unordered.
ZRT_HD float Max(float a, float b) { return a > b ? a : b; }
// a * b + c with one rounding (hardware FMA on every path).
ZRT_HD float Fma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return __builtin_fmaf(a, b, c);
#endif
}

// The gradient's unscale, L2 or decoupled decay, and both moments: what every update shares.
template <class V>
ZRT_HD void AdamMoments(const AdamStepScalars& s, V& p, V g, V& m, V& v) {
  if (s.grad_scale != 1.0f) g = g * V(s.grad_scale);  // g * 1 is g (a signaling NaN is quieted by the next operation)
  if (s.use_l2) g = Fma(p, V(s.l2), g);
  if (s.use_decay) p = p * V(s.decay);
  m = Fma(g, V(s.one_minus_beta1), V(s.beta1) * m);
  v = Fma(V(s.one_minus_beta2) * g, g, V(s.beta2) * v);
}

// Updates one element (or one vector of elements) in PyTorch's order. `vmax` is null unless amsgrad.
template <class V>
ZRT_HD void AdamElement(const AdamStepScalars& s, V& p, V g, V& m, V& v, V* vmax) {
  AdamMoments<V>(s, p, g, m, v);
  V vhat = v;
  if (vmax != nullptr) {
    *vmax = Max(*vmax, v);
    vhat = *vmax;
  }
  const V denom = Sqrt(vhat) / V(s.bc2_sqrt) + V(s.eps);
  p = p + (V(s.neg_step_size) * m) / denom;
}

// The update of compact state: the same moments, then one divide and one square root (the divider is
// what bounds a compact step on a CPU; docs/kernels.md "Compact state").
template <class V>
ZRT_HD void CompactAdamElement(const AdamStepScalars& s, V& p, V g, V& m, V& v) {
  AdamMoments<V>(s, p, g, m, v);
  p = p + (V(s.compact_step) * m) / (Sqrt(v) + V(s.compact_eps));
}

// The multiplier applied to every gradient before the update, and the pre-clip norm, from the global
// sum of squares of the (loss-scaled) gradients. Clipping follows torch.nn.utils.clip_grad_norm_:
// coef = max_norm / (norm + 1e-6), applied only when < 1; max_norm <= 0 disables clipping.
// Shared by the CPU engine and the CUDA finalize kernel so both compute the very same float.
ZRT_HD float GradMultiplier(double sum_squares, float loss_scale, float max_norm, float* norm_out) {
#if defined(__CUDA_ARCH__)
  const double root = sqrt(sum_squares);
#else
  const double root = __builtin_sqrt(sum_squares);
#endif
  const float norm = static_cast<float>(root / static_cast<double>(loss_scale));
  if (norm_out != nullptr) *norm_out = norm;
  float coef = 1.0f;
  if (max_norm > 0.0f) {
    const float c = max_norm / (norm + 1e-6f);
    if (c < 1.0f) coef = c;
  }
  return coef / loss_scale;
}

}  // namespace zrt::kernels
