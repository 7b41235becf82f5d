// ForEachFullTensor: for each tensor and kind, every owning rank reads its piece (at most one per
// rank: a shard is a contiguous range of the group's buffer), the ranks agree that every read
// succeeded, then each piece is broadcast from its owner straight into its place in the receiving
// ranks' buffer. Stage 0 keeps the whole state on every rank: no communication at all.
//
// A group over a data-parallel group of its own (StateGroup::own_group, the experts of a mixture of
// experts) is on its members only, and other members' groups are not in a rank's view: each group's
// first member describes its groups (tensors, kinds, pieces) in the all-gather of strings that checks
// the ranks asked for the same, and every rank walks those descriptions after the view's other
// groups, shard s read on member s (stage 0: on the first member).
#include "zrt/runtime/full_state.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

namespace zrt {
namespace {

using nlohmann::json;

struct Piece {
  int owner;  // the world rank that reads it
  int64_t shard_offset, tensor_offset, count;
};

// One tensor's values of one kind on the receivers: its owners read their pieces (`read`), the ranks
// agree, the pieces are broadcast (unless every rank holds all of it: `local_only`), fn is called.
class Assembler {
 public:
  Assembler(Communicator* comm, const FullStateOptions& o, const FullStateFn& fn)
      : comm_(comm), fn_(fn), me_(comm->rank()), receive_(o.root == -1 || o.root == comm->rank()) {}

  Status Tensor(const TensorSpec& t, const std::string& kind, const std::vector<Piece>& pieces, bool local_only,
                const std::function<Status(const Piece&, float*)>& read) {
    if (receive_) full_.assign(static_cast<size_t>(t.numel()), 0.0f);
    Status local;
    for (const Piece& p : pieces) {
      if (!local.ok()) break;
      if (local_only) {
        if (receive_) local = read(p, full_.data() + p.tensor_offset);
      } else if (p.owner == me_) {
        mine_.resize(static_cast<size_t>(p.count));
        local = read(p, mine_.data());
      }
    }
    RETURN_IF_ERROR(AgreeOnStatus(comm_, local), "full state of '", t.name, "' (", kind, ")");
    for (const Piece& p : pieces) {
      if (local_only || p.count == 0) continue;
      float* dst;
      if (receive_) {
        dst = full_.data() + p.tensor_offset;
      } else {
        scratch_.resize(static_cast<size_t>(p.count));
        dst = scratch_.data();
      }
      if (p.owner == me_) std::memcpy(dst, mine_.data(), static_cast<size_t>(p.count) * 4);
      RETURN_IF_ERROR(comm_->Broadcast(dst, static_cast<size_t>(p.count) * 4, DType::kBytes, p.owner), "full state of '", t.name, "' (",
                      kind, ")");
    }
    const Status s = receive_ ? fn_(t, kind, full_) : Status();
    RETURN_IF_ERROR(AgreeOnStatus(comm_, s), "full state of '", t.name, "' (", kind, ")");
    return Status();
  }

