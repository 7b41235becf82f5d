// CUDA and NCCL error codes -> Status. Built only with ZRT_WITH_CUDA (NCCL part with ZRT_WITH_NCCL).
#pragma once

#include <cuda_runtime_api.h>

#include <string_view>

#include "zrt/core/status.h"

namespace zrt {

// cudaSuccess -> OK; memory errors -> OutOfMemory; no device / no driver -> Unavailable;
// invalid values -> InvalidArgument; everything else -> Internal. The message has the CUDA name and text.
Status CudaStatus(cudaError_t err, std::string_view what);

// True when a CUDA device can be used. Any error (no driver, no device) means "no GPU": callers skip.
bool CudaDeviceAvailable();

#if defined(ZRT_HAVE_NCCL)
// ncclResult_t as int, so this header needs no nccl.h: ncclSuccess -> OK; invalid argument/usage ->
// InvalidArgument; system/remote errors -> Unavailable; others -> Internal.
Status NcclStatus(int nccl_result, std::string_view what);
#endif

}  // namespace zrt

#define ZRT_STRINGIFY_INNER(x) #x
#define ZRT_STRINGIFY(x) ZRT_STRINGIFY_INNER(x)
// RETURN_IF_ERROR for a CUDA runtime call, naming the call and its file:line.
#define CUDA_RETURN_IF_ERROR(expr) \
  RETURN_IF_ERROR(::zrt::CudaStatus((expr), #expr " at " __FILE__ ":" ZRT_STRINGIFY(__LINE__)))
