// The `zrt ckpt ...` commands as library functions: each writes its report to `out` and returns a
// Status (OK, or the problem; the CLI maps it to exit code 1). Unit-tested without argv.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "zrt/checkpoint/catalog.h"
#include "zrt/core/status.h"

namespace zrt::tools {

// `path` itself when it holds a manifest (or does not exist: the command reports that); a checkpoint
// root's newest complete checkpoint otherwise (NotFound, with a hint, when it has none).
Result<std::string> ResolveCheckpointDir(const std::string& path);

// A progress bar on stderr when it is a terminal; nothing otherwise (logs, pipes, tests). In bytes.
ckpt::ProgressFn TtyProgress(const std::string& what);

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
                   int threads = 1, bool json = false);

// Export to HDF5 (one file: /params/<name>, /optimizer/<kind>/<name>) or safetensors (a file, or
// several and an index above the shard limit), streamed one group at a time. The format comes from
// `format` or the output's extension.
struct ExportArgs {
  std::string format;              // "", "hdf5" or "safetensors"
  std::string states = "params";   // params | all
  std::string dtype;               // "" (HDF5: f32; safetensors: the model's, f32 with all states), model, f32, bf16, f16
  int64_t max_shard_bytes = 0;     // safetensors: 0 = 5 GiB
  std::string name_map;            // safetensors: a JSON file of names
  std::vector<std::string> renames;  // safetensors: FROM=TO prefix rules
  bool json = false;
};
Status CkptExport(const std::string& dir, const std::string& out_path, const ExportArgs& args, std::ostream& out);

// An HDF5 or safetensors file (exported by zrt or made elsewhere) into a checkpoint for M ranks.
struct ImportArgs {
  std::string format;
  int world_size = 1;
  int stage = 3;
  std::string name_map;
  std::vector<std::string> renames;
  bool json = false;
};
Status CkptImport(const std::string& in_path, const std::string& out_root, const ImportArgs& args, std::ostream& out);

// Per-tensor (and per state kind) max absolute / relative difference between two checkpoints, NaN and
// infinities included (NaN equals NaN; NaN or inf against a number is an infinite difference). Not
// OK (exit 1) when any element differs.
Status CkptDiff(const std::string& a, const std::string& b, bool json, std::ostream& out);

}  // namespace zrt::tools
