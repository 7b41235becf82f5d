// Chunk compression settings of checkpoints (CheckpointOptions::compression): optional byte-grouping
// (each element's bytes split into planes, so exponents sit together) then zstd. Off by default: on
// machines like ours the disk outruns zstd on model state (../shared/DESIGN.md "Checkpoints" 9).
#pragma once

#include <cstdint>
#include <string_view>

#include "zrt/core/status.h"

namespace zrt::ckpt {

enum class Codec : uint8_t { kRaw = 0, kZstd = 1, kByteGroupZstd = 2 };
std::string_view CodecName(Codec c);  // "raw", "zstd", "bg+zstd"
Result<Codec> ParseCodec(std::string_view name);

struct CompressOptions {
  Codec codec = Codec::kRaw;
  int level = 1;  // zstd level
};

}  // namespace zrt::ckpt
