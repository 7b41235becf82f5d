// A GPT-2 architecture decoder (token + position embeddings, pre-LayerNorm blocks with causal
// multi-head self-attention and a tanh-GELU MLP, a final LayerNorm, the output projection tied to the
// token embedding), forward and backward in fp32 on the CPU, matrix products through BLAS.
//
// The model computes block by block, so that a trainer gathers one block's parameters at a time
// (ZeRO stage 3): Embed, Block(0..L-1), Head (loss) forward; HeadBackward, BlockBackward(L-1..0),
// EmbedBackward backward. Activations of the last forward are kept for its backward. Weight layouts
// are GPT-2's (a linear layer's weight is [in, out]: y = x W + b).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "zrt/core/status.h"

namespace gpt {

struct Config {
  int vocab = 256;  // byte-level tokens
  int context = 64;
  int layers = 2;
  int dim = 64;
  int heads = 4;
  int64_t num_params() const;
  // Forward + backward FLOPs per token (6N for the weights' matrix products + attention's 12 L T D).
  double flops_per_token() const;
};

// "tiny" (CI), "small" (~11M parameters), "gpt2" (GPT-2 124M's shape with byte tokens: 86M).
zrt::Result<Config> Preset(std::string_view name);

// This core's fp32 GEMM rate (FLOP/s) on n x n x n products through the same BLAS, one thread, best
// of at least 0.2 s of products: the peak MFU is measured against (measure it with the core to itself).
double MeasurePeakGemmFlops(int n = 512);

// The parameters, in registration order: name, shape, gather group, and whether AdamW decays it
// (matrices yes; biases, LayerNorm and embeddings no).
struct TensorDef {
  std::string name;
  std::vector<int64_t> shape;
  std::string group;  // "embed" (wte, wpe), "h.<l>" per block, "head" (ln_f)
  bool decay;
};
std::vector<TensorDef> Tensors(const Config& c);
// GPT-2's initialisation of element i of tensor t: N(0, 0.02) for matrices and embeddings (the
// residual projections scaled by 1/sqrt(2L)), ones for LayerNorm weights, zeros for biases; from a
// hash of (seed, t, i), so any rank computes any element.
float InitValue(const Config& c, const std::vector<TensorDef>& defs, uint64_t seed, int64_t t, int64_t i);

// Per block, the tensors in Tensors() order: ln_1 w/b, c_attn w/b, attn c_proj w/b, ln_2 w/b, c_fc w/b,
// mlp c_proj w/b.
constexpr int kBlockTensors = 12;
struct BlockParams {
  const float* p[kBlockTensors];
};
struct BlockGrads {
  float* g[kBlockTensors];
};

class Model {
 public:
  Model(const Config& c, int batch);

  // tokens: batch x (context + 1) bytes; inputs are [:, :T], targets [:, 1:].
  void Embed(const float* wte, const float* wpe, const uint8_t* tokens);
  void Block(int layer, const BlockParams& w);
  // Mean cross-entropy of the targets; keeps the probabilities for HeadBackward.
  double Head(const float* ln_w, const float* ln_b, const float* wte);
  // Gradients are added (+=) into the given buffers.
  void HeadBackward(const float* ln_w, const float* ln_b, const float* wte, float* d_ln_w, float* d_ln_b, float* d_wte);
  void BlockBackward(int layer, const BlockParams& w, const BlockGrads& g);
  void EmbedBackward(float* d_wte, float* d_wpe);

  // Bytes of activations kept for the backward (what a trainer holds besides the model state).
  int64_t activation_bytes() const;

  // Next-token probabilities at position `pos` of sequence 0 (after Head).
  const float* probs(int pos) const { return probs_.data() + static_cast<size_t>(pos) * static_cast<size_t>(c_.vocab); }

 private:
  struct Acts {  // one block's saved activations
    std::vector<float> x, ln1, mean1, rstd1, qkv, att, y, x_mid, ln2, mean2, rstd2, fc, gelu;
  };
  Config c_;
  int B_, N_;  // batch, batch * context
  std::vector<uint8_t> tokens_;
  std::vector<Acts> acts_;
  std::vector<float> x_, lnf_, meanf_, rstdf_, probs_;
  std::vector<float> dx_, scratch_a_, scratch_b_, scratch_c_;
};

}  // namespace gpt
