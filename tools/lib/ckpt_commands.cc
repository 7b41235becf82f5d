#include "tools/lib/ckpt_commands.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <iomanip>
#include <limits>
#include <map>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include <unistd.h>

#include "zrt/checkpoint/catalog.h"
#include "zrt/checkpoint/format.h"
#include "zrt/checkpoint/interchange/interchange.h"
#include "zrt/checkpoint/interchange/safetensors.h"
#include "zrt/checkpoint/tensor_reader.h"
#include "zrt/core/device.h"

namespace zrt::tools {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace zrt::ckpt;

namespace {

std::string Age(int64_t created) {
  if (created <= 0) return "-";
  const int64_t s = static_cast<int64_t>(std::time(nullptr)) - created;
  std::ostringstream os;
  if (s < 120) os << s << "s";
  else if (s < 7200) os << s / 60 << "m";
  else if (s < 172800) os << s / 3600 << "h";
  else os << s / 86400 << "d";
  return os.str();
}

}  // namespace

namespace {

// The interchange format of a path: --format when given, else the name's extension (.h5/.hdf5 is
// HDF5; .safetensors, a safetensors index or a directory is safetensors).
Result<std::string> FormatOf(const std::string& path, const std::string& given, const char* what) {
  if (!given.empty()) {
    if (given != "hdf5" && given != "safetensors") return InvalidArgumentError(what, ": --format must be hdf5 or safetensors, got '", given, "'");
    return given;
  }
  const std::string ext = fs::path(path).extension().string();
  if (ext == ".h5" || ext == ".hdf5") return std::string("hdf5");
  std::error_code ec;
  if (ext == ".safetensors" || ext == ".json" || fs::is_directory(path, ec)) return std::string("safetensors");
  return InvalidArgumentError(what, ": cannot tell the format of '", path, "' from its name (.h5, .safetensors): give --format");
}

Result<NameMap> NamesOf(const std::string& name_map, const std::vector<std::string>& renames) {
  NameMap names;
  if (!name_map.empty()) {
    ASSIGN_OR_RETURN(names, NameMap::FromJsonFile(name_map));
  }
  for (const std::string& r : renames) RETURN_IF_ERROR(names.AddRule(r));
  return names;
}

}  // namespace

// A progress bar on stderr when it is a terminal; nothing otherwise (logs, pipes, tests). In bytes.
ProgressFn TtyProgress(const std::string& what) {
  if (!::isatty(STDERR_FILENO)) return nullptr;
  return [what](int64_t done, int64_t total) {
    const int width = 30, filled = total > 0 ? static_cast<int>(width * done / total) : width;
    std::fprintf(stderr, "\r%s [%s%s] %s / %s   ", what.c_str(), std::string(static_cast<size_t>(filled), '#').c_str(),
                 std::string(static_cast<size_t>(width - filled), ' ').c_str(), FormatBytes(done).c_str(), FormatBytes(total).c_str());
    if (done >= total) std::fprintf(stderr, "\n");
  };
}


Status CkptExport(const std::string& dir, const std::string& out_path, const ExportArgs& a, std::ostream& out) {
  ASSIGN_OR_RETURN(std::string format, FormatOf(out_path, a.format, "export"));
  if (a.states != "params" && a.states != "all") return InvalidArgumentError("export: --states must be params or all, got '", a.states, "'");
  std::optional<DType> dtype;
  if (!a.dtype.empty() && a.dtype != "model") {
    Result<DType> d = ParseDType(a.dtype);
    if (!d.ok() || (*d != DType::kF32 && *d != DType::kBF16 && *d != DType::kF16)) {
      return InvalidArgumentError("export: --dtype must be model, f32, bf16 or f16, got '", a.dtype, "'");
    }
    dtype = *d;
  }
  if (format == "hdf5") {
    if (!a.name_map.empty() || !a.renames.empty()) return InvalidArgumentError("export: --name-map and --rename apply to safetensors");
    if (dtype == DType::kF16 || a.dtype == "model") return InvalidArgumentError("export: HDF5 export writes f32 or bf16");
    ExportOptions o;
    o.all_states = a.states == "all";
    o.dtype = dtype.value_or(DType::kF32);
    RETURN_IF_ERROR(ExportHdf5(dir, out_path, o, TtyProgress("exporting")));
  } else {
    SafetensorsExportOptions o;
    o.all_states = a.states == "all";
    o.dtype = dtype;
    if (a.max_shard_bytes > 0) o.max_shard_bytes = a.max_shard_bytes;
    ASSIGN_OR_RETURN(o.names, NamesOf(a.name_map, a.renames), "export");
    RETURN_IF_ERROR(ExportSafetensors(dir, out_path, o, TtyProgress("exporting")));
  }
  if (a.json) {
    out << json{{"command", "export"}, {"checkpoint", dir}, {"output", out_path}, {"format", format}, {"states", a.states},
                {"dtype", a.dtype.empty() ? (format == "hdf5" || a.states == "all" ? "f32" : "model") : a.dtype}}.dump(1) << "\n";
  } else {
    out << "exported " << dir << " -> " << out_path << " (" << format << ", " << a.states << ")\n";
  }
  return Status();
}

Status CkptImport(const std::string& in_path, const std::string& out_root, const ImportArgs& a, std::ostream& out) {
  ASSIGN_OR_RETURN(std::string format, FormatOf(in_path, a.format, "import"));
  ImportOptions o;
  o.world_size = a.world_size;
  o.stage = a.stage;
  if (format == "hdf5") {
    if (!a.name_map.empty() || !a.renames.empty()) return InvalidArgumentError("import: --name-map and --rename apply to safetensors");
    RETURN_IF_ERROR(ImportHdf5(in_path, out_root, o, TtyProgress("importing")));
  } else {
    ASSIGN_OR_RETURN(NameMap names, NamesOf(a.name_map, a.renames), "import");
    RETURN_IF_ERROR(ImportSafetensors(in_path, out_root, o, names, TtyProgress("importing")));
  }
  ASSIGN_OR_RETURN(auto list, ListCheckpoints(out_root));
  const std::string made = list.empty() ? out_root : list.front().dir;
  if (a.json) {
    out << json{{"command", "import"}, {"input", in_path}, {"format", format}, {"checkpoint", made}, {"world_size", a.world_size},
                {"stage", a.stage}}.dump(1) << "\n";
  } else {
    out << "imported " << in_path << " -> " << made << " (" << format << ", " << a.world_size << " ranks, stage " << a.stage << ")\n";
  }
  return Status();
}

Status CkptLs(const std::string& root, bool as_json, std::ostream& out) {
  ASSIGN_OR_RETURN(auto list, ListCheckpoints(root));
  if (as_json) {
    json j = json::array();
    for (const auto& c : list) {
      j.push_back({{"dir", c.dir}, {"step", c.step}, {"complete", c.complete}, {"in_progress", c.in_progress},
                   {"problem", c.problem}, {"world_size", c.world_size}, {"stage", c.stage}, {"bytes", c.bytes},
                   {"created_unix", c.created_unix}});
    }
    out << j.dump(1) << "\n";
    return Status();
  }
  if (list.empty()) {
    out << "no checkpoints under " << root << "\n";
    return Status();
  }
  out << std::left << std::setw(36) << "checkpoint" << std::setw(12) << "status" << std::right << std::setw(9) << "step"
      << std::setw(7) << "ranks" << std::setw(7) << "stage" << std::setw(13) << "size" << std::setw(7) << "age" << "  problem\n";
  for (const auto& c : list) {
    out << std::left << std::setw(36) << fs::path(c.dir).filename().string() << std::setw(12)
        << (c.complete ? "complete" : c.in_progress ? "in progress" : "INCOMPLETE") << std::right << std::setw(9) << c.step
        << std::setw(7) << c.world_size << std::setw(7) << c.stage << std::setw(13) << FormatBytes(c.bytes) << std::setw(7)
        << Age(c.created_unix) << "  " << c.problem << "\n";
  }
  return Status();
}

Status CkptVerify(const std::string& dir, bool as_json, std::ostream& out) {
  std::vector<std::string> problems;
  RETURN_IF_ERROR(CheckComplete(dir, VerifyLevel::kFull, &problems, TtyProgress("verifying")), "verify");
  int64_t chunks = 0;
  if (problems.empty()) {
    ASSIGN_OR_RETURN(std::unique_ptr<TensorReader> reader, TensorReader::Open(dir));
    ASSIGN_OR_RETURN(const TensorReader::Stored stored, reader->StoredBytes());
    chunks = stored.chunks;
  }
  if (as_json) {
    out << json{{"dir", dir}, {"ok", problems.empty()}, {"problems", problems}, {"chunks_verified", chunks}}.dump(1) << "\n";
  } else if (problems.empty()) {
    out << "OK: " << dir << ": manifest, indexes and " << chunks << " chunks verified\n";
  } else {
    for (const std::string& p : problems) out << "BAD: " << p << "\n";
  }
  if (!problems.empty()) return DataLossError(dir, ": ", problems.size(), " problem(s): ", problems.front());
  return Status();
}

Result<std::string> ResolveCheckpointDir(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec) || fs::exists(fs::path(path) / "manifest.json", ec)) return path;
  ASSIGN_OR_RETURN(auto list, ListCheckpoints(path));
  if (list.empty()) return NotFoundError(path, " holds no manifest.json and no checkpoints (not a checkpoint directory or root)");
  for (const auto& c : list) {
    if (c.complete) return c.dir;
  }
  return NotFoundError(path, " is a checkpoint root with no complete checkpoint (`zrt ckpt ls ", path, "` says why)");
}

Status CkptReshard(const std::string& dir, const std::string& out_root, int world_size, std::ostream& out, int stage,
                   int threads, bool as_json) {
  ReshardOptions o;
  o.world_size = world_size;
  o.stage = stage;
  o.threads = threads;
  o.progress = TtyProgress("resharding");
  ASSIGN_OR_RETURN(std::string final_dir, Reshard(dir, out_root, o));
  ASSIGN_OR_RETURN(Manifest m, ReadManifest(dir));
  if (as_json) {
    out << json{{"command", "reshard"}, {"checkpoint", dir}, {"output", final_dir}, {"world_size_before", m.world_size},
                {"world_size", world_size}}.dump(1) << "\n";
  } else {
    out << "resharded " << dir << " (" << m.world_size << " ranks) -> " << final_dir << " (" << world_size << " ranks)\n";
  }
  return Status();
}

}  // namespace zrt::tools
