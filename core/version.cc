#include "zrt/core/logging.h"

namespace zrt {

std::string_view Version() { return ZRT_VERSION_STRING; }

std::string BuildFeatures() {
  std::string s;
#if defined(ZRT_HAVE_CUDA)
  s += "cuda=on";
#else
  s += "cuda=off";
#endif
#if defined(ZRT_HAVE_NCCL)
  s += " nccl=on";
#else
  s += " nccl=off";
#endif
  return s;
}

}  // namespace zrt
