#include "examples/gpt/model.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <utility>

namespace gpt {

namespace {

using std::size_t;

size_t Z(int64_t v) { return static_cast<size_t>(v); }

// out[M,N] (=|+=) A[M,K] B[K,N], row-major.
void MatMul(const float* a, const float* b, float* out, int m, int n, int k, bool accumulate) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a, k, b, n, accumulate ? 1.0f : 0.0f, out, n);
}

// y[N,O] = x[N,I] W[I,O] + b
void Linear(const float* x, const float* w, const float* b, float* y, int n, int in, int out) {
  for (int r = 0; r < n; ++r) std::memcpy(y + Z(r) * Z(out), b, Z(out) * 4);
  MatMul(x, w, y, n, out, in, true);
}

// Appends src[at, at + n) to dst and moves at on by n.
void Take(const std::vector<float>& src, size_t& at, size_t n, std::vector<float>& dst) {
  dst.insert(dst.end(), src.begin() + static_cast<std::ptrdiff_t>(at), src.begin() + static_cast<std::ptrdiff_t>(at + n));
  at += n;
}

// dW[I,O] += x^T dy, db[O] += colsum(dy), dx[N,I] = dy W^T
void LinearBackward(const float* x, const float* w, const float* dy, float* dx, float* dw, float* db, int n, int in, int out) {
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, in, out, n, 1.0f, x, in, dy, out, 1.0f, dw, out);
  for (int r = 0; r < n; ++r) {
    for (int o = 0; o < out; ++o) db[o] += dy[Z(r) * Z(out) + Z(o)];
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, in, out, 1.0f, dy, out, w, out, 0.0f, dx, in);
}

void LayerNorm(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd, int n, int d) {
  for (int r = 0; r < n; ++r) {
    const float* xr = x + Z(r) * Z(d);
    double m = 0, v = 0;
    for (int i = 0; i < d; ++i) m += xr[i];
    m /= d;
    for (int i = 0; i < d; ++i) v += (xr[i] - m) * (xr[i] - m);
    v /= d;
    const auto s = static_cast<float>(1.0 / std::sqrt(v + 1e-5));
    mean[r] = static_cast<float>(m);
    rstd[r] = s;
    for (int i = 0; i < d; ++i) y[Z(r) * Z(d) + Z(i)] = (xr[i] - mean[r]) * s * w[i] + b[i];
  }
}

// dx (+=) the gradient through y = LN(x) w + b; dw, db +=.
void LayerNormBackward(const float* x, const float* w, const float* mean, const float* rstd, const float* dy, float* dx, float* dw,
                       float* db, int n, int d) {
  for (int r = 0; r < n; ++r) {
    const float* xr = x + Z(r) * Z(d);
    const float* g = dy + Z(r) * Z(d);
    double mean_dxhat = 0, mean_dxhat_xhat = 0;
    for (int i = 0; i < d; ++i) {
      const float xhat = (xr[i] - mean[r]) * rstd[r];
      const float dxhat = g[i] * w[i];
      mean_dxhat += dxhat;
      mean_dxhat_xhat += dxhat * xhat;
      dw[i] += g[i] * xhat;
      db[i] += g[i];
    }
    mean_dxhat /= d;
    mean_dxhat_xhat /= d;
    for (int i = 0; i < d; ++i) {
      const float xhat = (xr[i] - mean[r]) * rstd[r];
      const float dxhat = g[i] * w[i];
      dx[Z(r) * Z(d) + Z(i)] += rstd[r] * (dxhat - static_cast<float>(mean_dxhat) - xhat * static_cast<float>(mean_dxhat_xhat));
    }
  }
}

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)

float Gelu(float x) { return 0.5f * x * (1.0f + std::tanh(kGeluScale * (x + 0.044715f * x * x * x))); }
float GeluGrad(float x) {
  const float t = std::tanh(kGeluScale * (x + 0.044715f * x * x * x));
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
}

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

int64_t Config::num_params() const {
  const int64_t D = dim, mlp = 8 * D * D + 5 * D;
  const int64_t block = 4 * D * D + 8 * D + (experts > 0 ? D * experts + experts * mlp : mlp);
  return int64_t{vocab} * D + int64_t{context} * D + layers * block + 2 * D;
}

