// The start of every snapshot (snapshot.h).
#include "zrt/checkpoint/snapshot.h"
#include "zrt/core/base.h"

#include <chrono>
#include <cstdio>

#include "zrt/checkpoint/commit.h"
#include "zrt/checkpoint/shard_writer.h"

namespace zrt::ckpt::internal {

Result<SnapshotStart> StartSnapshot(Communicator* comm, const StateView& state, const nlohmann::json& trainer_state,
                                    int64_t chunk_elements, bool skip_vote) {
  const int shards = state.groups.empty() ? 1 : state.groups[0].layout.world_size();
  if (state.world_size != comm->size() || (shards > 1 && (comm->size() % shards != 0 || state.rank != comm->rank() % shards))) {
    return InvalidArgumentError("snapshot: rank ", comm->rank(), " of ", comm->size(), " holds shard ", state.rank, " of ", shards,
                                " in a state of ", state.world_size, " ranks (shard groups must be consecutive ranks: shard = rank % shards)");
  }
  float skip = skip_vote ? 1.0f : 0.0f;
  RETURN_IF_ERROR(comm->AllReduce(&skip, &skip, 1, DType::kF32, ReduceOp::kMin), "snapshot");
  SnapshotStart s;
  s.skip = skip > 0;
  if (s.skip) return s;
  char nonce[17] = {};
  if (comm->rank() == 0) std::snprintf(nonce, sizeof(nonce), "%s", NewNonce().c_str());
  RETURN_IF_ERROR(comm->Broadcast(nonce, sizeof(nonce), DType::kBytes, 0), "snapshot nonce");
  ASSIGN_OR_RETURN(s.manifest, ManifestFor(state, trainer_state, chunk_elements, nonce));
  return s;
}

Result<double> HandOver(const StateView& state, std::shared_ptr<StateSink> sink, double t0) {
  RETURN_IF_ERROR(state.Capture(std::move(sink)));
  const double stall = SteadySeconds() - t0;
  if (state.owner != nullptr) state.owner->Stalled(stall);
  return stall;
}

}  // namespace zrt::ckpt::internal
