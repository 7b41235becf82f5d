// zrt on NVIDIA GPUs (CUDA builds only; includes the CUDA runtime's and NCCL's headers): CudaDevice,
// device memory through a caching allocator with the compute stream zrt orders its work on, and
// NcclCommunicator, collectives on device buffers bootstrapped over an MPI communicator, with a hang
// watchdog. docs/getting-started.md ("GPUs") shows the setup.
#pragma once

#include "zrt/zrt.h"

#if !defined(ZRT_HAVE_CUDA)
#error "<zrt/gpu.h>: this zrt was built without CUDA"
#endif

#include "zrt/core/cuda_device.h"
#if defined(ZRT_HAVE_NCCL)
#include "zrt/core/nccl_communicator.h"
#endif
