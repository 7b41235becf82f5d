// safetensors interchange (https://github.com/huggingface/safetensors, docs/interop.md): the format
// the Hugging Face ecosystem and inference engines load and pretrained weights come in.
//
// A file: 8 bytes little-endian N, then N bytes of JSON header {"<tensor>": {"dtype": "BF16",
// "shape": [..], "data_offsets": [begin, end]}, ..., "__metadata__": {"k": "v"}} padded with spaces
// to 8-byte alignment, then the byte buffer the offsets index (relative to its start), which the
// tensors tile exactly (no holes, no overlaps). Above a size limit a model is several files with a
// `<stem>.safetensors.index.json` beside them: {"metadata": {...}, "weight_map": {"<tensor>": "<file>"}}.
//
// What zrt writes: parameters under their names (mapped by a NameMap) in the model's dtype, or f32 /
// bf16 / f16 on request; with all states also `optimizer/<kind>/<name>` in f32, and the metadata key
// "zrt" holding (as JSON text) what a full restore needs: step, counters, groups and their settings,
// trainer and engine state. Files from elsewhere need none of it: every float tensor is a parameter.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "zrt/checkpoint/interchange/interchange.h"
#include "zrt/checkpoint/load.h"
#include "zrt/checkpoint/catalog.h"
#include "zrt/core/communicator.h"
#include "zrt/core/dtype.h"
#include "zrt/core/state_view.h"
#include "zrt/core/status.h"

namespace zrt::ckpt {

// A safetensors model opened for reading, as untrusted input: every header is checked (size bounded,
// JSON object, known dtypes, shapes overflow-checked, offsets tiling the buffer, the file as long as
// the header says) and an index's files are plain names opened beneath its directory, never through a
// symbolic link, before anything is read.
class SafetensorsReader {
 public:
  struct Tensor {
    std::string name;
    std::string dtype;  // as in the file: "BF16", "F16", "F32", "F64", "I64", ...
    std::vector<int64_t> shape;
    int64_t numel = 1;
    int file = 0;         // index into files()
    int64_t offset = 0;   // absolute byte offset in its file
    int64_t bytes = 0;
    bool floating() const;  // F16, BF16, F32 or F64: readable as float
  };

  // `path`: a .safetensors file, a <stem>.safetensors.index.json, or a directory holding
  // model.safetensors.index.json or model.safetensors (a .safetensors path that does not exist is
  // looked up as <stem>.safetensors.index.json beside it).
  static Result<SafetensorsReader> Open(const std::string& path);

  const std::vector<Tensor>& tensors() const { return tensors_; }  // by file, then offset
  const Tensor* Find(const std::string& name) const;
  // The file's __metadata__ (one file) or the index's "metadata" (string values only; others dropped).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::vector<std::string>& files() const { return files_; }
  const std::string& path() const { return path_; }
  int64_t total_bytes() const;

  // Elements [offset, offset + count) of a floating tensor, converted to f32.
  Status ReadFloat(const Tensor& t, int64_t offset, int64_t count, float* out) const;
  // Raw bytes [offset, offset + bytes) of a tensor's data.
  Status ReadBytes(const Tensor& t, int64_t offset, int64_t bytes, void* out) const;

 private:
  std::string path_;
  std::vector<std::string> files_;
  struct Fds;  // the open files (shared by copies)
  std::shared_ptr<Fds> fds_;
  std::vector<Tensor> tensors_;
  std::map<std::string, size_t> by_name_;
  std::map<std::string, std::string> metadata_;
};

// "<stem>.safetensors" -> "<stem>" (other names unchanged): where a sharded model's files and index go.
std::string SafetensorsStem(const std::string& path);

struct SafetensorsExportOptions {
  bool all_states = false;      // parameters only, or also the optimizer state (optimizer/<kind>/<name>)
  std::optional<DType> dtype;   // parameters' dtype: default each tensor's model dtype (f32 with all_states)
  int64_t max_shard_bytes = int64_t{5} << 30;  // above this, several files and an index (Hugging Face's 5 GiB)
  NameMap names;                // checkpoint names -> names in the file
};
// Writes `out_path` (a .safetensors file; sharded: <stem>-0000i-of-0000N.safetensors beside it and
// <stem>.safetensors.index.json, written last). Streams one group at a time; each file reaches its name
// only once complete and durable. Progress in bytes written.
Status ExportSafetensors(const std::string& dir, const std::string& out_path, const SafetensorsExportOptions& options,
                         const ProgressFn& progress = nullptr);

// A safetensors model (from zrt or elsewhere) into a complete checkpoint for options.world_size ranks.
// Parameters only gives a checkpoint whose optimizer state is absent: load it with
// LoadOptions::params_only (fresh optimizer state). A zrt export with all states restores everything.
// `names`: names in the file -> checkpoint names.
Status ImportSafetensors(const std::string& in_path, const std::string& out_root, const ImportOptions& options,
                         const NameMap& names = {}, const ProgressFn& progress = nullptr);

// Initialises a run from pretrained weights in place, on every rank of `comm` (collective): each rank
// reads only its shard's slices of the file's tensors (mapped by `names`) into target's fp32 master
// weights (and the optimizer state where the file carries it and !params_only, else zero); the ranks
// agree on the outcome, then target.restore (the engine re-derives its parameters) with the target's
// own counters (step 0 for a fresh engine) unless the file carries zrt's. Matching follows
// LoadOptions::strict; the result lists what did not match.
struct SafetensorsLoadOptions {
  NameMap names;
  bool strict = true;
  bool params_only = true;
};
Result<LoadResult> LoadSafetensors(Communicator* comm, const std::string& path, const StateView& target,
                                   const SafetensorsLoadOptions& options = {});

}  // namespace zrt::ckpt
