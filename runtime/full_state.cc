// ForEachFullTensor: for each tensor and kind, every owning rank reads its piece (at most one per
// rank: a shard is a contiguous range of the group's buffer), the ranks agree that every read
// succeeded, then each piece is broadcast from its owner straight into its place in the receiving
// ranks' buffer. Stage 0 keeps the whole state on every rank: no communication at all.
#include "zrt/runtime/full_state.h"

#include <algorithm>
#include <cstring>
#include <set>

namespace zrt {

Status ForEachFullTensor(Communicator* comm, const StateView& state, const FullStateOptions& o, const FullStateFn& fn) {
  if (o.root < -1 || o.root >= comm->size()) return InvalidArgumentError("full state: root ", o.root, " is not a rank (or -1)");
  RETURN_IF_ERROR(state.CheckOneMesh("full state"));
  if (comm->size() != state.world_size) {
    return InvalidArgumentError("full state: the communicator has ", comm->size(), " ranks, the state ", state.world_size);
  }
  std::set<std::string, std::less<>> wanted(o.tensors.begin(), o.tensors.end());
  for (const std::string& name : o.tensors) {
    bool found = false;
    for (const StateGroup& g : state.groups) {
      for (const TensorSpec& t : g.tensors) found = found || t.name == name;
    }
    if (!found) return NotFoundError("full state: no tensor named '", name, "'");
  }
  const int me = comm->rank();
  const bool local_only = state.stage == 0 || comm->size() == 1;  // every rank holds everything
  const bool receive = o.root == -1 || o.root == me;
  std::vector<float> full, mine;
  for (const StateGroup& g : state.groups) {
    for (size_t ti = 0; ti < g.tensors.size(); ++ti) {
      const TensorSpec& t = g.tensors[ti];
      if (!wanted.empty() && wanted.count(t.name) == 0) continue;
      const int64_t numel = t.numel();
      for (const std::string& kind : o.kinds) {
        int b = -1;
        for (size_t k = 0; k < g.buffers.size(); ++k) b = g.buffers[k].kind == kind ? static_cast<int>(k) : b;
        if (b < 0) continue;  // the group keeps no such state (a frozen tensor's moments)
        const int gi = static_cast<int>(&g - state.groups.data());
        const std::vector<ShardPiece> pieces = g.layout.Locate(static_cast<int64_t>(ti), 0, numel);
        if (receive) full.assign(static_cast<size_t>(numel), 0.0f);
        Status local;
        if (local_only) {
          for (const ShardPiece& p : pieces) {
            if (local.ok() && receive) local = state.Read(gi, b, p.shard_offset, p.count, full.data() + p.tensor_offset);
          }
        } else {
          for (const ShardPiece& p : pieces) {
            if (p.rank != me || !local.ok()) continue;
            mine.resize(static_cast<size_t>(p.count));
            local = state.Read(gi, b, p.shard_offset, p.count, mine.data());
          }
        }
        RETURN_IF_ERROR(AgreeOnStatus(comm, local), "full state of '", t.name, "' (", kind, ")");
        if (!local_only) {
          std::vector<float> scratch;
          for (const ShardPiece& p : pieces) {
            if (p.count == 0) continue;
            float* dst;
            if (receive) {
              dst = full.data() + p.tensor_offset;
            } else {
              scratch.resize(static_cast<size_t>(p.count));
              dst = scratch.data();
            }
            if (p.rank == me) std::memcpy(dst, mine.data(), static_cast<size_t>(p.count) * 4);
            RETURN_IF_ERROR(comm->Broadcast(dst, static_cast<size_t>(p.count) * 4, DType::kBytes, p.rank), "full state of '",
                            t.name, "' (", kind, ")");
          }
        }
        Status s = receive ? fn(t, kind, full) : Status();
        RETURN_IF_ERROR(AgreeOnStatus(comm, s), "full state of '", t.name, "' (", kind, ")");
      }
    }
  }
  return Status();
}

}  // namespace zrt