double Config::flops_per_token() const {
  // The position table is a lookup; a token passes through top_k of the experts.
  const int64_t D = dim, idle = experts > 0 ? int64_t{layers} * (experts - top_k) * (8 * D * D + 5 * D) : 0;
  const double n = static_cast<double>(num_params() - int64_t{context} * dim - idle);
  return 6.0 * n + 12.0 * layers * context * dim;
}

zrt::Result<Config> Preset(std::string_view name) {
  if (name == "tiny") return Config{256, 32, 2, 32, 2};
  if (name == "small") return Config{256, 128, 6, 384, 6};
  if (name == "gpt2") return Config{256, 1024, 12, 768, 12};
  return zrt::InvalidArgumentError("preset must be tiny, small or gpt2, got '", name, "'");
}

std::vector<TensorDef> Tensors(const Config& c) {
  const int64_t D = c.dim;
  std::vector<TensorDef> t = {{"wte", {c.vocab, D}, "embed", false}, {"wpe", {c.context, D}, "embed", false}};
  for (int l = 0; l < c.layers; ++l) {
    const std::string p = "h." + std::to_string(l) + ".", g = "h." + std::to_string(l);
    t.push_back({p + "ln_1.weight", {D}, g, false});
    t.push_back({p + "ln_1.bias", {D}, g, false});
    t.push_back({p + "attn.c_attn.weight", {D, 3 * D}, g, true});
    t.push_back({p + "attn.c_attn.bias", {3 * D}, g, false});
    t.push_back({p + "attn.c_proj.weight", {D, D}, g, true});
    t.push_back({p + "attn.c_proj.bias", {D}, g, false});
    t.push_back({p + "ln_2.weight", {D}, g, false});
    t.push_back({p + "ln_2.bias", {D}, g, false});
    if (c.experts > 0) t.push_back({p + "mlp.router.weight", {D, c.experts}, g, true});
    for (int e = 0; e < std::max(c.experts, 1); ++e) {
      const std::string m = c.experts > 0 ? p + "mlp.experts." + std::to_string(e) + "." : p + "mlp.";
      t.push_back({m + "c_fc.weight", {D, 4 * D}, g, true});
      t.push_back({m + "c_fc.bias", {4 * D}, g, false});
      t.push_back({m + "c_proj.weight", {4 * D, D}, g, true});
      t.push_back({m + "c_proj.bias", {D}, g, false});
    }
  }
  t.push_back({"ln_f.weight", {D}, "head", false});
  t.push_back({"ln_f.bias", {D}, "head", false});
  return t;
}

float InitValue(const Config& c, const std::vector<TensorDef>& defs, uint64_t seed, int64_t t, int64_t i) {
  const std::string& name = defs[Z(t)].name;
  auto ends = [&](std::string_view s) { return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0; };
  if (ends("ln_1.weight") || ends("ln_2.weight") || ends("ln_f.weight")) return 1.0f;
  if (ends(".bias")) return 0.0f;
  const uint64_t h = Mix(Mix(seed * 1000003 + static_cast<uint64_t>(t)) ^ static_cast<uint64_t>(i));
  const double u1 = (static_cast<double>(h >> 11) + 1.0) * 0x1.0p-53, u2 = static_cast<double>(Mix(h) >> 11) * 0x1.0p-53;
  const double normal = std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  const double std = ends("c_proj.weight") ? 0.02 / std::sqrt(2.0 * c.layers) : 0.02;
  return static_cast<float>(std * normal);
}

double MeasurePeakGemmFlops(int n) {
  std::vector<float> a(Z(n) * Z(n), 0.5f), b(Z(n) * Z(n), 0.25f), out(Z(n) * Z(n));
  double best = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int rep = 0; rep < 4 || std::chrono::steady_clock::now() - start < std::chrono::milliseconds(200); ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    MatMul(a.data(), b.data(), out.data(), n, n, n, false);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rep > 0) best = std::max(best, 2.0 * n * n * n / s);  // the first warms up
  }
  return best;
}

