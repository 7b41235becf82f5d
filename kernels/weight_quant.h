// Block-quantized int8 weights for stage-3 parameter gathers (qwZ, EngineConfig::quantized_weights;
// ZeRO++, Wang et al. 2023): a shard of n values (f32, bf16 or f16) is sent as int8 codes with one f32
// scale per block of `block` values, and every rank decodes the gathered codes into the full
// parameters. Symmetric: scale = max |x| over the block / 127, code = round-to-nearest-even(x * (127 /
// max |x|)) in [-127, 127], decoded as code * scale rounded to the parameter dtype. A block of zeros
// has scale 0 and decodes to zeros; a block holding inf or NaN decodes to NaN (never a silent finite
// value). |x - decoded| <= scale / 2 (plus the f32 arithmetic's rounding) before the dtype's rounding.
//
// Packed layout of one shard (what is all-gathered): ceil(n / block) f32 scales, then n int8 codes;
// PackedBytes(n, block) bytes, a multiple of 4 when n is (so gathered shards keep their scales aligned).
// CPU only (host memory); the engine refuses the option on device memory the host cannot address.
#pragma once

#include <cstdint>

#include "zrt/core/dtype.h"

namespace zrt::kernels {

inline constexpr int64_t kWeightQuantMaxBlock = int64_t{1} << 20;

constexpr int64_t WeightQuantBlocks(int64_t n, int64_t block) { return (n + block - 1) / block; }
constexpr int64_t PackedWeightBytes(int64_t n, int64_t block) { return WeightQuantBlocks(n, block) * 4 + n; }

// src: n values of dtype (kF32, kBF16 or kF16); packed: PackedWeightBytes(n, block) bytes.
void QuantizeWeights(const void* src, DType dtype, int64_t n, int64_t block, void* packed);
// dst: n values of dtype, decoded from `packed`.
void DequantizeWeights(const void* packed, int64_t n, int64_t block, void* dst, DType dtype);

}  // namespace zrt::kernels
