// Helpers for GPU tests: skip without a usable GPU, owned device buffers, copies.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <vector>

#include "zrt/core/cuda_status.h"

namespace zrt::testing {

// Any CUDA error (no driver, no device) means "no GPU": skip, never pass silently.
#define ZRT_REQUIRE_GPU()                                                                    \
  do {                                                                                       \
    if (!::zrt::CudaDeviceAvailable()) GTEST_SKIP() << "no usable CUDA device on this machine"; \
  } while (0)

template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t n) : n_(n) {
    if (n > 0 && cudaMalloc(&p_, n * sizeof(T)) != cudaSuccess) p_ = nullptr;
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) { Upload(host); }
  ~DeviceArray() {
    if (p_) cudaFree(p_);
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  T* get() { return p_; }
  void Upload(const std::vector<T>& h) { ASSERT_EQ(cudaMemcpy(p_, h.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess); }
  std::vector<T> Download() const {
    std::vector<T> h(n_);
    EXPECT_EQ(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

}  // namespace zrt::testing