int64_t Model::activation_bytes() const {
  int64_t floats = 0;
  for (const Acts& a : acts_) {
    for (const auto* v : {&a.x, &a.ln1, &a.mean1, &a.rstd1, &a.qkv, &a.att, &a.y, &a.x_mid, &a.ln2, &a.mean2, &a.rstd2, &a.fc, &a.gelu, &a.prob}) {
      floats += static_cast<int64_t>(v->size());
    }
    floats += static_cast<int64_t>(a.route.size());
    for (const auto* vs : {&a.eout, &a.ein, &a.efc, &a.egelu}) {
      for (const auto& v : *vs) floats += static_cast<int64_t>(v.size());
    }
  }
  floats += static_cast<int64_t>(x_.size() + lnf_.size() + meanf_.size() + rstdf_.size() + probs_.size() + dx_.size() + scratch_a_.size() +
                                 scratch_b_.size() + scratch_c_.size());
  return floats * 4;
}

Model::Model(const Config& c, int batch, ExpertParallel ep) : c_(c), ep_(std::move(ep)), B_(batch), N_(batch * c.context), acts_(Z(c.layers)) {
  const size_t N = Z(N_), D = Z(c.dim), T = Z(c.context), H = Z(c.heads);
  for (Acts& a : acts_) {
    a.x.resize(N * D);
    a.ln1.resize(N * D);
    a.mean1.resize(N);
    a.rstd1.resize(N);
    a.qkv.resize(N * 3 * D);
    a.att.resize(Z(batch) * H * T * T);
    a.y.resize(N * D);
    a.x_mid.resize(N * D);
    a.ln2.resize(N * D);
    a.mean2.resize(N);
    a.rstd2.resize(N);
    if (c.experts > 0) {  // the experts' activations are sized by their tokens at each forward
      const size_t E = Z(c.experts);
      a.prob.resize(N * E);
      a.route.resize(N * Z(c.top_k));
      const size_t local = E / Z(ep_.ranks);
      a.slots.resize(E);
      a.eout.resize(E);
      a.ein.resize(local);
      a.efc.resize(local);
      a.egelu.resize(local);
      a.recv.resize(Z(ep_.ranks) * local);
    } else {
      a.fc.resize(N * 4 * D);
      a.gelu.resize(N * 4 * D);
    }
  }
  x_.resize(N * D);
  lnf_.resize(N * D);
  meanf_.resize(N);
  rstdf_.resize(N);
  probs_.resize(N * Z(c.vocab));
  dx_.resize(N * D);
  scratch_a_.resize(N * 4 * D);
  scratch_b_.resize(N * 4 * D);
  scratch_c_.resize(N * 3 * D);
}

void Model::Embed(const float* wte, const float* wpe, const uint8_t* tokens) {
  const int T = c_.context, D = c_.dim;
  tokens_.assign(tokens, tokens + Z(B_) * Z(T + 1));
  for (int b = 0; b < B_; ++b) {
    for (int t = 0; t < T; ++t) {
      const uint8_t tok = tokens[Z(b) * Z(T + 1) + Z(t)];
      float* x = x_.data() + (Z(b) * Z(T) + Z(t)) * Z(D);
      for (int d = 0; d < D; ++d) x[d] = wte[Z(tok) * Z(D) + Z(d)] + wpe[Z(t) * Z(D) + Z(d)];
    }
  }
}

