// The CPU kernels' shared options: which instruction set (detected at run time) and which threads.
// Thread-safety: plain values; the pool is the caller's and may be shared between calls.
#pragma once

#include <cstdint>
#include <string_view>

namespace zrt {
class ThreadPool;
}

namespace zrt::kernels {

// Which instruction set the CPU kernels use. kAuto picks the best the CPU (and OS) supports.
// kAvx512Bf16: AVX-512 with AVX512-BF16 and AVX512-VBMI: bf16 conversion and byte permutes (the same
// results, fewer operations).
enum class CpuIsa : uint8_t { kAuto, kScalar, kAvx2, kAvx512, kAvx512Bf16 };
std::string_view CpuIsaName(CpuIsa isa);
// The best ISA this machine supports (never kAuto).
CpuIsa DetectCpuIsa();
bool CpuSupports(CpuIsa isa);

struct CpuKernelOptions {
  ThreadPool* pool = nullptr;  // null: run on the calling thread only
  int threads = 0;             // at most this many threads including the caller; <= 0: pool workers + 1
  CpuIsa isa = CpuIsa::kAuto;  // forcing an unsupported ISA is an Unavailable error
  int64_t chunk = 1 << 15;     // elements per work item (a multiple of 64 is kept aligned)
};

}  // namespace zrt::kernels