 private:
  Communicator* comm_;
  const FullStateFn& fn_;
  int me_;
  bool receive_;
  std::vector<float> full_, mine_, scratch_;
};

std::vector<Piece> PiecesOf(const StateGroup& g, int64_t tensor, int64_t numel) {
  std::vector<Piece> out;
  for (const ShardPiece& p : g.layout.Locate(tensor, 0, numel)) {
    // The mesh's rank p.rank (hybrid sharding: the first replica group's), or member p.rank.
    const int owner = g.own_group.empty() ? p.rank : g.own_group[static_cast<size_t>(p.rank)];
    out.push_back({owner, p.shard_offset, p.tensor_offset, p.count});
  }
  return out;
}

// An own group as its first member describes it.
struct OwnGroup {
  std::string name;
  std::vector<int> members;
  std::vector<std::string> kinds;
  std::vector<std::pair<TensorSpec, std::vector<Piece>>> tensors;
};

// What the first member of an own group sends: per group its members, kinds, tensors and pieces.
json Describe(const StateView& state, int me) {
  json groups = json::array();
  for (const StateGroup& g : state.groups) {
    if (g.own_group.empty() || g.own_group.front() != me) continue;
    json kinds = json::array(), tensors = json::array();
    for (const StateBuffer& b : g.buffers) kinds.push_back(b.kind);
    for (size_t ti = 0; ti < g.tensors.size(); ++ti) {
      const TensorSpec& t = g.tensors[ti];
      json pieces = json::array();
      for (const Piece& p : PiecesOf(g, static_cast<int64_t>(ti), t.numel())) pieces.push_back({p.owner, p.shard_offset, p.tensor_offset, p.count});
      tensors.push_back({{"name", t.name}, {"shape", t.shape}, {"dtype", static_cast<int>(t.dtype)}, {"pieces", std::move(pieces)}});
    }
    groups.push_back({{"name", g.name}, {"members", g.own_group}, {"kinds", std::move(kinds)}, {"tensors", std::move(tensors)}});
  }
  return groups;
}

// Collective: checks that every rank asks for the same (the walk is collective) and returns every
// own group, as its first member describes it (every rank has such groups or none does).
Result<std::vector<OwnGroup>> AgreedOwnGroups(Communicator* comm, const StateView& state, const FullStateOptions& o) {
  const int me = comm->rank();
  const json asked = {o.root, o.kinds, o.tensors};
  const json mine = {{"asked", asked}, {"groups", state.has_own_groups() ? Describe(state, me) : json::array()}};
  ASSIGN_OR_RETURN(const std::vector<std::string> parts, AllGatherStrings(comm, mine.dump()), "full state");
  std::vector<OwnGroup> own;
  try {
    for (size_t r = 0; r < parts.size(); ++r) {
      const json part = json::parse(parts[r]);
      if (part.at("asked") != asked) {
        return InvalidArgumentError("full state: rank ", r, " asks for ", part.at("asked").dump(), ", rank ", me, " for ", asked.dump(),
                                    " (root, kinds, tensors: every rank passes the same)");
      }
      for (const json& g : part.at("groups")) {
        OwnGroup& og = own.emplace_back();
        og.name = g.at("name").get<std::string>();
        og.members = g.at("members").get<std::vector<int>>();
        og.kinds = g.at("kinds").get<std::vector<std::string>>();
        for (const json& t : g.at("tensors")) {
          auto& [spec, pieces] = og.tensors.emplace_back();
          spec = {t.at("name").get<std::string>(), t.at("shape").get<std::vector<int64_t>>(), static_cast<DType>(t.at("dtype").get<int>())};
          for (const json& q : t.at("pieces")) pieces.push_back({q.at(0).get<int>(), q.at(1).get<int64_t>(), q.at(2).get<int64_t>(), q.at(3).get<int64_t>()});
        }
      }
    }
  } catch (const json::exception& e) {  // the same bytes on every rank: the same verdict
    return InternalError("full state: a rank's description: ", e.what());
  }
  return own;
}

}  // namespace

Status ForEachFullTensor(Communicator* comm, const StateView& state, const FullStateOptions& o, const FullStateFn& fn) {
  if (comm->size() != state.world_size) {
    return InvalidArgumentError("full state: the communicator has ", comm->size(), " ranks, the state ", state.world_size);
  }
  const int me = comm->rank();
  ASSIGN_OR_RETURN(const std::vector<OwnGroup> own, AgreedOwnGroups(comm, state, o));
  if (o.root < -1 || o.root >= comm->size()) return InvalidArgumentError("full state: root ", o.root, " is not a rank (or -1)");
  std::set<std::string, std::less<>> wanted(o.tensors.begin(), o.tensors.end());
  for (const std::string& name : o.tensors) {  // the same verdict on every rank: the own groups are everyone's now
    bool found = false;
    for (const StateGroup& g : state.groups) {
      for (const TensorSpec& t : g.tensors) found = found || (g.own_group.empty() && t.name == name);
    }
    for (const OwnGroup& g : own) {
      for (const auto& t : g.tensors) found = found || t.first.name == name;
    }
    if (!found) return NotFoundError("full state: no tensor named '", name, "'");
  }
  Assembler assemble(comm, o, fn);
  for (const StateGroup& g : state.groups) {
    if (!g.own_group.empty()) continue;
    const int gi = static_cast<int>(&g - state.groups.data());
    const bool local_only = state.stage == 0 || comm->size() == 1;  // every rank holds all of it
    for (size_t ti = 0; ti < g.tensors.size(); ++ti) {
      const TensorSpec& t = g.tensors[ti];
      if (!wanted.empty() && wanted.count(t.name) == 0) continue;
      for (const std::string& kind : o.kinds) {
        int b = -1;
        for (size_t k = 0; k < g.buffers.size(); ++k) b = g.buffers[k].kind == kind ? static_cast<int>(k) : b;
        if (b < 0) continue;  // the group keeps no such state (a frozen tensor's moments)
        RETURN_IF_ERROR(assemble.Tensor(t, kind, PiecesOf(g, static_cast<int64_t>(ti), t.numel()), local_only,
                                        [&](const Piece& p, float* out) { return state.Read(gi, b, p.shard_offset, p.count, out); }));
      }
    }
  }
  for (const OwnGroup& g : own) {
    int gi = -1;  // this rank's copy of the group, if it is a member (the members' names agree)
    if (std::find(g.members.begin(), g.members.end(), me) != g.members.end()) {
      for (size_t k = 0; k < state.groups.size(); ++k) {
        if (!state.groups[k].own_group.empty() && state.groups[k].name == g.name) gi = static_cast<int>(k);
      }
    }
    for (const auto& [t, pieces] : g.tensors) {
      if (!wanted.empty() && wanted.count(t.name) == 0) continue;
      for (const std::string& kind : o.kinds) {
        const auto at = std::find(g.kinds.begin(), g.kinds.end(), kind);
        if (at == g.kinds.end()) continue;
        const int b = static_cast<int>(at - g.kinds.begin());
        RETURN_IF_ERROR(assemble.Tensor(t, kind, pieces, comm->size() == 1, [&](const Piece& p, float* out) {
          if (gi < 0) return InternalError("full state: rank ", me, " reads a piece of group '", g.name, "', not its own");
          return state.Read(gi, b, p.shard_offset, p.count, out);
        }));
      }
    }
  }
  return Status();
}

}  // namespace zrt
