// One tensor of a checkpoint, or any element range of it, read without loading the rest: only the
// chunks that overlap are read, each checked (tools, the Python module). Not thread-safe.
#pragma once

#include <memory>
#include <string>

#include "zrt/checkpoint/format.h"
#include "zrt/core/status.h"

namespace zrt::ckpt {

class TensorReader {
 public:
  static Result<std::unique_ptr<TensorReader>> Open(const std::string& dir);
  ~TensorReader();
  const Manifest& manifest() const;
  const std::string& dir() const;
  // The tensor called `name`: its entry and group, or NotFound.
  Result<std::pair<const GroupEntry*, const TensorEntry*>> Find(const std::string& name) const;
  // Elements [offset, offset + count) of tensor `name`'s state `kind` ("master", "exp_avg", ...) as f32.
  Status Read(const std::string& name, const std::string& kind, int64_t offset, int64_t count, float* out);

 private:
  struct Impl;
  explicit TensorReader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace zrt::ckpt
