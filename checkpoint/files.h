// Reading a checkpoint directory's files: the manifest, the per-rank indexes and data chunks, with
// errors that name the file, chunk, group, kind and tensors. Shared by verify, catalog and load.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zrt/checkpoint/format.h"
#include "zrt/core/shard_layout.h"
#include "zrt/offload/io_engine.h"

namespace zrt::ckpt {

Result<Manifest> ReadManifest(const std::string& dir);
// The index of shard `rank`; DataLoss when the file names another rank.
Result<RankIndex> ReadIndex(const std::string& dir, int rank);

// "rank-00001.data chunk 17 (group 'layer0', exp_avg, elements 0..4096, tensors w1, w2)".
// `l` is the saved layout of the chunk's group.
std::string ChunkName(const Manifest& m, const ShardLayout& l, const RankIndex& r, size_t k);

// Reads chunk k of a rank's data file `f`, checks its checksum and decodes it into `out` (its
// elements, fp32). `scratch` is reused between calls; *bytes_read grows by the stored bytes.
Status ReadChunk(IoEngine& io, const IoFile& f, const Manifest& m, const ShardLayout& l, const RankIndex& r, size_t k,
                 std::vector<float>* out, std::vector<char>* scratch, int64_t* bytes_read);

}  // namespace zrt::ckpt
