#include "zrt/core/cuda_status.h"

#if defined(ZRT_HAVE_NCCL)
#include <nccl.h>
#endif

namespace zrt {

Status CudaStatus(cudaError_t err, std::string_view what) {
  if (err == cudaSuccess) return Status();
  std::string msg = internal::StrCat(what, ": ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
  switch (err) {
    case cudaErrorMemoryAllocation: return Status(StatusCode::kOutOfMemory, std::move(msg));
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable: return Status(StatusCode::kUnavailable, std::move(msg));
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevice:
    case cudaErrorInvalidConfiguration: return Status(StatusCode::kInvalidArgument, std::move(msg));
    default: return Status(StatusCode::kInternal, std::move(msg));
  }
}

bool CudaDeviceAvailable() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#if defined(ZRT_HAVE_NCCL)
Status NcclStatus(int nccl_result, std::string_view what) {
  const auto r = static_cast<ncclResult_t>(nccl_result);
  if (r == ncclSuccess) return Status();
  std::string msg = internal::StrCat(what, ": NCCL error ", nccl_result, " (", ncclGetErrorString(r), ")");
  switch (r) {
    case ncclInvalidArgument:
    case ncclInvalidUsage: return Status(StatusCode::kInvalidArgument, std::move(msg));
    case ncclSystemError:
    case ncclRemoteError: return Status(StatusCode::kUnavailable, std::move(msg));
    default: return Status(StatusCode::kInternal, std::move(msg));
  }
}
#endif

}  // namespace zrt
