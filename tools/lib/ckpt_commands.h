// The `zrt ckpt ...` commands as library functions: each writes its report to `out` and returns a
// Status (OK, or the problem; the CLI maps it to exit code 1). Unit-tested without argv.
#pragma once

#include <ostream>
#include <string>

#include "zrt/core/status.h"

namespace zrt::tools {

// Checkpoints under a root: complete or not (and why), step, size, age, ranks, stage.
Status CkptLs(const std::string& root, bool json, std::ostream& out);

// Format version, world size, stage, groups and tensors, state kinds, compression ratio per kind,
// trainer state. `tensor` filters to names containing it; `stats` streams per-tensor statistics of
// the fp32 master weights (one tensor in memory at a time).
Status CkptInspect(const std::string& dir, const std::string& tensor, bool stats, bool json, std::ostream& out);

// Re-reads every chunk and checks every checksum and the manifest's consistency. DataLoss listing the
// problems (each names the file, chunk and tensors) when anything is wrong.
Status CkptVerify(const std::string& dir, bool json, std::ostream& out);

// Writes a new complete checkpoint in `out_dir` (a root: the step directory goes inside) laid out for
// `world_size` ranks (stage < 0: keep the saved stage; stage 0 gives one shard file); `threads` shards
// are built at once (memory: that many new shards).
Status CkptReshard(const std::string& dir, const std::string& out_root, int world_size, std::ostream& out, int stage = -1,
                   int threads = 1);

// Consolidated, unsharded tensors in one HDF5 file (/params/<name>, /optimizer/<kind>/<name> with
// states == "all"), streamed one group at a time; dtype "f32" or "bf16".
Status CkptExport(const std::string& dir, const std::string& out_h5, const std::string& states, const std::string& dtype,
                  std::ostream& out);
// An HDF5 file (as exported, or /params/* datasets from elsewhere) into a checkpoint for M ranks.
Status CkptImport(const std::string& in_h5, const std::string& out_root, int world_size, int stage, std::ostream& out);

// Per-tensor (and per state kind) max absolute / relative difference between two checkpoints, NaN and
// infinities included (NaN equals NaN; NaN or inf against a number is an infinite difference). Not
// OK (exit 1) when any element differs.
Status CkptDiff(const std::string& a, const std::string& b, bool json, std::ostream& out);

}  // namespace zrt::tools
