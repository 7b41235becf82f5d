// The start of every snapshot (snapshot.h).
#include "zrt/checkpoint/snapshot.h"
#include "zrt/core/base.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>

#include "zrt/checkpoint/commit.h"
#include "zrt/checkpoint/shard_writer.h"

namespace zrt::ckpt::internal {
namespace {

// `into` gains what `from` has that it lacks, objects merged member by member (the engine's
// per-tensor settings of every own group's tensors).
void MergeObjects(nlohmann::json& into, const nlohmann::json& from) {
  if (!into.is_object() || !from.is_object()) return;
  for (auto it = from.begin(); it != from.end(); ++it) {
    if (!into.contains(it.key())) {
      into[it.key()] = it.value();
    } else {
      MergeObjects(into[it.key()], it.value());
    }
  }
}

// The entries of one own group as its first member sends them: the members, its groups (a manifest
// of them alone, sealed: its own rules checked on arrival), and the engine's state.
struct OwnPart {
  std::vector<int> members;
  Manifest groups;  // empty groups: the rank leads none
  nlohmann::json engine_state;
};

// This rank's part: its own groups' entries when it leads them (the first member), and its engine
// state (rank 0's is the manifest's; the others add their own tensors' settings).
Result<std::string> OwnPartOf(Communicator* comm, const StateView& state, const Manifest& local) {
  nlohmann::json j;
  j["engine_state"] = local.engine_state;
  j["chunk_elements"] = local.chunk_elements;  // rounded to its blocks
  const std::vector<int>* members = nullptr;
  Manifest own = local;
  own.groups.clear();
  for (size_t g = 0; g < state.groups.size(); ++g) {
    const std::vector<int>& m = state.groups[g].own_group;
    if (m.empty()) continue;
    if (members != nullptr && *members != m) {
      return InvalidArgumentError("groups '", state.groups[g].name, "' and another are over two different data-parallel groups of their own");
    }
    const int shards = state.stage == 0 ? 1 : static_cast<int>(m.size());
    if (std::find(m.begin(), m.end(), comm->rank()) == m.end() || state.groups[g].layout.world_size() != shards) {
      return InvalidArgumentError("group '", state.groups[g].name, "': its own data-parallel group (", m.size(), " ranks) leaves out rank ",
                                  comm->rank(), " or disagrees with its layout of ", state.groups[g].layout.world_size(), " shards");
    }
    for (int r : m) {
      if (r < 0 || r >= comm->size()) return InvalidArgumentError("group '", state.groups[g].name, "': member rank ", r, " outside the world");
    }
    members = &m;
    own.groups.push_back(local.groups[g]);
  }
  if (members != nullptr && members->front() == comm->rank()) {
    own.world_size = static_cast<int>(members->size());
    own.shards = state.stage == 0 ? 1 : own.world_size;
    j["members"] = *members;
    j["groups"] = EncodeManifest(own);
  }
  return j.dump();
}

}  // namespace

Result<MeshManifest> ManifestForMesh(Communicator* comm, const StateView& state, const nlohmann::json& trainer_state,
                                     int64_t chunk_elements, const std::string& nonce) {
  Result<Manifest> local = LocalManifest(state, trainer_state, chunk_elements, nonce);
  Result<std::string> part = local.ok() ? OwnPartOf(comm, state, *local) : Result<std::string>(local.status());
  RETURN_IF_ERROR(AgreeOnStatus(comm, part.status()), "the manifest of a save over data-parallel groups of their own");
  ASSIGN_OR_RETURN(const std::vector<std::string> parts, AllGatherStrings(comm, *part), "the manifest's own groups");
  // Every rank builds the same manifest from the same parts; a part that does not parse is a bug
  // (every rank refuses it alike).
  MeshManifest out;
  Manifest& m = out.manifest;
  m = *local;
  m.groups.clear();
  m.shards = state.world_size;
  m.parts = 1;
  out.groups.assign(state.groups.size(), -1);
  for (size_t g = 0; g < state.groups.size(); ++g) {  // the dense groups first, wherever they are in the view
    if (!state.groups[g].own_group.empty()) continue;
    out.groups[g] = static_cast<int>(m.groups.size());
    m.groups.push_back(local->groups[g]);
    if (state.stage == 0) m.groups.back().files = {0};
  }
  std::map<std::string, std::string> tensor_group;  // names are unique across the save
  for (const GroupEntry& ge : m.groups) {
    for (const TensorEntry& te : ge.tensors) tensor_group[te.name] = ge.name;
  }
  int k = 0;
  for (int r = 0; r < comm->size(); ++r) {
    const nlohmann::json j = nlohmann::json::parse(parts[static_cast<size_t>(r)], nullptr, false);
    if (!j.is_object()) return InternalError("rank ", r, "'s part of the manifest does not parse");
    if (r == 0) {
      m.engine_state = j.value("engine_state", nlohmann::json::object());
      m.chunk_elements = j.value("chunk_elements", m.chunk_elements);
    } else {
      MergeObjects(m.engine_state, j.value("engine_state", nlohmann::json::object()));
      // Whole blocks of every group: the largest rounding (blocks are powers of two).
      m.chunk_elements = std::max(m.chunk_elements, j.value("chunk_elements", m.chunk_elements));
    }
    if (!j.contains("members")) continue;
    const std::vector<int> members = j["members"].get<std::vector<int>>();
    ASSIGN_OR_RETURN(const Manifest own, DecodeManifest(j["groups"].get<std::string>(), "rank " + std::to_string(r) + "'s own groups"));
    const bool mine = std::find(members.begin(), members.end(), comm->rank()) != members.end();
    for (const GroupEntry& og : own.groups) {
      GroupEntry ge = og;
      ge.name = og.name + "@" + std::to_string(k);
      ge.files = state.stage == 0 ? std::vector<int>{members.front()} : members;
      for (const TensorEntry& te : ge.tensors) {
        if (auto [it, fresh] = tensor_group.emplace(te.name, ge.name); !fresh) {
          return InvalidArgumentError("checkpoint: tensor '", te.name, "' is in groups '", it->second, "' and '", ge.name,
                                      "' (over different data-parallel groups): checkpoints find tensors by name, so each expert's need names "
                                      "of their own (its global index in the name)");
        }
      }
      if (mine) {  // this rank's copy of the group: the same entry, then the view's group maps here
        for (size_t g = 0; g < state.groups.size(); ++g) {
          const GroupEntry& lg = local->groups[g];
          if (state.groups[g].own_group.empty() || lg.name != og.name) continue;
          bool same_forms = lg.kinds == og.kinds;
          for (size_t kk = 0; same_forms && kk < lg.kinds.size(); ++kk) same_forms = lg.format(kk) == og.format(kk);
          if (lg.tensors.size() != og.tensors.size() || !same_forms ||
              !std::equal(lg.tensors.begin(), lg.tensors.end(), og.tensors.begin(), [](const TensorEntry& a, const TensorEntry& b) {
                return a.name == b.name && a.shape == b.shape && a.offset == b.offset;
              })) {
            return InvalidArgumentError("checkpoint: rank ", comm->rank(), "'s group '", lg.name, "' differs from rank ", r, "'s (one data-parallel group)");
          }
          out.groups[g] = static_cast<int>(m.groups.size());
        }
      }
      m.groups.push_back(std::move(ge));
    }
    ++k;
  }
  for (size_t g = 0; g < out.groups.size(); ++g) {
    if (out.groups[g] < 0) return InternalError("checkpoint: group '", state.groups[g].name, "' of this rank is in no part of the manifest");
  }
  // The rules a reader checks, checked before anything is written.
  ASSIGN_OR_RETURN(m, DecodeManifest(EncodeManifest(m), "the manifest of step " + std::to_string(m.step)));
  return out;
}

Result<SnapshotStart> StartSnapshot(Communicator* comm, const StateView& state, const nlohmann::json& trainer_state,
                                    int64_t chunk_elements, bool skip_vote) {
  int shards = 1;  // the view's mesh: its groups not over a data-parallel group of their own
  for (const StateGroup& g : state.groups) {
    if (g.own_group.empty()) {
      shards = g.layout.world_size();
      break;
    }
  }
  if (state.has_own_groups() && state.rank != comm->rank()) shards = comm->size();  // refused below: no hybrid sharding with them
  if (state.world_size != comm->size() || (shards > 1 && (comm->size() % shards != 0 || state.rank != comm->rank() % shards))) {
    return InvalidArgumentError("snapshot: rank ", comm->rank(), " of ", comm->size(), " holds shard ", state.rank, " of ", shards,
                                " in a state of ", state.world_size, " ranks (shard groups must be consecutive ranks: shard = rank % shards)");
  }
  // One all-reduce: whether any rank saves (skip: none does), and whether some and not all views have
  // groups over data-parallel groups of their own.
  const bool own = state.has_own_groups();
  float votes[3] = {skip_vote ? 0.0f : 1.0f, own ? 1.0f : 0.0f, own ? 0.0f : 1.0f};
  RETURN_IF_ERROR(comm->AllReduce(votes, votes, 3, DType::kF32, ReduceOp::kMax), "snapshot");
  if (votes[1] > 0 && votes[2] > 0) {
    return InvalidArgumentError("snapshot: some ranks have groups over a data-parallel group of their own and some do not (rank ", comm->rank(),
                                own ? " has" : " has not", ")");
  }
  SnapshotStart s;
  s.skip = votes[0] == 0;
  if (s.skip) return s;
  char nonce[17] = {};
  if (comm->rank() == 0) std::snprintf(nonce, sizeof(nonce), "%s", NewNonce().c_str());
  RETURN_IF_ERROR(comm->Broadcast(nonce, sizeof(nonce), DType::kBytes, 0), "snapshot nonce");
  if (!own) {
    ASSIGN_OR_RETURN(s.manifest, ManifestFor(state, trainer_state, chunk_elements, nonce));
    return s;
  }
  ASSIGN_OR_RETURN(MeshManifest mm, ManifestForMesh(comm, state, trainer_state, chunk_elements, nonce));
  s.manifest = std::move(mm.manifest);
  s.groups = std::move(mm.groups);
  return s;
}

Result<double> HandOver(const StateView& state, std::shared_ptr<StateSink> sink, double t0) {
  RETURN_IF_ERROR(state.Capture(std::move(sink)));
  const double stall = SteadySeconds() - t0;
  if (state.owner != nullptr) state.owner->Stalled(stall);
  return stall;
}

}  // namespace zrt::ckpt::internal
