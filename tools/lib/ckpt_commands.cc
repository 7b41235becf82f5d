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
#include "zrt/checkpoint/files.h"
#include "zrt/checkpoint/interchange/hdf5_io.h"
#include "zrt/checkpoint/interchange/reshard.h"
#include "zrt/checkpoint/interchange/safetensors.h"
#include "zrt/checkpoint/verify.h"
#include "zrt/checkpoint/whole_group.h"
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

struct Stats {
  double min = std::numeric_limits<double>::infinity(), max = -std::numeric_limits<double>::infinity();
  double sum = 0, sumsq = 0;
  int64_t n = 0, nan = 0, inf = 0;
  void Add(float x) {
    if (std::isnan(x)) return void(++nan);
    if (std::isinf(x)) return void(++inf);
    min = std::min(min, static_cast<double>(x));
    max = std::max(max, static_cast<double>(x));
    sum += x;
    sumsq += static_cast<double>(x) * x;
    ++n;
  }
  double mean() const { return n ? sum / n : 0; }
  double stddev() const { return n ? std::sqrt(std::max(0.0, sumsq / n - mean() * mean())) : 0; }
};

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

Status CkptInspect(const std::string& dir, const std::string& tensor, bool stats, bool as_json, std::ostream& out) {
  // Everything below trusts the checkpoint's structure: it must be complete first.
  std::vector<std::string> problems;
  RETURN_IF_ERROR(CheckComplete(dir, VerifyLevel::kMetadata, &problems), "inspect");
  if (!problems.empty()) return DataLossError("inspect: ", dir, " is not a complete checkpoint: ", problems.front());
  ASSIGN_OR_RETURN(CheckpointDir cd, CheckpointDir::Open(dir), "inspect");
  ASSIGN_OR_RETURN(Manifest m, ReadManifest(cd), "inspect");
  ASSIGN_OR_RETURN(const std::vector<ShardLayout> layouts, SavedLayouts(m), "inspect");
  // Stored vs raw bytes per kind, from the indexes.
  std::map<std::string, std::pair<int64_t, int64_t>> ratio;
  for (int r = 0; r < m.shards; ++r) {
    ASSIGN_OR_RETURN(RankIndex idx, ReadIndex(cd, m, layouts, r), "inspect");
    for (const ChunkEntry& c : idx.chunks) {
      auto& [raw, stored] = ratio[m.groups[static_cast<size_t>(c.group)].kinds[static_cast<size_t>(c.kind)]];
      raw += c.elements * 4;
      stored += c.stored_bytes;
    }
  }
  json j;
  j["dir"] = dir;
  j["format_version"] = kFormatVersion;
  j["step"] = m.step;
  j["world_size"] = m.world_size;
  j["shards"] = m.shards;
  j["stage"] = m.stage;
  j["zrt_version"] = m.zrt_version;
  j["trainer_state"] = m.trainer_state;
  j["engine_state"] = m.engine_state;
  j["loss_scale"] = m.loss_scale;
  for (const auto& [kind, rs] : ratio) j["compression"][kind] = {{"raw_bytes", rs.first}, {"stored_bytes", rs.second}};
  json groups = json::array();
  for (int g = 0; g < static_cast<int>(m.groups.size()); ++g) {
    const GroupEntry& ge = m.groups[static_cast<size_t>(g)];
    ASSIGN_OR_RETURN(ShardLayout l, SavedLayout(m, g));
    json jg = {{"name", ge.name}, {"lr", ge.lr}, {"weight_decay", ge.weight_decay}, {"kinds", ge.kinds},
               {"padded_size", l.padded_size()}, {"shard_size", l.shard_size()}};
    // Layout per rank: its flat range and the tensors (pieces) it holds.
    json ranks = json::array();
    for (int r = 0; r < m.shards && r < 64; ++r) {
      json pieces = json::array();
      for (const ShardPiece& p : l.RankPieces(r)) {
        pieces.push_back({{"tensor", ge.tensors[static_cast<size_t>(p.tensor)].name}, {"tensor_offset", p.tensor_offset},
                          {"shard_offset", p.shard_offset}, {"count", p.count}});
      }
      ranks.push_back({{"rank", r}, {"begin", l.shard_begin(r)}, {"end", l.shard_end(r)}, {"pieces", std::move(pieces)}});
    }
    jg["ranks"] = std::move(ranks);
    std::vector<std::string> kinds = {"master"};
    std::unique_ptr<WholeGroup> gv;
    json tensors = json::array();
    for (size_t t = 0; t < ge.tensors.size(); ++t) {
      const TensorEntry& te = ge.tensors[t];
      if (!tensor.empty() && te.name.find(tensor) == std::string::npos) continue;
      json jt = {{"name", te.name}, {"shape", te.shape}, {"dtype", DTypeName(te.dtype)}, {"numel", te.numel},
                 {"bytes", te.numel * static_cast<int64_t>(DTypeSize(te.dtype))}, {"offset", te.offset}};
      if (stats) {
        if (!gv) {
          ASSIGN_OR_RETURN(WholeGroup loaded, LoadWholeGroup(dir, m, g, kinds), "inspect --stats");
          gv = std::make_unique<WholeGroup>(std::move(loaded));
        }
        Stats s;
        const float* p = gv->data[0].data() + gv->view.groups[0].layout.tensor_offset(static_cast<int64_t>(t));
        for (int64_t i = 0; i < te.numel; ++i) s.Add(p[i]);
        jt["stats"] = {{"min", s.n ? s.min : 0.0}, {"max", s.n ? s.max : 0.0}, {"mean", s.mean()}, {"std", s.stddev()},
                       {"l2", std::sqrt(s.sumsq)}, {"nan", s.nan}, {"inf", s.inf}};
      }
      tensors.push_back(std::move(jt));
    }
    jg["tensors"] = std::move(tensors);
    groups.push_back(std::move(jg));
  }
  j["groups"] = std::move(groups);
  if (as_json) {
    out << j.dump(1) << "\n";
    return Status();
  }
  out << "checkpoint " << dir << "\n  format v" << kFormatVersion << ", step " << m.step << ", saved by " << m.world_size
      << " rank(s) at stage " << m.stage << " (" << m.shards << " shard file(s)), zrt " << m.zrt_version << "\n";
  out << "  trainer state: " << m.trainer_state.dump() << "\n";
  if (!m.engine_state.empty()) {  // in full with --json; untrusted: shown only where the types are right
    const json& es = m.engine_state;
    auto shown = [](const json& o, const char* key) {
      return o.is_object() && o.contains(key) && (o[key].is_number() || o[key].is_string()) ? o[key].dump() : std::string("?");
    };
    out << "  engine state: lr " << shown(es, "lr");
    if (es.contains("lr_schedule")) {
      const json& sc = es["lr_schedule"];
      out << ", schedule " << shown(sc, "kind") << " (warmup " << shown(sc, "warmup_steps") << ", total " << shown(sc, "total_steps")
          << ", floor " << shown(sc, "min_lr_ratio") << ")";
    }
    out << ", weight decay " << shown(es, "weight_decay") << ", "
        << (es.contains("tensors") && es["tensors"].is_object() ? es["tensors"].size() : 0) << " tensor(s) with their own settings\n";
  }
  for (const auto& [kind, rs] : ratio) {
    out << "  " << std::left << std::setw(16) << kind << std::right << FormatBytes(rs.first) << " -> " << FormatBytes(rs.second)
        << std::fixed << std::setprecision(2) << "  (ratio " << (rs.second ? static_cast<double>(rs.first) / rs.second : 0.0) << ")\n"
        << std::defaultfloat << std::setprecision(6);
  }
  for (const json& jg : j["groups"]) {
    out << "  group '" << jg["name"].get<std::string>() << "': lr " << jg["lr"].get<double>() << ", " << jg["tensors"].size()
        << " tensor(s), padded " << jg["padded_size"].get<int64_t>() << " elements, " << m.shards << " x "
        << jg["shard_size"].get<int64_t>() << " per shard\n";
    for (const json& jr : jg["ranks"]) {
      out << "    rank " << jr["rank"].get<int>() << ": [" << jr["begin"].get<int64_t>() << ", " << jr["end"].get<int64_t>() << ")";
      for (const json& p : jr["pieces"]) {
        out << "  " << p["tensor"].get<std::string>() << "[" << p["tensor_offset"].get<int64_t>() << ".."
            << p["tensor_offset"].get<int64_t>() + p["count"].get<int64_t>() << ")";
      }
      out << "\n";
    }
    if (m.shards > 64) out << "    (" << m.shards - 64 << " more ranks)\n";
    for (const json& jt : jg["tensors"]) {
      std::ostringstream shape;
      shape << jt["shape"].dump();
      out << "    " << std::left << std::setw(24) << jt["name"].get<std::string>() << std::setw(18) << shape.str() << std::setw(6)
          << jt["dtype"].get<std::string>() << std::right << std::setw(12) << FormatBytes(jt["bytes"].get<int64_t>());
      if (jt.contains("stats")) {
        const json& s = jt["stats"];
        out << std::scientific << std::setprecision(3) << "  min " << s["min"].get<double>() << " max " << s["max"].get<double>()
            << " mean " << s["mean"].get<double>() << " std " << s["std"].get<double>() << " l2 " << s["l2"].get<double>()
            << " nan " << s["nan"].get<int64_t>() << " inf " << s["inf"].get<int64_t>() << std::defaultfloat;
      }
      out << "\n";
    }
  }
  return Status();
}

