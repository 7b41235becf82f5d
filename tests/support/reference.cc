#include "tests/support/reference.h"

#include <chrono>
#include <cstdlib>
#include <fstream>

namespace zrt::testing {

std::filesystem::path ReferenceDir() {
  std::filesystem::path p(ZRT_REFERENCE_DIR);
  std::error_code ec;
  return std::filesystem::is_directory(p, ec) ? p : std::filesystem::path();
}

Result<nlohmann::json> LoadCase(const std::filesystem::path& case_dir) {
  const auto path = case_dir / "case.json";
  std::ifstream in(path);
  if (!in) return NotFoundError("cannot open ", path.string());
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return DataLossError("invalid JSON in ", path.string());
  return j;
}

template <typename T>
Result<std::vector<T>> LoadBin(const std::filesystem::path& case_dir, const std::string& name) {
  const auto path = case_dir / (name + ".bin");
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return NotFoundError("cannot open ", path.string());
  const std::streamsize bytes = in.tellg();
  if (bytes % static_cast<std::streamsize>(sizeof(T)) != 0) {
    return DataLossError(path.string(), ": ", bytes, " bytes is not a multiple of ", sizeof(T));
  }
  std::vector<T> v(static_cast<size_t>(bytes) / sizeof(T));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(v.data()), bytes);
  if (!in) return IoError("reading ", path.string());
  return v;
}
template Result<std::vector<float>> LoadBin<float>(const std::filesystem::path&, const std::string&);
template Result<std::vector<uint16_t>> LoadBin<uint16_t>(const std::filesystem::path&, const std::string&);

uint64_t TestSeed() {
  if (const char* s = std::getenv("ZRT_TEST_SEED")) return std::strtoull(s, nullptr, 10);
  return static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
}

std::vector<float> RandomFloats(size_t n, std::mt19937_64& rng, float scale) {
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) {
    do {
      x = d(rng);
    } while (x == 0.0f);
  }
  return v;
}

}  // namespace zrt::testing
