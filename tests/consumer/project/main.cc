// Uses the installed umbrella header alone: it must not pull in CUDA or NCCL headers in any build,
// and a consumer's own "runtime/engine.h" (on this project's include path) must not collide with it.
#include <cstdio>
#include <vector>

#include <zrt/zrt.h>

#include "runtime/engine.h"  // this project's own header of that name

#if defined(__CUDA_RUNTIME_API_H__) || defined(__cuda_cuda_h__) || defined(NCCL_H_)
#error "<zrt/zrt.h> pulled in CUDA or NCCL headers"
#endif

int main() {
  std::vector<int64_t> numels = {10, 3};
  auto layout = zrt::ShardLayout::Create(numels, 3, 2);
  if (!layout.ok()) {
    std::fprintf(stderr, "%s\n", layout.status().ToString().c_str());
    return 1;
  }
  zrt::EngineConfig cfg;
  cfg.stage = 3;
  // A trainer written against 0.1's names of the state precision still builds (CHANGELOG).
  cfg.state = {.exp_avg = zrt::kernels::MomentFormat::kQ8, .exp_avg_sq = zrt::kernels::MomentFormat::kBf16};
  std::printf("zrt %s shard_size=%lld bf16(1.0)=0x%04x %s\n", std::string(zrt::Version()).c_str(),
              static_cast<long long>(layout->shard_size()), zrt::FloatToBf16(1.0f), consumer::kMine);
  return layout->shard_size() == 6 && zrt::FloatToBf16(1.0f) == 0x3f80 && cfg.stage == 3 ? 0 : 1;
}
