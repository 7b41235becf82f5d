// A GPT-2 architecture decoder (token + position embeddings, pre-LayerNorm blocks with causal
// multi-head self-attention and a tanh-GELU MLP, a final LayerNorm, the output projection tied to the
// token embedding), forward and backward in fp32 on the CPU, matrix products through BLAS.
//
// Mixture of experts (Config::experts > 0): each block's MLP is E experts of the same shape and a
// router (a [D, E] linear layer, no bias). A token goes to the top_k experts of its router softmax p
// (ties to the lower index) and its output is sum_e p_e expert_e(x) over them (Switch/GShard gating:
// p itself, so the router learns from the loss at top_k = 1 too). Load balancing (Switch Transformer):
// each block adds aux_loss * E * sum_e f_e P_e to the loss, f_e the share of the block's token-slots
// routed to e (a constant of the step), P_e the mean of p_e over the tokens.
//
// Expert parallelism (ExpertParallel): the experts split over the ranks of an expert-parallel group,
// rank r computing experts [r E / P, (r + 1) E / P) for the tokens of every rank of the group (an
// all-to-all dispatches each token-slot to its expert's rank and another brings the output back; the
// backward does the same with the gradients). The router, the gating and the load-balancing term stay
// on each rank's own tokens, so a rank's loss is what it would be with every expert local.
//
// The model computes block by block, so that a trainer gathers one block's parameters at a time
// (ZeRO stage 3): Embed, Block(0..L-1), Head (loss) forward; HeadBackward, BlockBackward(L-1..0),
// EmbedBackward backward. Activations of the last forward are kept for its backward. Weight layouts
// are GPT-2's (a linear layer's weight is [in, out]: y = x W + b).
#pragma once

#include <cstdint>
#include <functional>
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
  int experts = 0;         // > 0: a mixture of this many experts in place of each block's MLP
  int top_k = 1;           // experts per token (<= experts)
  float aux_loss = 0.01f;  // the load-balancing term's weight
  int64_t num_params() const;
  // Tensors per block: 12 with the dense MLP; 9 + 4 experts with experts.
  int block_tensors() const { return experts > 0 ? 9 + 4 * experts : 12; }
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

// Where a model's experts are (Config::experts > 0): P ranks of an expert-parallel group, this one
// `rank`, holding experts [rank E / P, (rank + 1) E / P) (E a multiple of P). Default: every expert here.
struct ExpertParallel {
  int ranks = 1, rank = 0;
  // Collective over the group (every rank calls it at the same points): send[q] goes to rank q;
  // returns, by rank, what each sent this one. Needed when ranks > 1.
  std::function<std::vector<std::vector<float>>(std::vector<std::vector<float>> send)> exchange;
  bool holds(int expert, int experts) const { return expert / (experts / ranks) == rank; }
};

// Per block, the tensors in Tensors() order (Config::block_tensors() of them): ln_1 w/b, c_attn w/b,
// attn c_proj w/b, ln_2 w/b, then mlp c_fc w/b and mlp c_proj w/b, or (experts) the router's weight and
// per expert its c_fc w/b and c_proj w/b. With expert parallelism the experts of other ranks are not
// read (their pointers may be null), and a local expert's gradients are the sum of every group rank's
// loss's gradient (the engine's reduction over the expert-data-parallel group, the ranks holding the
// same experts, divides by the world: docs/engine.md "Tensors with their own data-parallel group").
struct BlockParams {
  std::vector<const float*> p;
};
struct BlockGrads {
  std::vector<float*> g;
};

class Model {
 public:
  Model(const Config& c, int batch, ExpertParallel ep = {});

  // tokens: batch x (context + 1) bytes; inputs are [:, :T], targets [:, 1:].
  void Embed(const float* wte, const float* wpe, const uint8_t* tokens);
  void Block(int layer, const BlockParams& w);
  // Mean cross-entropy of the targets, plus the blocks' load-balancing terms (experts); keeps the
  // probabilities for HeadBackward.
  double Head(const float* ln_w, const float* ln_b, const float* wte);
  // The load-balancing terms of the last forward (0 without experts).
  double aux_loss() const;
  // The experts each token of the last forward went to in `layer`, top_k per token (experts only).
  const std::vector<int>& routes(int layer) const { return acts_[static_cast<size_t>(layer)].route; }
  // The router's probabilities in `layer` of the last forward, [tokens, experts] (experts only).
  const std::vector<float>& router_probs(int layer) const { return acts_[static_cast<size_t>(layer)].prob; }
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
    // experts: router probabilities [N, E], the experts per token [N, top_k], each expert's token-slots
    // of this rank (n * top_k + s, in order) and their outputs ([n_e, D]); per local expert the rows
    // it computed (every group rank's, by rank: recv[q * local + j] from rank q) and its activations
    // over them ([rows, D], [rows, 4D] twice)
    std::vector<float> prob;
    std::vector<int> route;
    std::vector<std::vector<int>> slots;
    std::vector<std::vector<float>> eout, ein, efc, egelu;
    std::vector<int> recv;
    double aux = 0;
  };
  void Mlp(Acts& a, const BlockParams& w);
  void MlpBackward(Acts& a, const BlockParams& w, const BlockGrads& g, float* d_ln2);
  void Experts(Acts& a, const BlockParams& w);
  void ExpertsBackward(Acts& a, const BlockParams& w, const BlockGrads& g, float* d_ln2);
  // The expert-parallel all-to-all: send[q] to rank q, returns what each rank sent this one (on one
  // rank, send itself).
  std::vector<std::vector<float>> Exchange(std::vector<std::vector<float>> send);
  Config c_;
  ExpertParallel ep_;
  int B_, N_;  // batch, batch * context
  std::vector<uint8_t> tokens_;
  std::vector<Acts> acts_;
  std::vector<float> x_, lnf_, meanf_, rstdf_, probs_;
  std::vector<float> dx_, scratch_a_, scratch_b_, scratch_c_;
};

// The whole model at once over one fp32 buffer per tensor in Tensors() order (a trainer without
// gathers: tests, the reference, the DDP baseline): Forward returns Head's loss; Backward, after
// Forward, adds every tensor's gradient into grads.
double Forward(Model& m, const Config& c, const std::vector<const float*>& w, const uint8_t* tokens);
void Backward(Model& m, const Config& c, const std::vector<const float*>& w, const std::vector<float*>& grads);

}  // namespace gpt
