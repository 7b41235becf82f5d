#include "zrt/checkpoint/catalog.h"

#include <algorithm>
#include <filesystem>

#include "zrt/checkpoint/files.h"
#include "zrt/core/logging.h"

namespace zrt::ckpt {

namespace fs = std::filesystem;

Result<std::vector<CheckpointInfo>> ListCheckpoints(const std::string& root, VerifyLevel level) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return NotFoundError(root, ": no such checkpoint root directory");
  std::vector<CheckpointInfo> out;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    if (!e.is_directory()) continue;
    const std::string name = e.path().filename().string();
    const size_t tmp = name.find(".tmp-");
    auto step = ParseStepDirName(tmp == std::string::npos ? name : name.substr(0, tmp));
    if (!step.ok()) continue;
    CheckpointInfo info;
    info.dir = e.path().string();
    info.step = *step;
    for (const auto& f : fs::directory_iterator(e.path(), ec)) {
      if (f.is_regular_file()) info.bytes += static_cast<int64_t>(f.file_size());
    }
    if (auto m = ReadManifest(info.dir); m.ok()) {
      info.world_size = m->world_size;
      info.stage = m->stage;
      info.created_unix = m->created_unix;
    }
    if (tmp != std::string::npos) {
      info.in_progress = true;
      info.problem = "being written, or a save that died (removed at the next start)";
    } else {
      std::vector<std::string> problems;
      Status s = CheckComplete(info.dir, level, &problems);
      info.complete = s.ok() && problems.empty();
      if (!s.ok()) info.problem = std::string(s.message());
      if (!problems.empty()) info.problem = problems.front() + (problems.size() > 1 ? ::zrt::internal::StrCat(" (+", problems.size() - 1, " more)") : "");
    }
    out.push_back(std::move(info));
  }
  if (ec) return ErrnoStatus(ec.value(), "listing " + root);
  std::sort(out.begin(), out.end(), [](const CheckpointInfo& a, const CheckpointInfo& b) {
    return a.step != b.step ? a.step > b.step : a.complete > b.complete;
  });
  return out;
}

Result<std::string> FindLatestComplete(const std::string& root, VerifyLevel level) {
  ASSIGN_OR_RETURN(auto list, ListCheckpoints(root, level));
  std::string skipped;
  for (const CheckpointInfo& c : list) {
    if (c.complete) {
      if (!skipped.empty()) ZRT_LOG(kWarn) << "checkpoint: skipped newer incomplete ones:" << skipped;
      return c.dir;
    }
    skipped += " " + fs::path(c.dir).filename().string() + " (" + c.problem + ")";
  }
  return NotFoundError("no complete checkpoint under ", root, skipped.empty() ? "" : ":" + skipped);
}

}  // namespace zrt::ckpt
