// A checkpoint opened for reading (the `zrt` tools, the Python module): its manifest and saved layouts,
// what its files hold per state kind, and one tensor, or any element range of it, read without
// loading the rest: only the chunks that overlap are read, each checked. Not thread-safe.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "zrt/checkpoint/format.h"
#include "zrt/core/shard_layout.h"
#include "zrt/core/status.h"

namespace zrt::ckpt {

class TensorReader {
 public:
  static Result<std::unique_ptr<TensorReader>> Open(const std::string& dir);
  ~TensorReader();
  const Manifest& manifest() const;
  const std::string& dir() const;
  const ShardLayout& layout(int group) const;  // the saved layout of manifest group `group`

  // What the shard files hold, from every rank's index (each read and checked): per state kind the
  // raw (fp32) and stored bytes, and the chunks in all.
  struct Stored {
    // kind ("exp_avg", or "exp_avg (q8)" for a kind stored compact: format.h Precision) -> (its stored
    // form's bytes, after compression)
    std::map<std::string, std::pair<int64_t, int64_t>> bytes;
    int64_t chunks = 0;
  };
  Result<Stored> StoredBytes();
  // The tensor called `name`: its entry and group, or NotFound.
  Result<std::pair<const GroupEntry*, const TensorEntry*>> Find(const std::string& name) const;
  // Elements [offset, offset + count) of tensor `name`'s state `kind` ("master", "exp_avg", ...) as f32.
  Status Read(const std::string& name, const std::string& kind, int64_t offset, int64_t count, float* out);
  // Read-ahead for a caller that knows its reads: Plan each Read to come, in the order they will come,
  // then StartReadAhead: the chunks are read asynchronously, `window_bytes` at most ahead of Read
  // (each still checked when Read reaches it). Reads that were not planned work as without.
  Status Plan(const std::string& name, const std::string& kind, int64_t offset, int64_t count);
  void StartReadAhead(int64_t window_bytes);

 private:
  struct Impl;
  explicit TensorReader(std::unique_ptr<Impl> impl);
  // fn(group, kind index, piece) for each saved shard's piece of the range, after checking the request.
  Status ForEachPiece(const std::string& name, const std::string& kind, int64_t offset, int64_t count,
                      const std::function<Status(int group, int kind, const ShardPiece&)>& fn);
  std::unique_ptr<Impl> impl_;
};

}  // namespace zrt::ckpt
