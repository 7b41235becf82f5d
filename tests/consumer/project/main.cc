// Uses the installed headers and library: a layout and a dtype conversion, printed.
#include <cstdio>
#include <vector>

#include "zrt/core/dtype.h"
#include "zrt/core/shard_layout.h"
#include "zrt/core/version.h"

int main() {
  std::vector<int64_t> numels = {10, 3};
  auto layout = zrt::ShardLayout::Create(numels, 3, 2);
  if (!layout.ok()) {
    std::fprintf(stderr, "%s\n", layout.status().ToString().c_str());
    return 1;
  }
  std::printf("zrt %s shard_size=%lld bf16(1.0)=0x%04x\n", std::string(zrt::Version()).c_str(),
              static_cast<long long>(layout->shard_size()), zrt::FloatToBf16(1.0f));
  return layout->shard_size() == 6 && zrt::FloatToBf16(1.0f) == 0x3f80 ? 0 : 1;
}
