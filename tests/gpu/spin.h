// Kernels that hold a stream up, for ordering and timeout tests (tests/gpu/spin.cu).
#pragma once

#include <cuda_runtime_api.h>

namespace zrt::testing {

// Busy-waits about `cycles` GPU clock cycles (1e8 is tens of milliseconds).
cudaError_t LaunchSpinCycles(long long cycles, cudaStream_t s);
// Busy-waits until *flag (mapped pinned host memory) becomes nonzero.
cudaError_t LaunchSpinUntil(const volatile int* flag, cudaStream_t s);

}  // namespace zrt::testing
