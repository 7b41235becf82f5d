// Full state in process: a tensor's unsharded fp32 optimizer state (master weights, optionally the
// moments), assembled from every rank's shard without leaving the job — torch's state_dict(), or
// DeepSpeed's zero_to_fp32 done live. Works on any StateView (ZeroEngine::state_view()), wherever
// the state lives (device, host, NVMe: read through the view).
//
//   zrt::FullStateOptions o;                    // master of every tensor, on rank 0
//   RETURN_IF_ERROR(zrt::ForEachFullTensor(comm, engine->state_view(), o,
//       [&](const zrt::TensorSpec& t, std::string_view kind, std::span<const float> v) { ...; return zrt::Status(); }));
//
// Streamed tensor by tensor: memory is one tensor's fp32 values on each receiving rank, and on every
// other rank the largest piece of one tensor it owns (about numel / world size). Values are exact
// (bytes are moved, nothing is summed). Collective: every rank calls it with the same options
// (checked: InvalidArgument on every rank otherwise); an error on one rank (a failed NVMe read, an
// unknown tensor) is every rank's. Tensors over a data-parallel group of their own (experts) come
// after the others, each expert group's by its first member's rank.
#pragma once

#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zrt/core/communicator.h"
#include "zrt/core/state_view.h"

namespace zrt {

struct FullStateOptions {
  int root = 0;                                  // the rank that receives the values; -1: every rank
  std::vector<std::string> kinds = {"master"};   // and/or "exp_avg", "exp_avg_sq", "max_exp_avg_sq"
  std::vector<std::string> tensors;              // by name; empty: every tensor, in group order
};

// Called on the receiving rank(s) once per tensor and kind (a kind the tensor's group does not keep,
// such as the moments of a frozen tensor, is skipped); `values` are valid during the call. An error
// returned by fn on any rank stops the walk on every rank.
using FullStateFn = std::function<Status(const TensorSpec& tensor, std::string_view kind, std::span<const float> values)>;

Status ForEachFullTensor(Communicator* comm, const StateView& state, const FullStateOptions& options, const FullStateFn& fn);

}  // namespace zrt
