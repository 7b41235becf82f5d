#include "examples/charlm/model.h"

#include <algorithm>
#include <cmath>
#include <random>

namespace charlm {

int CharIndex(char c) {
  if (c == '.') return 0;
  if (c >= 'a' && c <= 'z') return c - 'a' + 1;
  return -1;
}
char IndexChar(int i) { return i == 0 ? '.' : static_cast<char>('a' + i - 1); }

std::vector<Example> BuildExamples(const std::vector<std::string>& words) {
  std::vector<Example> out;
  for (const std::string& w : words) {
    bool ok = !w.empty();
    for (char c : w) ok = ok && c >= 'a' && c <= 'z';
    if (!ok) continue;
    Example e{};
    std::fill(std::begin(e.context), std::end(e.context), 0);
    for (size_t i = 0; i <= w.size(); ++i) {
      e.next = static_cast<uint8_t>(i < w.size() ? CharIndex(w[i]) : 0);
      out.push_back(e);
      std::rotate(std::begin(e.context), std::begin(e.context) + 1, std::end(e.context));
      e.context[kContext - 1] = e.next;
    }
  }
  return out;
}

namespace {

// logits for one context; fills x (k*dim) and h (hidden).
void Forward(const Dims& d, const Tensors& p, const uint8_t* ctx, float* x, float* h, float* logits) {
  for (int k = 0; k < kContext; ++k) {
    for (int j = 0; j < d.dim; ++j) x[k * d.dim + j] = p.embed[ctx[k] * d.dim + j];
  }
  const int in = kContext * d.dim;
  for (int i = 0; i < d.hidden; ++i) {
    float a = p.b1[i];
    const float* row = p.w1 + static_cast<int64_t>(i) * in;
    for (int j = 0; j < in; ++j) a += row[j] * x[j];
    h[i] = std::tanh(a);
  }
  for (int v = 0; v < kVocab; ++v) {
    float a = p.b2[v];
    const float* row = p.w2 + static_cast<int64_t>(v) * d.hidden;
    for (int i = 0; i < d.hidden; ++i) a += row[i] * h[i];
    logits[v] = a;
  }
}

}  // namespace

double ForwardBackward(const Dims& d, const Tensors& p, const Example* batch, int n, Tensors* g) {
  const int in = kContext * d.dim;
  std::vector<float> x(static_cast<size_t>(in)), h(static_cast<size_t>(d.hidden)), dh(static_cast<size_t>(d.hidden));
  float logits[kVocab], prob[kVocab];
  double loss = 0;
  const float scale = 1.0f / static_cast<float>(n);
  for (int b = 0; b < n; ++b) {
    const Example& e = batch[b];
    Forward(d, p, e.context, x.data(), h.data(), logits);
    const float mx = *std::max_element(logits, logits + kVocab);
    float sum = 0;
    for (int v = 0; v < kVocab; ++v) sum += prob[v] = std::exp(logits[v] - mx);
    for (int v = 0; v < kVocab; ++v) prob[v] /= sum;
    loss -= std::log(std::max(prob[e.next], 1e-30f));
    // dlogits = (softmax - onehot) / n
    std::fill(dh.begin(), dh.end(), 0.0f);
    for (int v = 0; v < kVocab; ++v) {
      const float dl = (prob[v] - (v == e.next ? 1.0f : 0.0f)) * scale;
      g->b2[v] += dl;
      float* grow = g->w2 + static_cast<int64_t>(v) * d.hidden;
      const float* prow = p.w2 + static_cast<int64_t>(v) * d.hidden;
      for (int i = 0; i < d.hidden; ++i) {
        grow[i] += dl * h[static_cast<size_t>(i)];
        dh[static_cast<size_t>(i)] += dl * prow[i];
      }
    }
    for (int i = 0; i < d.hidden; ++i) {
      const float da = dh[static_cast<size_t>(i)] * (1.0f - h[static_cast<size_t>(i)] * h[static_cast<size_t>(i)]);
      g->b1[i] += da;
      float* grow = g->w1 + static_cast<int64_t>(i) * in;
      const float* prow = p.w1 + static_cast<int64_t>(i) * in;
      for (int j = 0; j < in; ++j) {
        grow[j] += da * x[static_cast<size_t>(j)];
        // d(embedding) through x
        const int k = j / d.dim, c = e.context[k];
        g->embed[c * d.dim + (j % d.dim)] += da * prow[j];
      }
    }
  }
  return loss / n;
}

std::string Sample(const Dims& d, const Tensors& p, uint64_t seed, int max_len) {
  std::mt19937_64 rng(seed);
  std::vector<float> x(static_cast<size_t>(kContext * d.dim)), h(static_cast<size_t>(d.hidden));
  uint8_t ctx[kContext] = {};
  std::string out;
  for (int step = 0; step < max_len; ++step) {
    float logits[kVocab];
    Forward(d, p, ctx, x.data(), h.data(), logits);
    const float mx = *std::max_element(logits, logits + kVocab);
    double w[kVocab];
    for (int v = 0; v < kVocab; ++v) w[v] = std::exp(static_cast<double>(logits[v] - mx));
    std::discrete_distribution<int> pick(w, w + kVocab);
    const int c = pick(rng);
    if (c == 0) break;
    out += IndexChar(c);
    std::rotate(ctx, ctx + 1, ctx + kContext);
    ctx[kContext - 1] = static_cast<uint8_t>(c);
  }
  return out;
}

}  // namespace charlm
