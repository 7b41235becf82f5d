// A load in two steps (load.cc): Prepare opens the checkpoint, checks it against the target and plans
// every read, writing nothing; Fill reads and writes the target's buffers. Resume agrees on every
// rank's preparation before any rank fills, so a checkpoint that does not fit the model (a
// configuration mistake) changes nothing anywhere. Internal to zrt_checkpoint.
#pragma once

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "zrt/checkpoint/format.h"
#include "zrt/checkpoint/load.h"
#include "zrt/core/communicator.h"

namespace zrt::ckpt::internal {

// Collective: the tensor names of every rank's target (a rank's view holds only its own groups over
// data-parallel groups of their own: what a file's tensors are judged against).
Result<std::set<std::string>> WorldTensorNames(Communicator* comm, const StateView& target);

class PreparedLoad {
 public:
  // `mismatch` (optional) is set when the failure is the target's own: tensors, shapes or dtypes that
  // the checkpoint does not have (strict), not the files. `target` must outlive the prepared load.
  // `world`: the checkpoint's tensors that the target lacks are judged over every rank's target
  // (Claimed, AddUnexpected: a rank holds the tensors of its own data-parallel groups alone), not here.
  static Result<std::unique_ptr<PreparedLoad>> Prepare(const std::string& dir, const StateView& target, const LoadOptions& options,
                                                       bool* mismatch = nullptr, bool world = false);
  ~PreparedLoad();
  const Manifest& manifest() const;
  // Per tensor of the manifest (groups, then tensors, in order): 1 where the target has it.
  std::vector<float> Claimed() const;
  // Tensors of the checkpoint no rank's target has (not strict; Fill's LoadResult::unexpected).
  void AddUnexpected(std::vector<std::string> names);
  // Reads (every chunk checked) and fills the target; its buffers change from here on.
  Result<LoadResult> Fill();

 private:
  struct Impl;
  explicit PreparedLoad(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace zrt::ckpt::internal
