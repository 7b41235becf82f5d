// Writes a valid manifest and index into a directory: the fuzzers' seed corpus.
#include <fstream>

#include "zrt/checkpoint/format.h"

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  using namespace zrt::ckpt;
  Manifest m;
  m.nonce = "0123456789abcdef";
  m.step = 7;
  m.world_size = m.shards = 3;
  m.stage = 2;
  m.trainer_state = {{"seed", 1}};
  m.groups.push_back({"g", 1e-3, 0, 4, {{"w", {3, 5}, zrt::DType::kBF16, 0, 15}, {"b", {5}, zrt::DType::kF32, 16, 5}},
                      {"master", "exp_avg"}});
  RankIndex r;
  r.nonce = m.nonce;
  r.shards = 3;
  r.rank = 1;
  r.data_file = DataFileName(1);
  r.data_bytes = 8192;
  r.chunks.push_back({0, 1, 0, 8, 4096, 32, Codec::kZstd, 42});
  std::ofstream(std::string(argv[1]) + "/manifest.json") << EncodeManifest(m);
  std::ofstream(std::string(argv[1]) + "/index.json") << EncodeIndex(r);
  return 0;
}
