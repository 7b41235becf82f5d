// The charlm model: next-character prediction from the previous kContext characters.
//   x = concat(E[c_1], ..., E[c_k])          E: vocab x dim embeddings
//   h = tanh(W1 x + b1)                      W1: hidden x (k*dim)
//   logits = W2 h + b2                       W2: vocab x hidden
//   loss = cross-entropy(softmax(logits), next char)
// Forward and backward are written out by hand, in float, single-threaded and deterministic.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace charlm {

inline constexpr int kVocab = 27;  // '.' (word boundary) + 'a'..'z'
inline constexpr int kContext = 6;

struct Dims {
  int dim = 16;
  int hidden = 128;
  int64_t embed() const { return int64_t{kVocab} * dim; }
  int64_t w1() const { return int64_t{hidden} * kContext * dim; }
  int64_t w2() const { return int64_t{kVocab} * hidden; }
};

// Views of the parameters (read) or gradients (accumulated into) of one model.
struct Tensors {
  float* embed;
  float* w1;
  float* b1;
  float* w2;
  float* b2;
};

struct Example {
  uint8_t context[kContext];
  uint8_t next;
};

// Examples from a word list: every position of "....word." (lowercase a-z words only).
std::vector<Example> BuildExamples(const std::vector<std::string>& words);
int CharIndex(char c);  // -1 when not in the vocabulary
char IndexChar(int i);

// Mean cross-entropy over the batch; adds d(loss)/d(param) into `grad` (which the caller zeroed).
double ForwardBackward(const Dims& d, const Tensors& p, const Example* batch, int n, Tensors* grad);

// Samples a word (up to max_len letters) with the given seed.
std::string Sample(const Dims& d, const Tensors& p, uint64_t seed, int max_len = 20);

}  // namespace charlm