void Model::Block(int layer, const BlockParams& w) {
  Acts& a = acts_[Z(layer)];
  const int N = N_, D = c_.dim, T = c_.context, H = c_.heads, hd = D / H;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  a.x = x_;
  LayerNorm(a.x.data(), w.p[0], w.p[1], a.ln1.data(), a.mean1.data(), a.rstd1.data(), N, D);
  Linear(a.ln1.data(), w.p[2], w.p[3], a.qkv.data(), N, D, 3 * D);
  std::fill(a.y.begin(), a.y.end(), 0.0f);
  for (int b = 0; b < B_; ++b) {
    for (int h = 0; h < H; ++h) {
      for (int t = 0; t < T; ++t) {
        const float* q = a.qkv.data() + (Z(b) * Z(T) + Z(t)) * Z(3 * D) + Z(h * hd);
        float* p = a.att.data() + ((Z(b) * Z(H) + Z(h)) * Z(T) + Z(t)) * Z(T);
        float mx = -INFINITY;
        for (int u = 0; u <= t; ++u) {
          const float* k = a.qkv.data() + (Z(b) * Z(T) + Z(u)) * Z(3 * D) + Z(D + h * hd);
          float s = 0;
          for (int i = 0; i < hd; ++i) s += q[i] * k[i];
          p[u] = s * scale;
          mx = std::max(mx, p[u]);
        }
        float sum = 0;
        for (int u = 0; u <= t; ++u) sum += (p[u] = std::exp(p[u] - mx));
        for (int u = 0; u < T; ++u) p[u] = u <= t ? p[u] / sum : 0.0f;
        float* y = a.y.data() + (Z(b) * Z(T) + Z(t)) * Z(D) + Z(h * hd);
        for (int u = 0; u <= t; ++u) {
          const float* v = a.qkv.data() + (Z(b) * Z(T) + Z(u)) * Z(3 * D) + Z(2 * D + h * hd);
          for (int i = 0; i < hd; ++i) y[i] += p[u] * v[i];
        }
      }
    }
  }
  Linear(a.y.data(), w.p[4], w.p[5], a.x_mid.data(), N, D, D);
  for (size_t i = 0; i < a.x_mid.size(); ++i) a.x_mid[i] += a.x[i];
  LayerNorm(a.x_mid.data(), w.p[6], w.p[7], a.ln2.data(), a.mean2.data(), a.rstd2.data(), N, D);
  if (c_.experts > 0) {
    Experts(a, w);
  } else {
    Mlp(a, w);
  }
  for (size_t i = 0; i < x_.size(); ++i) x_[i] += a.x_mid[i];
}

// x_ = c_proj(gelu(c_fc(ln2))).
void Model::Mlp(Acts& a, const BlockParams& w) {
  const int N = N_, D = c_.dim;
  Linear(a.ln2.data(), w.p[8], w.p[9], a.fc.data(), N, D, 4 * D);
  for (size_t i = 0; i < a.fc.size(); ++i) a.gelu[i] = Gelu(a.fc[i]);
  Linear(a.gelu.data(), w.p[10], w.p[11], x_.data(), N, 4 * D, D);
}

void Model::MlpBackward(Acts& a, const BlockParams& w, const BlockGrads& g, float* d_ln2) {
  const int N = N_, D = c_.dim;
  float* d_gelu = scratch_a_.data();
  LinearBackward(a.gelu.data(), w.p[10], dx_.data(), d_gelu, g.g[10], g.g[11], N, 4 * D, D);
  for (size_t i = 0; i < a.fc.size(); ++i) d_gelu[i] *= GeluGrad(a.fc[i]);
  LinearBackward(a.ln2.data(), w.p[8], d_gelu, d_ln2, g.g[8], g.g[9], N, D, 4 * D);
}

std::vector<std::vector<float>> Model::Exchange(std::vector<std::vector<float>> send) {
  return ep_.ranks == 1 ? send : ep_.exchange(std::move(send));
}

