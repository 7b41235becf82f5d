#include "zrt/checkpoint/catalog.h"

#include <algorithm>
#include <filesystem>

#include "zrt/checkpoint/files.h"
#include "zrt/core/logging.h"

namespace zrt::ckpt {

namespace fs = std::filesystem;

Result<std::vector<StepDir>> ListStepDirs(const std::string& root) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return NotFoundError(root, ": no such checkpoint root directory");
  std::vector<StepDir> out;
  fs::directory_iterator it(root, ec);
  if (ec) return ErrnoStatus(ec.value(), "listing " + root);
  // Entries may vanish while we look (a job's commit renames, retention deletes): skipped, not errors.
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) break;
    std::error_code entry_ec;
    if (it->symlink_status(entry_ec).type() != fs::file_type::directory) continue;
    const std::string name = it->path().filename().string();
    const size_t tmp = name.find(".tmp");
    auto step = ParseStepDirName(tmp == std::string::npos ? name : name.substr(0, tmp));
    if (step.ok() && (tmp == std::string::npos || name.compare(tmp, std::string::npos, ".tmp") == 0 || name.compare(tmp, 5, ".tmp-") == 0)) {
      out.push_back({*step, it->path().string(), tmp != std::string::npos});
    }
  }
  if (ec && ec != std::errc::no_such_file_or_directory) return ErrnoStatus(ec.value(), "listing " + root);
  std::sort(out.begin(), out.end(), [](const StepDir& a, const StepDir& b) {
    return a.step != b.step ? a.step > b.step : a.in_progress < b.in_progress;
  });
  return out;
}

Result<std::vector<CheckpointInfo>> ListCheckpoints(const std::string& root, VerifyLevel level) {
  ASSIGN_OR_RETURN(const std::vector<StepDir> dirs, ListStepDirs(root));
  std::vector<CheckpointInfo> out;
  for (const StepDir& sd : dirs) {
    CheckpointInfo info;
    info.dir = sd.dir;
    info.step = sd.step;
    std::error_code ec;
    for (fs::directory_iterator f(sd.dir, ec); !ec && f != fs::directory_iterator(); f.increment(ec)) {
      std::error_code size_ec;
      if (f->symlink_status(size_ec).type() != fs::file_type::regular) continue;
      const auto size = f->file_size(size_ec);
      if (!size_ec) info.bytes += static_cast<int64_t>(size);
    }
    if (auto m = ReadManifest(info.dir); m.ok()) {
      info.world_size = m->world_size;
      info.stage = m->stage;
      info.created_unix = m->created_unix;
    }
    if (sd.in_progress) {
      info.in_progress = true;
      info.problem = "being written, or a save that died (removed at the next start)";
    } else {
      std::vector<std::string> problems;
      Status s = CheckComplete(info.dir, level, &problems);
      if (s.code() == StatusCode::kNotFound) continue;  // gone meanwhile
      info.complete = s.ok() && problems.empty();
      if (!s.ok()) info.problem = std::string(s.message());
      if (!problems.empty()) info.problem = problems.front() + (problems.size() > 1 ? ::zrt::internal::StrCat(" (+", problems.size() - 1, " more)") : "");
    }
    out.push_back(std::move(info));
  }
  std::stable_sort(out.begin(), out.end(), [](const CheckpointInfo& a, const CheckpointInfo& b) {
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
