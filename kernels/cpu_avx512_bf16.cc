// The AVX-512 unit again, built with -mavx512bf16 -mavx512vbmi: its float -> bf16 narrowing (ToBf16)
// is then AVX512-BF16's conversion, and its byte narrowing (LowBytes) a VBMI permute: the same bits in
// fewer operations. CpuIsa::kAvx512Bf16; chosen by kAuto where the CPU has both extensions.
#include "cpu_avx512.cc"  // NOLINT(bugprone-suspicious-include): one source, two instruction sets
