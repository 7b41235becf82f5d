// Resume (resume.h), one candidate at a time, newest first:
//   candidates  the memory tier's generations every rank can restore (agreed), and the step
//               directories under the root by name (rank 0's list, broadcast): nothing is read yet;
//   check       a disk candidate: rank 0 checks it complete (metadata), and every rank hears the verdict;
//   prepare     every rank opens it and plans its reads against the model (nothing written), and the
//               ranks agree: a model mismatch on any rank ends the walk with that error on every rank
//               (a configuration mistake: no older checkpoint of the run fits either); another
//               failure moves every rank to the next candidate;
//   fill        every rank reads its shards, and the ranks agree; a failure falls back as above (the
//               state may be partly overwritten by then, and is overwritten again by the next);
//   restore     the owner takes the counters (target.Restore) on every rank.
// A memory-tier candidate is loaded by LoadFromTier (own copy, or the peer's replica) in one step.
#include "zrt/checkpoint/load.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "zrt/checkpoint/catalog.h"
#include "zrt/checkpoint/format.h"
#include "zrt/checkpoint/load_plan.h"
#include "zrt/checkpoint/tier/memory_tier.h"
#include "zrt/core/logging.h"

namespace zrt::ckpt {

namespace {

struct Candidate {
  int64_t step;
  bool memory;
  std::string dir;
};

// Rank 0's list of the step directories under `root` (names only), newest first, on every rank.
Result<std::vector<Candidate>> DiskCandidates(Communicator* comm, const std::string& root) {
  std::string text;
  Status listed;
  if (comm->rank() == 0) {
    auto dirs = ListStepDirs(root);
    nlohmann::json j = nlohmann::json::array();
    if (dirs.ok()) {
      for (const StepDir& d : *dirs) {
        if (!d.in_progress) j.push_back({d.step, d.dir});
      }
    } else if (dirs.status().code() != StatusCode::kNotFound) {
      listed = dirs.status();
    }
    text = j.dump();
  }
  RETURN_IF_ERROR(BroadcastStatus(comm, listed, 0), "resume: listing ", root);
  int64_t size = static_cast<int64_t>(text.size());
  RETURN_IF_ERROR(comm->Broadcast(&size, sizeof(size), DType::kBytes, 0), "resume");
  text.resize(static_cast<size_t>(size));
  RETURN_IF_ERROR(comm->Broadcast(text.data(), text.size(), DType::kBytes, 0), "resume");
  std::vector<Candidate> out;
  for (const auto& d : nlohmann::json::parse(text)) out.push_back({d[0].get<int64_t>(), false, d[1].get<std::string>()});
  return out;
}

// One list, newest first; a memory generation before a disk checkpoint of the same step (faster).
Result<std::vector<Candidate>> Candidates(Communicator* comm, const CheckpointOptions& where) {
  ASSIGN_OR_RETURN(std::vector<Candidate> all, DiskCandidates(comm, where.root));
  if (where.memory) {
    ASSIGN_OR_RETURN(const std::vector<int64_t> tier, TierCandidates(comm, where.root, *where.memory));
    for (int64_t s : tier) all.push_back({s, true, ""});
  }
  std::stable_sort(all.begin(), all.end(), [](const Candidate& a, const Candidate& b) {
    return a.step != b.step ? a.step > b.step : a.memory > b.memory;
  });
  return all;
}

// A disk candidate: rank 0's completeness check (every rank gets its verdict), then every rank's
// preparation, agreed; `mismatch` says the agreed failure is the model's on some rank.
Result<std::unique_ptr<internal::PreparedLoad>> Prepare(Communicator* comm, const std::string& dir, const StateView& target,
                                                        const ResumeOptions& o, bool* mismatch) {
  *mismatch = false;
  Status complete;
  if (comm->rank() == 0) {
    std::vector<std::string> problems;
    complete = CheckComplete(dir, VerifyLevel::kMetadata, &problems);
    if (complete.ok() && !problems.empty()) complete = DataLossError(dir, " is not complete: ", problems.front());
  }
  RETURN_IF_ERROR(BroadcastStatus(comm, complete, 0));
  bool mine = false;
  const bool world = target.has_own_groups();  // the same on every rank (the engine agreed at finalize)
  auto prepared = internal::PreparedLoad::Prepare(dir, target, o.load, &mine, world);
  Status agreed = AgreeOnStatus(comm, prepared.status());
  if (!agreed.ok()) {
    float any = mine ? 1.0f : 0.0f;
    RETURN_IF_ERROR(comm->AllReduce(&any, &any, 1, DType::kF32, ReduceOp::kMax), "resume");
    *mismatch = any > 0;
    return agreed;
  }
  if (world) {  // a tensor of the checkpoint is unexpected when no rank's model has it
    std::vector<float> claimed = (*prepared)->Claimed();
    RETURN_IF_ERROR(comm->AllReduce(claimed.data(), claimed.data(), claimed.size(), DType::kF32, ReduceOp::kMax), "resume");
    std::vector<std::string> unclaimed;
    size_t i = 0;
    for (const GroupEntry& ge : (*prepared)->manifest().groups) {
      for (const TensorEntry& te : ge.tensors) {
        if (claimed[i++] == 0) unclaimed.push_back(te.name);
      }
    }
    if (!unclaimed.empty() && o.load.strict) {
      *mismatch = true;
      return InvalidArgumentError("load: checkpoint ", dir, " has tensor '", unclaimed.front(), "'", unclaimed.size() > 1 ? " (and " + std::to_string(unclaimed.size() - 1) + " more)" : "",
                                  ", which no rank's model has (LoadOptions::strict = false ignores it)");
    }
    (*prepared)->AddUnexpected(std::move(unclaimed));
  }
  return prepared;
}

}  // namespace

Result<ResumeResult> Resume(Communicator* comm, const CheckpointOptions& where, const StateView& target, const ResumeOptions& o) {
  if (comm == nullptr) return InvalidArgumentError("resume: null communicator");
  ASSIGN_OR_RETURN(const std::vector<Candidate> candidates, Candidates(comm, where));
  if (candidates.empty()) return NotFoundError("resume: no checkpoint under ", where.root, where.memory ? " or in its memory tier" : "");
  ResumeResult r;
  for (const Candidate& c : candidates) {
    const std::string what = c.memory ? "memory tier step " + std::to_string(c.step) : c.dir;
    std::string dir = c.dir;
    bool from_peer = false;
    Result<LoadResult> loaded = InternalError("resume: not loaded");
    if (c.memory) {
      loaded = LoadFromTier(comm, where.root, *where.memory, c.step, target, o.load, &dir, &from_peer);
    } else {
      bool mismatch = false;
      auto prepared = Prepare(comm, dir, target, o, &mismatch);
      if (!prepared.ok() && mismatch) {
        return InvalidArgumentError("resume: ", what, " does not fit the model (a configuration mistake; nothing was loaded): ",
                                    prepared.status().message());
      }
      loaded = prepared.ok() ? (*prepared)->Fill() : Result<LoadResult>(prepared.status());
    }
    // Every rank goes on, or every rank falls back: never a rank alone in the next collective.
    Status agreed = AgreeOnStatus(comm, loaded.status());
    if (!agreed.ok()) {
      const std::string why = what + ": " + std::string(agreed.message());
      if (comm->rank() == 0) ZRT_LOG(kWarn) << "resume: cannot load " << why << "; trying an older checkpoint";
      r.skipped.push_back(why);
      continue;
    }
    r.dir = dir;
    r.step = c.step;
    r.source = !c.memory ? "disk" : from_peer ? "peer" : "memory";
    r.loaded = std::move(*loaded);
    if (comm->rank() == 0) {
      for (const auto* list : {&r.loaded.missing, &r.loaded.unexpected, &r.loaded.mismatched}) {
        for (const std::string& m : *list) ZRT_LOG(kWarn) << "resume (not strict) from " << what << ": " << m;
      }
      ZRT_LOG(kInfo) << "resume: from " << what;
    }
    RETURN_IF_ERROR(target.Restore(r.loaded.counters), "resume from ", what);
    return r;
  }
  std::string why;
  for (const std::string& s : r.skipped) why += "\n  " + s;
  return DataLossError("resume: none of the ", candidates.size(), " checkpoints", where.memory ? " (memory tier and disk)" : "", " under ",
                       where.root, " could be loaded on every rank; the state may be partly overwritten:", why);
}

}  // namespace zrt::ckpt
