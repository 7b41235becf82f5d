// libFuzzer target for the checkpoint metadata parsers (manifest and rank index). Any input must give
// a Status, never a crash, hang or sanitizer report. Inputs that are JSON objects are also re-sealed
// (given a valid checksum) so the fuzzer reaches the field-by-field parsing behind the checksum.
#include <cstdint>
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

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  Exercise(text);
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_object()) Exercise(zrt::ckpt::internal::Seal(std::move(j)));
  return 0;
}
