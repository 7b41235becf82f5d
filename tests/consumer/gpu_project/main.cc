// Builds against <zrt/gpu.h> through zrt::gpu, and runs without a GPU: creating a device then fails
// with a Status (no driver here), never a crash.
#include <cstdio>

#include <zrt/gpu.h>

int main() {
  auto dev = zrt::CudaDevice::Create(0);
  std::printf("zrt %s, CudaDevice::Create(0): %s\n", std::string(zrt::Version()).c_str(), dev.ok() ? "ok" : dev.status().ToString().c_str());
  return 0;
}