// x_ = sum over the token's top_k experts e of p_e expert_e(ln2); the load-balancing term in a.aux.
// Each token-slot's row goes to its expert's rank and its output comes back: to rank q, per expert of
// q a count, then the rows, expert by expert; back, the outputs in the same order.
void Model::Experts(Acts& a, const BlockParams& w) {
  const int N = N_, D = c_.dim, E = c_.experts, K = c_.top_k, P = ep_.ranks, L = E / P;
  MatMul(a.ln2.data(), w.p[8], a.prob.data(), N, E, D, false);  // the router's logits
  for (auto& s : a.slots) s.clear();
  for (int n = 0; n < N; ++n) {
    float* p = a.prob.data() + Z(n) * Z(E);
    const float mx = *std::max_element(p, p + E);
    float sum = 0;
    for (int e = 0; e < E; ++e) sum += (p[e] = std::exp(p[e] - mx));
    for (int e = 0; e < E; ++e) p[e] /= sum;
    for (int s = 0; s < K; ++s) {  // the s-th largest, ties to the lower index
      int best = -1;
      for (int e = 0; e < E; ++e) {
        bool taken = false;
        for (int r = 0; r < s; ++r) taken = taken || a.route[Z(n) * Z(K) + Z(r)] == e;
        if (!taken && (best < 0 || p[e] > p[best])) best = e;
      }
      a.route[Z(n) * Z(K) + Z(s)] = best;
      a.slots[Z(best)].push_back(n * K + s);
    }
  }
  std::vector<std::vector<float>> send(Z(P));
  for (int e = 0; e < E; ++e) {
    std::vector<float>& out = send[Z(e / L)];
    const std::vector<int>& sl = a.slots[Z(e)];
    if (e % L == 0) out.resize(Z(L));  // the counts (exact in a float below 2^24 token-slots)
    out[Z(e % L)] = static_cast<float>(sl.size());
    for (int slot : sl) out.insert(out.end(), a.ln2.data() + Z(slot / K) * Z(D), a.ln2.data() + Z(slot / K + 1) * Z(D));
  }
  std::vector<std::vector<float>> recv = Exchange(std::move(send)), reply(Z(P));
  // This rank's experts over the rows of every rank, rank by rank.
  std::vector<size_t> at(Z(P));
  for (int q = 0; q < P; ++q) {
    for (int j = 0; j < L; ++j) a.recv[Z(q) * Z(L) + Z(j)] = static_cast<int>(recv[Z(q)].at(Z(j)));
    at[Z(q)] = Z(L);
  }
  std::vector<float> out;
  for (int j = 0; j < L; ++j) {
    const float* const* we = w.p.data() + 9 + 4 * (ep_.rank * L + j);
    std::vector<float>& in = a.ein[Z(j)];
    in.clear();
    for (int q = 0; q < P; ++q) {
      Take(recv[Z(q)], at[Z(q)], Z(a.recv[Z(q) * Z(L) + Z(j)]) * Z(D), in);
    }
    const int rows = static_cast<int>(in.size() / Z(D));
    a.efc[Z(j)].resize(in.size() * 4);
    a.egelu[Z(j)].resize(in.size() * 4);
    out.resize(in.size());
    if (rows > 0) {
      Linear(in.data(), we[0], we[1], a.efc[Z(j)].data(), rows, D, 4 * D);
      for (size_t i = 0; i < a.efc[Z(j)].size(); ++i) a.egelu[Z(j)][i] = Gelu(a.efc[Z(j)][i]);
      Linear(a.egelu[Z(j)].data(), we[2], we[3], out.data(), rows, 4 * D, D);
    }
    size_t from = 0;
    for (int q = 0; q < P; ++q) Take(out, from, Z(a.recv[Z(q) * Z(L) + Z(j)]) * Z(D), reply[Z(q)]);
  }
  const std::vector<std::vector<float>> back = Exchange(std::move(reply));
  std::fill(x_.begin(), x_.end(), 0.0f);
  double balance = 0;
  std::vector<size_t> from(Z(P), 0);
  for (int e = 0; e < E; ++e) {
    const std::vector<int>& sl = a.slots[Z(e)];
    const int ne = static_cast<int>(sl.size());
    a.eout[Z(e)].clear();
    Take(back[Z(e / L)], from[Z(e / L)], Z(ne) * Z(D), a.eout[Z(e)]);
    double mean_p = 0;
    for (int n = 0; n < N; ++n) mean_p += a.prob[Z(n) * Z(E) + Z(e)];
    balance += static_cast<double>(ne) / (N * K) * (mean_p / N);
    for (int i = 0; i < ne; ++i) {
      const int n = sl[Z(i)] / K;
      const float gate = a.prob[Z(n) * Z(E) + Z(e)];
      const float* o = a.eout[Z(e)].data() + Z(i) * Z(D);
      float* x = x_.data() + Z(n) * Z(D);
      for (int d = 0; d < D; ++d) x[d] += gate * o[d];
    }
  }
  a.aux = static_cast<double>(c_.aux_loss) * E * balance;
}

