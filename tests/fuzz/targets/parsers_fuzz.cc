// libFuzzer target for the checkpoint metadata parsers (manifest and rank index). Any input must give
// a Status, never a crash, hang or sanitizer report. Inputs that are JSON objects are also re-sealed
// (given a valid checksum) so the fuzzer reaches the field-by-field parsing behind the checksum.
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string_view>

#include "zrt/checkpoint/format.h"

namespace {
void Exercise(std::string_view text) {
  using namespace zrt::ckpt;
  if (auto m = DecodeManifest(text, "fuzz"); m.ok()) {
    for (int g = 0; g < static_cast<int>(m->groups.size()) && g < 64; ++g) (void)SavedLayout(*m, g).ok();
    (void)DecodeManifest(EncodeManifest(*m), "fuzz-roundtrip").ok();
  }
  if (auto r = DecodeIndex(text, "fuzz"); r.ok()) (void)DecodeIndex(EncodeIndex(*r), "fuzz-roundtrip").ok();
}
}  // namespace

// ZRT_FUZZ_WRITE_SEEDS=DIR: write a valid manifest and index there (the seed corpus) and exit.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* dir = std::getenv("ZRT_FUZZ_WRITE_SEEDS");
  if (dir == nullptr) return 0;
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
  std::ofstream(std::string(dir) + "/manifest.json") << EncodeManifest(m);
  std::ofstream(std::string(dir) + "/index.json") << EncodeIndex(r);
  std::exit(0);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  Exercise(text);
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_object()) Exercise(zrt::ckpt::internal::Seal(std::move(j)));
  return 0;
}
