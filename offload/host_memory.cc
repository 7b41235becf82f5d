#include "zrt/offload/host_memory.h"

#include <cstdlib>
#include <cstring>

#if defined(ZRT_HAVE_CUDA)
#include <cuda_runtime_api.h>
#endif

#include "zrt/core/logging.h"

namespace zrt {
namespace {

constexpr size_t kPage = 4096;

// Pin only when a GPU can use it: without one (or without a driver) pinning is pointless or fails.
bool CanPin() {
#if defined(ZRT_HAVE_CUDA)
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return n > 0;
#else
  return false;
#endif
}

}  // namespace

std::unique_ptr<HostMemory> HostMemory::Create(int64_t budget_bytes, std::string setting) {
  static const bool pin = CanPin();
  return std::unique_ptr<HostMemory>(new HostMemory(budget_bytes < 0 ? 0 : budget_bytes, std::move(setting), pin));
}

Status HostMemory::Copy(void* dst, const void* src, size_t bytes) {
  if (bytes != 0) std::memcpy(dst, src, bytes);
  return Status();
}

Status HostMemory::Fill(void* dst, uint8_t byte, size_t bytes) {
  if (bytes != 0) std::memset(dst, byte, bytes);
  return Status();
}

Result<void*> HostMemory::RawAllocate(size_t bytes, size_t alignment) {
  const auto want = static_cast<int64_t>(bytes);
  int64_t cur = used_.load(std::memory_order_relaxed);
  do {
    if (budget_ != 0 && cur + want > budget_) {
      return OutOfMemoryError("host memory budget ", setting_, " = ", FormatBytes(budget_), " exceeded: ",
                                    FormatBytes(cur), " in use, ", FormatBytes(want), " more asked");
    }
  } while (!used_.compare_exchange_weak(cur, cur + want, std::memory_order_relaxed));
  void* p = nullptr;
  const int rc = posix_memalign(&p, alignment < kPage ? kPage : alignment, bytes);
  if (rc != 0) {
    used_.fetch_sub(want, std::memory_order_relaxed);
    return ErrnoStatus(rc, "posix_memalign");
  }
#if defined(ZRT_HAVE_CUDA)
  if (pinned_ && cudaHostRegister(p, bytes, cudaHostRegisterDefault) != cudaSuccess) {
    (void)cudaGetLastError();  // pinning is an optimisation: unpinned memory still works
    ZRT_LOG(kWarn) << "host memory: could not pin " << FormatBytes(want) << "; transfers from it will be slower";
  }
#endif
  return p;
}

void HostMemory::RawFree(void* p, size_t bytes) {
#if defined(ZRT_HAVE_CUDA)
  if (pinned_) (void)cudaHostUnregister(p), (void)cudaGetLastError();
#endif
  std::free(p);
  used_.fetch_sub(static_cast<int64_t>(bytes), std::memory_order_relaxed);
}

}  // namespace zrt