// The forward's exchanges backwards: each token-slot's output gradient to its expert's rank, the
// gradient of its input back.
void Model::ExpertsBackward(Acts& a, const BlockParams& w, const BlockGrads& g, float* d_ln2) {
  const int N = N_, D = c_.dim, E = c_.experts, K = c_.top_k, P = ep_.ranks, L = E / P;
  std::vector<float> d_prob(Z(N) * Z(E), 0.0f);
  std::fill(d_ln2, d_ln2 + Z(N) * Z(D), 0.0f);
  std::vector<std::vector<float>> send(Z(P));
  for (int e = 0; e < E; ++e) {
    const std::vector<int>& sl = a.slots[Z(e)];
    const int ne = static_cast<int>(sl.size());
    // The load-balancing term: d/dp_{n,e} of aux_loss E sum_e f_e P_e, f_e held.
    const float d_balance = c_.aux_loss * static_cast<float>(E) * (static_cast<float>(ne) / static_cast<float>(N * K)) / static_cast<float>(N);
    for (int n = 0; n < N; ++n) d_prob[Z(n) * Z(E) + Z(e)] += d_balance;
    std::vector<float>& d_out = send[Z(e / L)];
    for (int i = 0; i < ne; ++i) {
      const int n = sl[Z(i)] / K;
      const float gate = a.prob[Z(n) * Z(E) + Z(e)];
      const float* dy = dx_.data() + Z(n) * Z(D);
      const float* o = a.eout[Z(e)].data() + Z(i) * Z(D);
      float dot = 0;
      for (int d = 0; d < D; ++d) {
        d_out.push_back(gate * dy[d]);
        dot += dy[d] * o[d];
      }
      d_prob[Z(n) * Z(E) + Z(e)] += dot;
    }
  }
  const std::vector<std::vector<float>> recv = Exchange(std::move(send));
  std::vector<std::vector<float>> reply(Z(P));
  std::vector<size_t> at(Z(P), 0);
  std::vector<float> d_out, d_gelu, d_in;
  for (int j = 0; j < L; ++j) {
    const int e = ep_.rank * L + j;
    const float* const* we = w.p.data() + 9 + 4 * e;
    float* const* ge = g.g.data() + 9 + 4 * e;
    d_out.clear();
    for (int q = 0; q < P; ++q) {
      Take(recv[Z(q)], at[Z(q)], Z(a.recv[Z(q) * Z(L) + Z(j)]) * Z(D), d_out);
    }
    const int rows = static_cast<int>(d_out.size() / Z(D));
    d_in.assign(d_out.size(), 0.0f);
    if (rows > 0) {
      d_gelu.resize(Z(rows) * 4 * Z(D));
      LinearBackward(a.egelu[Z(j)].data(), we[2], d_out.data(), d_gelu.data(), ge[2], ge[3], rows, 4 * D, D);
      for (size_t i = 0; i < d_gelu.size(); ++i) d_gelu[i] *= GeluGrad(a.efc[Z(j)][i]);
      LinearBackward(a.ein[Z(j)].data(), we[0], d_gelu.data(), d_in.data(), ge[0], ge[1], rows, D, 4 * D);
    }
    size_t from = 0;
    for (int q = 0; q < P; ++q) Take(d_in, from, Z(a.recv[Z(q) * Z(L) + Z(j)]) * Z(D), reply[Z(q)]);
  }
  const std::vector<std::vector<float>> back = Exchange(std::move(reply));
  std::vector<size_t> from(Z(P), 0);
  for (int e = 0; e < E; ++e) {
    const std::vector<float>& b = back[Z(e / L)];
    for (int slot : a.slots[Z(e)]) {
      float* dst = d_ln2 + Z(slot / K) * Z(D);
      for (int d = 0; d < D; ++d) dst[d] += b[from[Z(e / L)] + Z(d)];
      from[Z(e / L)] += Z(D);
    }
  }
  // Through the softmax to the logits (d_prob becomes d_logit), then the router.
  for (int n = 0; n < N; ++n) {
    const float* p = a.prob.data() + Z(n) * Z(E);
    float* dp = d_prob.data() + Z(n) * Z(E);
    float dot = 0;
    for (int e = 0; e < E; ++e) dot += p[e] * dp[e];
    for (int e = 0; e < E; ++e) dp[e] = p[e] * (dp[e] - dot);
  }
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, D, E, N, 1.0f, a.ln2.data(), D, d_prob.data(), E, 1.0f, g.g[8], E);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, D, E, 1.0f, d_prob.data(), E, w.p[8], E, 1.0f, d_ln2, D);
}

