// Resume: the agreed candidate list, then load -> agree -> (fall back | restore), as resume.h says.
#include "zrt/checkpoint/resume.h"

#include <filesystem>

#include <nlohmann/json.hpp>

#include "zrt/checkpoint/catalog.h"
#include "zrt/checkpoint/format.h"
#include "zrt/core/logging.h"

namespace zrt::ckpt {

namespace {

// Rank 0's list of complete checkpoints, newest first, on every rank (one size, one byte broadcast).
Result<std::vector<std::string>> AgreedCandidates(Communicator* comm, const std::string& root) {
  std::string text;
  Status listed;
  if (comm->rank() == 0) {
    auto list = ListCheckpoints(root, VerifyLevel::kMetadata);
    nlohmann::json j = nlohmann::json::array();
    if (list.ok()) {
      for (const CheckpointInfo& c : *list) {
        if (c.complete) {
          j.push_back(c.dir);
        } else if (!c.in_progress) {
          ZRT_LOG(kWarn) << "resume: skipping " << c.dir << ": " << c.problem;
        }
      }
    } else if (list.status().code() != StatusCode::kNotFound) {
      listed = list.status();
    }
    text = j.dump();
  }
  RETURN_IF_ERROR(BroadcastStatus(comm, listed, 0), "resume: listing ", root);
  int64_t size = static_cast<int64_t>(text.size());
  RETURN_IF_ERROR(comm->Broadcast(&size, sizeof(size), DType::kBytes, 0), "resume");
  text.resize(static_cast<size_t>(size));
  RETURN_IF_ERROR(comm->Broadcast(text.data(), text.size(), DType::kBytes, 0), "resume");
  std::vector<std::string> out;
  for (const auto& d : nlohmann::json::parse(text)) out.push_back(d.get<std::string>());
  return out;
}

}  // namespace

Result<ResumeResult> Resume(Communicator* comm, const std::string& root, const StateView& target, const ResumeOptions& o) {
  if (comm == nullptr) return InvalidArgumentError("resume: null communicator");
  ASSIGN_OR_RETURN(const std::vector<std::string> disk, AgreedCandidates(comm, root));
  std::vector<int64_t> tier;
  if (o.memory) {
    ASSIGN_OR_RETURN(tier, TierCandidates(comm, root, *o.memory));
  }
  // One list, newest first; a memory generation before a disk checkpoint of the same step (faster).
  struct Candidate {
    int64_t step;
    bool memory;
    std::string dir;
  };
  std::vector<Candidate> candidates;
  for (int64_t s : tier) candidates.push_back({s, true, ""});
  for (const std::string& d : disk) {
    auto step = ParseStepDirName(std::filesystem::path(d).filename().string());
    candidates.push_back({step.ok() ? *step : -1, false, d});
  }
  std::stable_sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
    return a.step != b.step ? a.step > b.step : a.memory > b.memory;
  });
  if (candidates.empty()) return NotFoundError("resume: no complete checkpoint under ", root);
  ResumeResult r;
  for (const Candidate& c : candidates) {
    std::string dir = c.dir;
    bool from_peer = false;
    Result<LoadResult> loaded =
        c.memory ? LoadFromTier(comm, root, *o.memory, c.step, target, o.load, &dir, &from_peer) : Load(dir, target, o.load);
    // Every rank goes on, or every rank falls back: never a rank alone in the next collective.
    Status agreed = AgreeOnStatus(comm, loaded.status());
    const std::string what = c.memory ? "memory tier step " + std::to_string(c.step) : dir;
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
  return DataLossError("resume: none of the ", candidates.size(), " checkpoints", o.memory ? " (memory tier and disk)" : "", " under ", root,
                       " could be loaded on every rank; the state may be partly overwritten:", why);
}

}  // namespace zrt::ckpt
