// `zrt ckpt inspect` and `zrt ckpt diff` (ckpt_commands.h), on the public reader (tensor_reader.h):
// one tensor in memory at a time.
#include <algorithm>
#include <cmath>
#include <iomanip>
#include <limits>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tools/lib/ckpt_commands.h"
#include "zrt/checkpoint/catalog.h"
#include "zrt/checkpoint/format.h"
#include "zrt/checkpoint/tensor_reader.h"
#include "zrt/core/device.h"

namespace zrt::tools {

using nlohmann::json;
using namespace zrt::ckpt;

namespace {

json StatsJson(const std::vector<float>& v) {
  double mn = std::numeric_limits<double>::infinity(), mx = -mn, sum = 0, sumsq = 0;
  int64_t n = 0, nan = 0, inf = 0;
  for (float x : v) {
    if (std::isnan(x)) {
      ++nan;
    } else if (std::isinf(x)) {
      ++inf;
    } else {
      mn = std::min(mn, static_cast<double>(x));
      mx = std::max(mx, static_cast<double>(x));
      sum += x;
      sumsq += static_cast<double>(x) * x;
      ++n;
    }
  }
  const double mean = n ? sum / n : 0;
  return {{"min", n ? mn : 0.0}, {"max", n ? mx : 0.0}, {"mean", mean}, {"std", n ? std::sqrt(std::max(0.0, sumsq / n - mean * mean)) : 0.0},
          {"l2", std::sqrt(sumsq)}, {"nan", nan}, {"inf", inf}};
}

bool Wanted(const std::string& name, const std::string& filter) { return filter.empty() || name.find(filter) != std::string::npos; }

// Group g as the manifest describes it, with its sizes, the layout per rank (the first 64 ranks; the
// pieces of the wanted tensors) and the wanted tensors with their bytes and, with `stats`, the
// statistics of their fp32 master weights (each tensor read on its own).
Result<json> GroupJson(TensorReader& reader, const json& manifest_group, int g, const std::string& filter, bool stats) {
  const GroupEntry& ge = reader.manifest().groups[static_cast<size_t>(g)];
  const ShardLayout& l = reader.layout(g);
  json jg = manifest_group;
  jg["padded_size"] = l.padded_size();
  jg["shard_size"] = l.shard_size();
  json ranks = json::array();
  for (int r = 0; r < l.world_size() && r < 64; ++r) {
    json pieces = json::array();
    for (const ShardPiece& p : l.RankPieces(r)) {
      const std::string& name = ge.tensors[static_cast<size_t>(p.tensor)].name;
      if (!Wanted(name, filter)) continue;
      pieces.push_back({{"tensor", name}, {"tensor_offset", p.tensor_offset}, {"shard_offset", p.shard_offset}, {"count", p.count}});
    }
    ranks.push_back({{"rank", r}, {"begin", l.shard_begin(r)}, {"end", l.shard_end(r)}, {"pieces", std::move(pieces)}});
  }
  jg["ranks"] = std::move(ranks);
  json tensors = json::array();
  for (size_t t = 0; t < ge.tensors.size(); ++t) {
    const TensorEntry& te = ge.tensors[t];
    if (!Wanted(te.name, filter)) continue;
    json jt = manifest_group["tensors"][t];
    jt["bytes"] = te.numel * static_cast<int64_t>(DTypeSize(te.dtype));
    if (stats) {
      std::vector<float> v(static_cast<size_t>(te.numel));
      RETURN_IF_ERROR(reader.Read(te.name, "master", 0, te.numel, v.data()), "inspect --stats");
      jt["stats"] = StatsJson(v);
    }
    tensors.push_back(std::move(jt));
  }
  jg["tensors"] = std::move(tensors);
  return jg;
}

std::string Shown(const json& o, const char* key) {  // untrusted: shown only where the types are right
  return o.is_object() && o.contains(key) && (o[key].is_number() || o[key].is_string()) ? o[key].dump() : std::string("?");
}

void PrintHeader(const json& j, std::ostream& out) {
  out << "checkpoint " << j["dir"].get<std::string>() << "\n  format v" << j["format_version"].get<int>() << ", step " << j["step"]
      << ", saved by " << j["world_size"] << " rank(s) at stage " << j["stage"] << " (" << j["shards"] << " shard(s)), zrt "
      << j["zrt_version"].get<std::string>() << "\n";
  const int world = j["world_size"].get<int>(), shards = j["shards"].get<int>(), parts = j.value("parts", 1);
  const std::string spread = parts > 1 ? "; each written in " + std::to_string(parts) + " parts by the ranks holding it" : "";
  if (j["stage"].get<int>() == 0) {
    out << "  mesh: one shard, held by every rank" << spread << "\n";
  } else if (shards < world) {
    out << "  mesh: hybrid sharding, " << world / shards << " replica group(s) of " << shards << " shard(s) (rank q held shard q % "
        << shards << "; each shard saved once" << spread << ")\n";
  } else {
    out << "  mesh: " << shards << " shard(s), one per rank\n";
  }
  out << "  trainer state: " << j["trainer_state"].dump() << "\n";
  const json& es = j["engine"]["state"];
  if (es.is_object() && !es.empty()) {
    out << "  engine state: lr " << Shown(es, "lr");
    if (es.contains("lr_schedule")) {
      const json& sc = es["lr_schedule"];
      out << ", schedule " << Shown(sc, "kind") << " (warmup " << Shown(sc, "warmup_steps") << ", total " << Shown(sc, "total_steps")
          << ", floor " << Shown(sc, "min_lr_ratio") << ")";
    }
    out << ", weight decay " << Shown(es, "weight_decay") << ", "
        << (es.contains("tensors") && es["tensors"].is_object() ? es["tensors"].size() : 0) << " tensor(s) with their own settings\n";
  }
  for (const auto& [kind, rs] : j["compression"].items()) {
    const int64_t raw = rs["raw_bytes"], stored = rs["stored_bytes"];
    out << "  " << std::left << std::setw(16) << kind << std::right << FormatBytes(raw) << " -> " << FormatBytes(stored) << std::fixed
        << std::setprecision(2) << "  (ratio " << (stored ? static_cast<double>(raw) / stored : 0.0) << ")\n"
        << std::defaultfloat << std::setprecision(6);
  }
}

void PrintGroup(const json& jg, int shards, std::ostream& out) {
  out << "  group '" << jg["name"].get<std::string>() << "': lr " << jg["lr"].get<double>() << ", " << jg["tensors"].size()
      << " tensor(s), padded " << jg["padded_size"].get<int64_t>() << " elements, " << shards << " x " << jg["shard_size"].get<int64_t>()
      << " per shard\n";
  if (jg.contains("files")) out << "    over a mesh of its own: shard i in file rank-<files[i]> of " << jg["files"].dump() << "\n";
  if (jg.contains("stored")) {  // compact state (checkpoint-format.md "Stored state")
    out << "    stored:";
    for (size_t k = 0; k < jg["kinds"].size(); ++k) out << " " << jg["kinds"][k].get<std::string>() << "=" << jg["stored"][k].get<std::string>();
    if (jg.contains("block")) out << " (blocks of " << jg["block"].get<int64_t>() << ")";
    out << "\n";
  }
  for (const json& jr : jg["ranks"]) {
    out << "    rank " << jr["rank"].get<int>() << ": [" << jr["begin"].get<int64_t>() << ", " << jr["end"].get<int64_t>() << ")";
    for (const json& p : jr["pieces"]) {
      const int64_t off = p["tensor_offset"];
      out << "  " << p["tensor"].get<std::string>() << "[" << off << ".." << off + p["count"].get<int64_t>() << ")";
    }
    out << "\n";
  }
  if (shards > 64) out << "    (" << shards - 64 << " more ranks)\n";
  for (const json& jt : jg["tensors"]) {
    out << "    " << std::left << std::setw(24) << jt["name"].get<std::string>() << std::setw(18) << jt["shape"].dump() << std::setw(6)
        << jt["dtype"].get<std::string>() << std::right << std::setw(12) << FormatBytes(jt["bytes"].get<int64_t>());
    if (jt.contains("stats")) {
      const json& s = jt["stats"];
      out << std::scientific << std::setprecision(3) << "  min " << s["min"].get<double>() << " max " << s["max"].get<double>() << " mean "
          << s["mean"].get<double>() << " std " << s["std"].get<double>() << " l2 " << s["l2"].get<double>() << " nan "
          << s["nan"].get<int64_t>() << " inf " << s["inf"].get<int64_t>() << std::defaultfloat;
    }
    out << "\n";
  }
}

}  // namespace

Status CkptInspect(const std::string& dir, const std::string& tensor, bool stats, bool as_json, std::ostream& out) {
  // Everything below trusts the checkpoint's structure: it must be complete first.
  std::vector<std::string> problems;
  RETURN_IF_ERROR(CheckComplete(dir, VerifyLevel::kMetadata, &problems), "inspect");
  if (!problems.empty()) return DataLossError("inspect: ", dir, " is not a complete checkpoint: ", problems.front());
  ASSIGN_OR_RETURN(std::unique_ptr<TensorReader> reader, TensorReader::Open(dir), "inspect");
  ASSIGN_OR_RETURN(const TensorReader::Stored stored, reader->StoredBytes(), "inspect");
  json j = ManifestJson(reader->manifest());  // the manifest's own fields (docs/checkpoint-format.md), then what inspect adds
  const json manifest_groups = std::move(j["groups"]);
  j["dir"] = dir;
  j["format_version"] = j["version"];  // the manifest's
  j["compression"] = json::object();
  for (const auto& [kind, rs] : stored.bytes) j["compression"][kind] = {{"raw_bytes", rs.first}, {"stored_bytes", rs.second}};
  j["groups"] = json::array();
  for (int g = 0; g < static_cast<int>(manifest_groups.size()); ++g) {
    ASSIGN_OR_RETURN(json jg, GroupJson(*reader, manifest_groups[static_cast<size_t>(g)], g, tensor, stats));
    j["groups"].push_back(std::move(jg));
  }
  if (as_json) {
    out << j.dump(1) << "\n";
    return Status();
  }
  PrintHeader(j, out);
  for (int g = 0; g < static_cast<int>(j["groups"].size()); ++g) PrintGroup(j["groups"][static_cast<size_t>(g)], GroupShards(reader->manifest(), g), out);
  return Status();
}

namespace {

// One tensor's state kind in A against B: NaN equals NaN and an infinity its own sign (the same value
// stored); anything else that is not equal differs, a NaN or infinity against a number by an infinite
// amount. Missing in B: every element differs.
Result<json> DiffTensor(TensorReader& a, TensorReader& b, const TensorEntry& te, const std::string& kind) {
  std::vector<float> va(static_cast<size_t>(te.numel)), vb(va.size());
  RETURN_IF_ERROR(a.Read(te.name, kind, 0, te.numel, va.data()), "diff: ", a.dir());
  const double inf = std::numeric_limits<double>::infinity();
  auto found = b.Find(te.name);
  const bool comparable = found.ok() && found->second->numel == te.numel;
  const Status read = comparable ? b.Read(te.name, kind, 0, te.numel, vb.data()) : Status();
  if (!comparable || read.code() == StatusCode::kNotFound) {
    return json{{"tensor", te.name}, {"kind", kind}, {"max_abs", inf}, {"max_rel", inf}, {"elements_differing", te.numel}};
  }
  RETURN_IF_ERROR(read, "diff: ", b.dir());
  double max_abs = 0, max_rel = 0;
  int64_t differing = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    const double x = va[i], y = vb[i];
    if (x == y || (std::isnan(x) && std::isnan(y))) continue;
    ++differing;
    const double d = std::isfinite(x) && std::isfinite(y) ? std::abs(x - y) : inf;
    max_abs = std::max(max_abs, d);
    max_rel = std::max(max_rel, std::isfinite(d) ? d / std::max({std::abs(x), std::abs(y), 1e-30}) : d);
  }
  return json{{"tensor", te.name}, {"kind", kind}, {"max_abs", max_abs}, {"max_rel", max_rel}, {"elements_differing", differing}};
}

}  // namespace

