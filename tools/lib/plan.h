// The `zrt plan` command as a library function: the memory and time a model needs under each ZeRO
// stage and offload choice (the ZeRO paper's formulas), written to `out`. Unit-tested without argv.
#pragma once

#include <ostream>
#include <string>

#include "zrt/core/status.h"

namespace zrt::tools {

struct PlanInput {
  double params = 0;  // or from the transformer shape:
  int layers = 0, hidden = 0, heads = 0, vocab = 0;
  int64_t seq = 0, batch = 1;  // micro-batch per device
  int gpus = 1;
  int stage = 3;
  std::string offload = "none";  // none | cpu | nvme
  int param_bytes = 2;           // bf16/f16 = 2, f32 = 4
  double gpu_mem_gib = 80;
  double step_seconds = 0;       // to derive the bandwidth that hides communication
  double tokens = 0, tflops = 0, power_watts = 0;
};
Status Plan(const PlanInput& in, bool json, std::ostream& out);

}  // namespace zrt::tools