double Model::aux_loss() const {
  double sum = 0;
  for (const Acts& a : acts_) sum += a.aux;
  return sum;
}

double Model::Head(const float* ln_w, const float* ln_b, const float* wte) {
  const int N = N_, D = c_.dim, V = c_.vocab, T = c_.context;
  LayerNorm(x_.data(), ln_w, ln_b, lnf_.data(), meanf_.data(), rstdf_.data(), N, D);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, V, D, 1.0f, lnf_.data(), D, wte, D, 0.0f, probs_.data(), V);
  double loss = 0;
  for (int n = 0; n < N; ++n) {
    float* p = probs_.data() + Z(n) * Z(V);
    const float mx = *std::max_element(p, p + V);
    double sum = 0;
    for (int v = 0; v < V; ++v) sum += (p[v] = std::exp(p[v] - mx));
    for (int v = 0; v < V; ++v) p[v] = static_cast<float>(p[v] / sum);
    const int b = n / T, t = n % T;
    const uint8_t target = tokens_[Z(b) * Z(T + 1) + Z(t) + 1];
    loss -= std::log(std::max(p[target], 1e-30f));
  }
  return loss / N + aux_loss();
}

void Model::HeadBackward(const float* ln_w, const float* ln_b, const float* wte, float* d_ln_w, float* d_ln_b, float* d_wte) {
  (void)ln_b;
  const int N = N_, D = c_.dim, V = c_.vocab, T = c_.context;
  std::vector<float> dlogits(probs_);
  for (int n = 0; n < N; ++n) {
    const int b = n / T, t = n % T;
    dlogits[Z(n) * Z(V) + tokens_[Z(b) * Z(T + 1) + Z(t) + 1]] -= 1.0f;
  }
  for (float& g : dlogits) g /= static_cast<float>(N);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, V, D, N, 1.0f, dlogits.data(), V, lnf_.data(), D, 1.0f, d_wte, D);
  float* dlnf = scratch_a_.data();
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, D, V, 1.0f, dlogits.data(), V, wte, D, 0.0f, dlnf, D);
  std::fill(dx_.begin(), dx_.end(), 0.0f);
  LayerNormBackward(x_.data(), ln_w, meanf_.data(), rstdf_.data(), dlnf, dx_.data(), d_ln_w, d_ln_b, N, D);
}

