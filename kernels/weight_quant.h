// Block-quantized values for ZeRO++'s collectives (Wang et al. 2023): stage-3 parameter gathers (qwZ,
// EngineConfig::quantized_weights, int8) and gradient reduce-scatters (qgZ, quantized_gradients, int8
// or int4). A span of n values (f32, bf16 or f16) is sent as signed `bits`-bit codes with one f32
// scale per block of `block` values, and the receivers decode them. Symmetric, with L = 127 (int8) or
// 7 (int4): scale = max |x| over the block / L, code = round-to-nearest-even(x * (L / max |x|)) in
// [-L, L], decoded as code * scale rounded to the destination dtype. A block of zeros has scale 0 and
// decodes to zeros; a block holding inf or NaN decodes to NaN (never a silent finite value).
// |x - decoded| <= scale / 2 = max |x| / (2 L) (plus the f32 arithmetic's rounding) before the
// dtype's rounding.
//
// Packed layout of one span (what is sent): ceil(n / block) f32 scales, then the codes: int8, one a
// byte; int4, two a byte (element i in byte i / 2, the low nibble for even i, two's complement; a last
// odd element's high nibble 0). int4 needs an even block, so that no byte holds two blocks' codes.
// PackedWeightBytes(n, block, bits) bytes. CPU only (host memory); the engine refuses the options on
// device memory the host cannot address.
#pragma once

#include <cstdint>

#include "zrt/core/dtype.h"
#include "zrt/core/status.h"
#include "zrt/kernels/cpu.h"

namespace zrt::kernels {

inline constexpr int64_t kWeightQuantMaxBlock = int64_t{1} << 20;

constexpr int64_t WeightQuantBlocks(int64_t n, int64_t block) { return (n + block - 1) / block; }
// bits: 8 or 4 (CheckWeightQuant).
constexpr int64_t PackedWeightBytes(int64_t n, int64_t block, int bits = 8) {
  return WeightQuantBlocks(n, block) * 4 + (bits == 4 ? (n + 1) / 2 : n);
}
// The block a width works best with where the trainer sets none (`configured` 0): 256 values for int8;
// 64 for int4, whose coarser codes need a scale closer to each value (examples/gpt, docs/engine.md
// "Quantized collectives": int4 qgZ at 256 ended 2.0% above exact reductions, at 64 within 0.2%).
constexpr int64_t QuantBlockFor(int64_t configured, int bits) { return configured > 0 ? configured : bits == 4 ? 64 : 256; }
// The largest code: 127 for int8, 7 for int4.
constexpr int WeightQuantLevels(int bits) { return bits == 4 ? 7 : 127; }
// InvalidArgument naming what is wrong: bits not 8 or 4, a block outside [1, kWeightQuantMaxBlock], or
// an odd block for int4.
Status CheckWeightQuant(int64_t block, int bits);

// src: n values of dtype (kF32, kBF16 or kF16); packed: PackedWeightBytes(n, block, bits) bytes.
// Precondition: CheckWeightQuant(block, bits) is OK. `isa`: the instruction set (kAuto: the best the
// CPU has; one it lacks runs the baseline loops); every one gives the same bytes.
void QuantizeWeights(const void* src, DType dtype, int64_t n, int64_t block, void* packed, int bits = 8, CpuIsa isa = CpuIsa::kAuto);
// dst: n values of dtype, decoded from `packed`.
void DequantizeWeights(const void* packed, int64_t n, int64_t block, void* dst, DType dtype, int bits = 8, CpuIsa isa = CpuIsa::kAuto);

}  // namespace zrt::kernels
