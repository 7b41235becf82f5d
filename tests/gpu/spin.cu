// Kernels that hold a stream up, for ordering and timeout tests.
#include "tests/gpu/spin.h"

namespace zrt::testing {
namespace {

__global__ void SpinCycles(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

__global__ void SpinUntil(const volatile int* flag) {
  while (*flag == 0) {
  }
}

}  // namespace

cudaError_t LaunchSpinCycles(long long cycles, cudaStream_t s) {
  SpinCycles<<<1, 1, 0, s>>>(cycles);
  return cudaGetLastError();
}

cudaError_t LaunchSpinUntil(const volatile int* flag, cudaStream_t s) {
  SpinUntil<<<1, 1, 0, s>>>(flag);
  return cudaGetLastError();
}

}  // namespace zrt::testing