Status CkptDiff(const std::string& a, const std::string& b, bool as_json, std::ostream& out) {
  ASSIGN_OR_RETURN(std::unique_ptr<TensorReader> ra, TensorReader::Open(a), "diff");
  ASSIGN_OR_RETURN(std::unique_ptr<TensorReader> rb, TensorReader::Open(b), "diff");
  const Manifest& ma = ra->manifest();
  int64_t total = 0, done = 0, differing = 0;
  for (const GroupEntry& ge : ma.groups) {
    for (const TensorEntry& te : ge.tensors) total += 2 * 4 * te.numel * static_cast<int64_t>(ge.kinds.size());
  }
  const ProgressFn progress = TtyProgress("comparing");
  json rows = json::array();
  for (const GroupEntry& ge : ma.groups) {
    for (const TensorEntry& te : ge.tensors) {
      for (const std::string& kind : ge.kinds) {
        ASSIGN_OR_RETURN(json row, DiffTensor(*ra, *rb, te, kind));
        differing += row["elements_differing"].get<int64_t>();
        rows.push_back(std::move(row));
        if (progress) progress(done += 2 * 4 * te.numel, total);
      }
    }
  }
  if (as_json) {
    json j = {{"a", a}, {"b", b}, {"step_a", ma.step}, {"step_b", rb->manifest().step}, {"identical", differing == 0},
              {"elements_differing", differing}, {"tensors", rows}};
    for (json& r : j["tensors"]) {  // JSON has no infinity: an infinite difference is written as "inf"
      for (const char* f : {"max_abs", "max_rel"}) {
        if (!std::isfinite(r[f].get<double>())) r[f] = "inf";
      }
    }
    out << j.dump(1) << "\n";
  } else {
    out << "diff " << a << " (step " << ma.step << ") vs " << b << " (step " << rb->manifest().step << ")\n";
    for (const json& r : rows) {
      out << "  " << std::left << std::setw(24) << r["tensor"].get<std::string>() << std::setw(16) << r["kind"].get<std::string>() << std::right
          << std::scientific << std::setprecision(3) << " max abs " << r["max_abs"].get<double>() << "  max rel " << r["max_rel"].get<double>()
          << std::defaultfloat << "  (" << r["elements_differing"].get<int64_t>() << " differ)\n";
    }
    out << (differing == 0 ? "identical\n" : "differ\n");
  }
  if (differing != 0) return DataLossError("diff: ", differing, " elements differ between ", a, " and ", b);
  return Status();
}

}  // namespace zrt::tools
