// What every snapshot of a StateView shares, whoever receives it (a disk save: checkpointer.cc; a
// memory-tier generation: tier/memory_tier.cc), written once:
//   1. StartSnapshot (collective): rank 0's nonce (it ties the manifest and every index together) and
//      whether the snapshot is skipped (every rank voted so: the state is already held), in one
//      broadcast and one all-reduce; the manifest (with groups over data-parallel groups of their
//      own: two all-gathers of each own group's entries, SnapshotStart::groups);
//   2. HandOver: the view's Capture into the receiver's sink (the owner streams its state from then
//      on: core/state_view.h), and the owner charged for what the snapshot made it wait so far.
// What training waits for later (the owner's next change waiting for a part still being captured) the
// owner measures and tells the sink (StateSink::Waited). The stall is counted from the agreement on:
// a rank's wait inside it is the ranks' skew (the first to arrive waits for the last), which the
// step's own collectives absorb when there is no snapshot; the two small collectives themselves take
// tens of microseconds. Internal to zrt_checkpoint.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "zrt/checkpoint/format.h"
#include "zrt/core/communicator.h"
#include "zrt/core/state_view.h"

namespace zrt::ckpt::internal {

struct SnapshotStart {
  Manifest manifest;  // with the agreed nonce
  bool skip = false;  // every rank voted to skip: nothing to snapshot
  // The view's group g is the manifest's group groups[g] (empty: the same index). A view with groups
  // over data-parallel groups of their own (StateGroup::own_group) saves every rank's: the manifest
  // holds the view's other groups, then each own group's groups (its first member's, in rank order,
  // named "<group>@<k>" for the k-th own group), their shards in their members' files (GroupEntry::
  // files); every rank writes its file, one part.
  std::vector<int> groups;
  int manifest_group(int g) const { return groups.empty() ? g : groups[static_cast<size_t>(g)]; }
};
Result<SnapshotStart> StartSnapshot(Communicator* comm, const StateView& state, const nlohmann::json& trainer_state,
                                    int64_t chunk_elements, bool skip_vote);

// The manifest of a save of a view with groups over data-parallel groups of their own (SnapshotStart::
// groups says how it is laid out). Collective; every rank gets the same manifest.
struct MeshManifest {
  Manifest manifest;
  std::vector<int> groups;  // the view's group g is the manifest's groups[g]
};
Result<MeshManifest> ManifestForMesh(Communicator* comm, const StateView& state, const nlohmann::json& trainer_state,
                                     int64_t chunk_elements, const std::string& nonce);

// Hands `state` to `sink` and returns the seconds since `t0` (the caller's start), which the owner is
// charged as a checkpoint stall. A capture that cannot start closes nothing: the caller stops its sink.
Result<double> HandOver(const StateView& state, std::shared_ptr<StateSink> sink, double t0);

}  // namespace zrt::ckpt::internal
