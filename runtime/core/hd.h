// ZRT_HD marks functions that compile for both host and device (per-element math shared by the CPU
// and CUDA paths, ../shared/STYLE.md item 3). Plain `inline` in host-only translation units.
#pragma once

#if defined(__CUDACC__)
#define ZRT_HD __host__ __device__ __forceinline__
#else
#define ZRT_HD inline
#endif
