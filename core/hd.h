// ZRT_HD marks free functions that compile for both host and device (per-element math shared by the
// CPU and CUDA paths, ../shared/STYLE.md item 3).
//
// Host side they have internal linkage (`static inline`): kernels/ compiles the same header in
// translation units built with different -m flags (scalar, AVX2, AVX-512), and an `inline` function
// emitted out of line in an AVX-512 unit could otherwise be picked by the linker for every caller.
// Use it on free functions and function templates only.
#pragma once

#if defined(__CUDACC__)
#define ZRT_HD static __host__ __device__ __forceinline__
#define ZRT_HD_MEMBER __host__ __device__ __forceinline__
#else
#define ZRT_HD static inline
// Members cannot be static: always inlined instead, so no out-of-line copy is called.
#define ZRT_HD_MEMBER inline __attribute__((always_inline))
#endif
