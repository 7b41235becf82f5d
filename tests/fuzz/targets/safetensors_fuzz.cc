// libFuzzer target for the safetensors reader and importer: the input is the file. Any input must
// give a Status — no crash, overflow, sanitizer report or allocation beyond the file's size — and
// whatever import accepts must be a complete checkpoint that verifies.
// ZRT_FUZZ_WRITE_SEEDS=DIR: write valid files there (the seed corpus) and exit.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "zrt/checkpoint/interchange/safetensors.h"
#include "tests/fuzz/targets/fuzz_checks.h"
#include "zrt/core/logging.h"

namespace {

namespace fs = std::filesystem;

// A valid file: the header given, then `bytes` of data.
std::string File(const std::string& header, size_t bytes) {
  std::string h = header;
  h.append((8 - (8 + h.size()) % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((h.size() >> (8 * i)) & 0xff);
  out += h;
  for (size_t i = 0; i < bytes; ++i) out.push_back(static_cast<char>(i * 37 + 1));
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  zrt::SetLogLevel(zrt::LogLevel::kError);
  const char* dir = std::getenv("ZRT_FUZZ_WRITE_SEEDS");
  if (dir == nullptr) return 0;
  std::ofstream(std::string(dir) + "/plain") << File(
      R"({"w":{"dtype":"BF16","shape":[3,5],"data_offsets":[0,30]},"b":{"dtype":"F32","shape":[5],"data_offsets":[30,50]},)"
      R"("__metadata__":{"format":"pt"}})", 50);
  std::ofstream(std::string(dir) + "/zrt") << File(
      R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"optimizer/exp_avg/w":{"dtype":"F32","shape":[2,2],"data_offsets":[16,32]},)"
      R"("__metadata__":{"format":"pt","zrt":"{\"version\":1,\"step\":3,\"groups\":[{\"name\":\"g\",\"lr\":0.1,\"kinds\":[\"master\",\"exp_avg\"],)"
      R"(\"tensors\":[{\"name\":\"w\",\"model_dtype\":\"bf16\"}]}]}"}})", 32);
  std::ofstream(std::string(dir) + "/f16") << File(R"({"h":{"dtype":"F16","shape":[4],"data_offsets":[0,8]},"m":{"dtype":"U8","shape":[0],"data_offsets":[8,8]}})", 8);
  std::exit(0);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const fs::path base = zrt::fuzz::ScratchDir("zrt_stfuzz_");
  std::error_code ec;
  fs::remove_all(base, ec);
  fs::create_directories(base, ec);
  const std::string path = (base / "in.safetensors").string();
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  auto r = zrt::ckpt::SafetensorsReader::Open(path);
  if (r.ok()) {
    int64_t total = 0;
    for (const auto& t : r->tensors()) total += t.bytes;
    if (total > static_cast<int64_t>(size)) std::abort();  // the tensors claim bytes the file does not hold
    for (const auto& t : r->tensors()) {
      if (!t.floating()) continue;
      std::vector<float> v(static_cast<size_t>(t.numel));
      if (!r->ReadFloat(t, 0, t.numel, v.data()).ok()) std::abort();  // a checked file reads
    }
  }
  const std::string out = (base / "out").string();
  if (zrt::ckpt::ImportSafetensors(path, out, {.world_size = 1 + static_cast<int>(size % 3), .stage = static_cast<int>(size % 4)}).ok()) zrt::fuzz::AbortUnlessEveryCheckpointVerifies(out);
  return 0;
}
