// Access to ../shared/reference (data produced by PyTorch) and random inputs for tests.
#pragma once

#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "zrt/core/status.h"

namespace zrt::testing {

// The reference root (ZRT_REFERENCE_DIR at configure time); empty when it does not exist.
std::filesystem::path ReferenceDir();

// Skips the current test (GTEST_SKIP with the reason) when the reference data is missing.
#define ZRT_REQUIRE_REFERENCE()                                                              \
  do {                                                                                       \
    if (::zrt::testing::ReferenceDir().empty())                                              \
      GTEST_SKIP() << "reference data not found at " ZRT_REFERENCE_DIR " (needs ../shared)"; \
  } while (0)

// Loads <case_dir>/case.json.
Result<nlohmann::json> LoadCase(const std::filesystem::path& case_dir);
// Loads <case_dir>/<name>.bin as raw little-endian elements of T; checks the size is a multiple.
template <typename T>
Result<std::vector<T>> LoadBin(const std::filesystem::path& case_dir, const std::string& name);

// Seeded from the test name and the clock, printed on failure via SCOPED_TRACE by callers: fresh
// inputs each run (../shared/STYLE.md item 10), reproducible with ZRT_TEST_SEED.
uint64_t TestSeed();

// Random floats in [-scale, scale], never all zeros.
std::vector<float> RandomFloats(size_t n, std::mt19937_64& rng, float scale = 1.0f);

}  // namespace zrt::testing
