// The library's version and build configuration, for `zrt --version` and checkpoint manifests.
#pragma once

#include <string>
#include <string_view>

namespace zrt {

// "0.1.0"
std::string_view Version();
// "cuda=on nccl=off", what this build of the library can do.
std::string BuildFeatures();

}  // namespace zrt