Status CkptVerify(const std::string& dir, bool as_json, std::ostream& out) {
  std::vector<std::string> problems;
  RETURN_IF_ERROR(CheckComplete(dir, VerifyLevel::kFull, &problems, TtyProgress("verifying")), "verify");
  int64_t chunks = 0;
  if (problems.empty()) {
    ASSIGN_OR_RETURN(CheckpointDir cd, CheckpointDir::Open(dir));
    ASSIGN_OR_RETURN(Manifest m, ReadManifest(cd));
    ASSIGN_OR_RETURN(const std::vector<ShardLayout> layouts, SavedLayouts(m));
    for (int r = 0; r < m.shards; ++r) {
      ASSIGN_OR_RETURN(RankIndex idx, ReadIndex(cd, m, layouts, r));
      chunks += static_cast<int64_t>(idx.chunks.size());
    }
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

Status CkptDiff(const std::string& a, const std::string& b, bool as_json, std::ostream& out) {
  ASSIGN_OR_RETURN(Manifest ma, ReadManifest(a), "diff");
  ASSIGN_OR_RETURN(Manifest mb, ReadManifest(b), "diff");
  json rows = json::array();
  int64_t differing = 0, total = 0, done = 0;
  for (const GroupEntry& ge : ma.groups) {
    for (const TensorEntry& te : ge.tensors) total += 2 * 4 * te.numel * static_cast<int64_t>(ge.kinds.size());
  }
  const ProgressFn progress = TtyProgress("comparing");
  for (int g = 0; g < static_cast<int>(ma.groups.size()); ++g) {
    const GroupEntry& ge = ma.groups[static_cast<size_t>(g)];
    if (progress) {
      for (const TensorEntry& te : ge.tensors) done += 2 * 4 * te.numel * static_cast<int64_t>(ge.kinds.size());
    }
    ASSIGN_OR_RETURN(WholeGroup va, LoadWholeGroup(a, ma, g, ge.kinds), "diff: ", a);
    ASSIGN_OR_RETURN(WholeGroup vb, LoadWholeGroup(b, ma, g, ge.kinds), "diff: ", b);  // matched by tensor name
    for (size_t t = 0; t < ge.tensors.size(); ++t) {
      for (size_t k = 0; k < ge.kinds.size(); ++k) {
        const int64_t off = va.view.groups[0].layout.tensor_offset(static_cast<int64_t>(t));
        // NaN equals NaN and an infinity its own sign (the same value stored); anything else that is
        // not equal differs, a NaN or infinity against a number by an infinite amount.
        double max_abs = 0, max_rel = 0;
        int64_t elements_differing = 0;
        for (int64_t i = 0; i < ge.tensors[t].numel; ++i) {
          const double x = va.data[k][static_cast<size_t>(off + i)], y = vb.data[k][static_cast<size_t>(off + i)];
          if (x == y || (std::isnan(x) && std::isnan(y))) continue;
          ++elements_differing;
          const double d = std::isfinite(x) && std::isfinite(y) ? std::abs(x - y) : std::numeric_limits<double>::infinity();
          max_abs = std::max(max_abs, d);
          max_rel = std::max(max_rel, std::isfinite(d) ? d / std::max({std::abs(x), std::abs(y), 1e-30}) : d);
        }
        differing += elements_differing;
        rows.push_back({{"tensor", ge.tensors[t].name}, {"kind", ge.kinds[k]}, {"max_abs", max_abs}, {"max_rel", max_rel},
                        {"elements_differing", elements_differing}});
      }
    }
    if (progress) progress(done, total);
  }
  if (as_json) {
    json j = {{"a", a}, {"b", b}, {"step_a", ma.step}, {"step_b", mb.step}, {"identical", differing == 0},
              {"elements_differing", differing}, {"tensors", rows}};
    // JSON has no infinity: an infinite difference is written as the string "inf".
    for (json& r : j["tensors"]) {
      for (const char* f : {"max_abs", "max_rel"}) {
        if (!std::isfinite(r[f].get<double>())) r[f] = "inf";
      }
    }
    out << j.dump(1) << "\n";
  } else {
    out << "diff " << a << " (step " << ma.step << ") vs " << b << " (step " << mb.step << ")\n";
    for (const json& r : rows) {
      out << "  " << std::left << std::setw(24) << r["tensor"].get<std::string>() << std::setw(16) << r["kind"].get<std::string>()
          << std::right << std::scientific << std::setprecision(3) << " max abs " << r["max_abs"].get<double>() << "  max rel "
          << r["max_rel"].get<double>() << std::defaultfloat << "  (" << r["elements_differing"].get<int64_t>() << " differ)\n";
    }
    out << (differing == 0 ? "identical\n" : "differ\n");
  }
  if (differing != 0) return DataLossError("diff: ", differing, " elements differ between ", a, " and ", b);
  return Status();
}

}  // namespace zrt::tools