void Model::BlockBackward(int layer, const BlockParams& w, const BlockGrads& g) {
  Acts& a = acts_[Z(layer)];
  const int N = N_, D = c_.dim, T = c_.context, H = c_.heads, hd = D / H;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  // MLP: x_out = x_mid + mlp(ln2(x_mid)), the MLP dense or the experts.
  float* d_ln2 = scratch_b_.data();
  if (c_.experts > 0) {
    ExpertsBackward(a, w, g, d_ln2);
  } else {
    MlpBackward(a, w, g, d_ln2);
  }
  std::vector<float> d_mid(dx_);  // the residual path
  LayerNormBackward(a.x_mid.data(), w.p[6], a.mean2.data(), a.rstd2.data(), d_ln2, d_mid.data(), g.g[6], g.g[7], N, D);
  // Attention: x_mid = x + c_proj(attn(c_attn(ln1(x)))).
  float* d_y = scratch_a_.data();
  LinearBackward(a.y.data(), w.p[4], d_mid.data(), d_y, g.g[4], g.g[5], N, D, D);
  float* d_qkv = scratch_c_.data();
  std::fill(d_qkv, d_qkv + Z(N) * Z(3 * D), 0.0f);
  std::vector<float> d_att(Z(T));
  for (int b = 0; b < B_; ++b) {
    for (int h = 0; h < H; ++h) {
      for (int t = 0; t < T; ++t) {
        const float* p = a.att.data() + ((Z(b) * Z(H) + Z(h)) * Z(T) + Z(t)) * Z(T);
        const float* dy = d_y + (Z(b) * Z(T) + Z(t)) * Z(D) + Z(h * hd);
        const size_t qrow = (Z(b) * Z(T) + Z(t)) * Z(3 * D) + Z(h * hd);
        float dot = 0;
        for (int u = 0; u <= t; ++u) {
          const size_t row = (Z(b) * Z(T) + Z(u)) * Z(3 * D);
          const float* v = a.qkv.data() + row + Z(2 * D + h * hd);
          float* dv = d_qkv + row + Z(2 * D + h * hd);
          float s = 0;
          for (int i = 0; i < hd; ++i) {
            s += dy[i] * v[i];
            dv[i] += p[u] * dy[i];
          }
          d_att[Z(u)] = s;
          dot += p[u] * s;
        }
        for (int u = 0; u <= t; ++u) {
          const float dpre = p[u] * (d_att[Z(u)] - dot) * scale;
          const size_t row = (Z(b) * Z(T) + Z(u)) * Z(3 * D);
          const float* k = a.qkv.data() + row + Z(D + h * hd);
          float* dk = d_qkv + row + Z(D + h * hd);
          const float* q = a.qkv.data() + qrow;
          float* dq = d_qkv + qrow;
          for (int i = 0; i < hd; ++i) {
            dq[i] += dpre * k[i];
            dk[i] += dpre * q[i];
          }
        }
      }
    }
  }
  float* d_ln1 = scratch_b_.data();
  LinearBackward(a.ln1.data(), w.p[2], d_qkv, d_ln1, g.g[2], g.g[3], N, D, 3 * D);
  dx_ = d_mid;  // the residual path
  LayerNormBackward(a.x.data(), w.p[0], a.mean1.data(), a.rstd1.data(), d_ln1, dx_.data(), g.g[0], g.g[1], N, D);
}

void Model::EmbedBackward(float* d_wte, float* d_wpe) {
  const int T = c_.context, D = c_.dim;
  for (int b = 0; b < B_; ++b) {
    for (int t = 0; t < T; ++t) {
      const uint8_t tok = tokens_[Z(b) * Z(T + 1) + Z(t)];
      const float* dx = dx_.data() + (Z(b) * Z(T) + Z(t)) * Z(D);
      for (int d = 0; d < D; ++d) {
        d_wte[Z(tok) * Z(D) + Z(d)] += dx[d];
        d_wpe[Z(t) * Z(D) + Z(d)] += dx[d];
      }
    }
  }
}

namespace {
template <class T>
std::vector<T> BlockSlice(const Config& c, const std::vector<T>& all, int layer) {
  const auto first = all.begin() + 2 + static_cast<std::ptrdiff_t>(layer) * c.block_tensors();
  return std::vector<T>(first, first + c.block_tensors());
}
}  // namespace

double Forward(Model& m, const Config& c, const std::vector<const float*>& w, const uint8_t* tokens) {
  m.Embed(w[0], w[1], tokens);
  for (int l = 0; l < c.layers; ++l) m.Block(l, {BlockSlice(c, w, l)});
  const size_t lf = w.size() - 2;
  return m.Head(w[lf], w[lf + 1], w[0]);
}

void Backward(Model& m, const Config& c, const std::vector<const float*>& w, const std::vector<float*>& grads) {
  const size_t lf = w.size() - 2;
  m.HeadBackward(w[lf], w[lf + 1], w[0], grads[lf], grads[lf + 1], grads[0]);
  for (int l = c.layers - 1; l >= 0; --l) m.BlockBackward(l, {BlockSlice(c, w, l)}, {BlockSlice(c, grads, l)});
  m.EmbedBackward(grads[0], grads[1]);
}

}  // namespace gpt
