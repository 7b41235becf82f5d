#include "examples/gpt/model.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

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
  const int64_t D = dim;
  return int64_t{vocab} * D + int64_t{context} * D + layers * (12 * D * D + 13 * D) + 2 * D;
}

double Config::flops_per_token() const {
  const double n = static_cast<double>(num_params() - int64_t{context} * dim);  // the position table is a lookup
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
    t.push_back({p + "mlp.c_fc.weight", {D, 4 * D}, g, true});
    t.push_back({p + "mlp.c_fc.bias", {4 * D}, g, false});
    t.push_back({p + "mlp.c_proj.weight", {4 * D, D}, g, true});
    t.push_back({p + "mlp.c_proj.bias", {D}, g, false});
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
    for (const auto* v : {&a.x, &a.ln1, &a.mean1, &a.rstd1, &a.qkv, &a.att, &a.y, &a.x_mid, &a.ln2, &a.mean2, &a.rstd2, &a.fc, &a.gelu}) {
      floats += static_cast<int64_t>(v->size());
    }
  }
  floats += static_cast<int64_t>(x_.size() + lnf_.size() + meanf_.size() + rstdf_.size() + probs_.size() + dx_.size() + scratch_a_.size() +
                                 scratch_b_.size() + scratch_c_.size());
  return floats * 4;
}

Model::Model(const Config& c, int batch) : c_(c), B_(batch), N_(batch * c.context), acts_(Z(c.layers)) {
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
    a.fc.resize(N * 4 * D);
    a.gelu.resize(N * 4 * D);
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
  Linear(a.ln2.data(), w.p[8], w.p[9], a.fc.data(), N, D, 4 * D);
  for (size_t i = 0; i < a.fc.size(); ++i) a.gelu[i] = Gelu(a.fc[i]);
  Linear(a.gelu.data(), w.p[10], w.p[11], x_.data(), N, 4 * D, D);
  for (size_t i = 0; i < x_.size(); ++i) x_[i] += a.x_mid[i];
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
  return loss / N;
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
  // MLP: x_out = x_mid + c_proj(gelu(c_fc(ln2(x_mid)))).
  float* d_gelu = scratch_a_.data();
  LinearBackward(a.gelu.data(), w.p[10], dx_.data(), d_gelu, g.g[10], g.g[11], N, 4 * D, D);
  for (size_t i = 0; i < a.fc.size(); ++i) d_gelu[i] *= GeluGrad(a.fc[i]);
  float* d_ln2 = scratch_b_.data();
  LinearBackward(a.ln2.data(), w.p[8], d_gelu, d_ln2, g.g[8], g.g[9], N, D, 4 * D);
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

}  // namespace gpt
