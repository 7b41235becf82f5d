#include "checkpoint/format.h"

#include <cstdio>

namespace zrt::ckpt {
namespace {

using nlohmann::json;

std::string Hex(uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof(b), "%016llx", static_cast<unsigned long long>(v));
  return b;
}

// Adds "checksum" over the compact dump of the object without it.
std::string Seal(json j) {
  const std::string body = j.dump();
  j["checksum"] = "xxh3:" + Hex(Checksum(body.data(), body.size()));
  return j.dump(1) + "\n";
}

Result<json> Open(std::string_view text, const std::string& where) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return DataLossError(where, ": not a JSON object (corrupt or truncated)");
  if (!j.contains("checksum") || !j["checksum"].is_string()) return DataLossError(where, ": no checksum");
  const std::string want = j["checksum"];
  j.erase("checksum");
  const std::string body = j.dump();
  const std::string got = "xxh3:" + Hex(Checksum(body.data(), body.size()));
  if (got != want) return DataLossError(where, ": checksum mismatch (stored ", want, ", computed ", got, ")");
  if (j.value("format", "") != kFormatName) return DataLossError(where, ": not a zrt checkpoint file");
  if (j.value("version", 0) != kFormatVersion) {
    return DataLossError(where, ": format version ", j.value("version", 0), " (this zrt reads ", kFormatVersion, ")");
  }
  return j;
}

// nlohmann throws on type errors; the library must not: convert at the boundary.
template <typename F>
auto Guard(const std::string& where, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::exception& e) {  // json type errors, number parsing
    return DataLossError(where, ": malformed field (", e.what(), ")");
  }
}

}  // namespace

std::string StepDirName(int64_t step) {
  char b[32];
  std::snprintf(b, sizeof(b), "step-%08lld", static_cast<long long>(step));
  return b;
}

Result<int64_t> ParseStepDirName(std::string_view name) {
  if (name.size() <= 5 || name.substr(0, 5) != "step-") return NotFoundError("not a step directory: ", name);
  int64_t v = 0;
  for (char c : name.substr(5)) {
    if (c < '0' || c > '9') return NotFoundError("not a step directory: ", name);
    v = v * 10 + (c - '0');
  }
  return v;
}

std::string DataFileName(int rank) {
  char b[32];
  std::snprintf(b, sizeof(b), "rank-%05d.data", rank);
  return b;
}

std::string IndexFileName(int rank) {
  char b[32];
  std::snprintf(b, sizeof(b), "rank-%05d.index.json", rank);
  return b;
}

std::string EncodeManifest(const Manifest& m) {
  json j;
  j["format"] = kFormatName;
  j["version"] = kFormatVersion;
  j["nonce"] = m.nonce;
  j["step"] = m.step;
  j["world_size"] = m.world_size;
  j["shards"] = m.shards;
  j["stage"] = m.stage;
  j["zrt_version"] = m.zrt_version;
  j["created_unix"] = m.created_unix;
  j["chunk_elements"] = m.chunk_elements;
  j["engine"] = {{"loss_scale", m.loss_scale}, {"scaler_good_steps", m.scaler_good_steps},
                 {"scaler_hysteresis_left", m.scaler_hysteresis_left}};
  j["trainer_state"] = m.trainer_state;
  json groups = json::array();
  for (const GroupEntry& g : m.groups) {
    json tensors = json::array();
    for (const TensorEntry& t : g.tensors) {
      tensors.push_back({{"name", t.name}, {"shape", t.shape}, {"dtype", DTypeName(t.dtype)}, {"offset", t.offset}, {"numel", t.numel}});
    }
    groups.push_back({{"name", g.name}, {"lr", g.lr}, {"weight_decay", g.weight_decay}, {"alignment", g.alignment},
                      {"kinds", g.kinds}, {"tensors", std::move(tensors)}});
  }
  j["groups"] = std::move(groups);
  return Seal(std::move(j));
}

Result<Manifest> DecodeManifest(std::string_view text, const std::string& where) {
  ASSIGN_OR_RETURN(json j, Open(text, where));
  return Guard(where, [&]() -> Result<Manifest> {
    Manifest m;
    m.nonce = j.at("nonce").get<std::string>();
    m.step = j.at("step").get<int64_t>();
    m.world_size = j.at("world_size").get<int>();
    m.shards = j.at("shards").get<int>();
    m.stage = j.at("stage").get<int>();
    m.zrt_version = j.at("zrt_version").get<std::string>();
    m.created_unix = j.at("created_unix").get<int64_t>();
    m.chunk_elements = j.at("chunk_elements").get<int64_t>();
    const json& e = j.at("engine");
    m.loss_scale = e.at("loss_scale").get<double>();
    m.scaler_good_steps = e.at("scaler_good_steps").get<int64_t>();
    m.scaler_hysteresis_left = e.at("scaler_hysteresis_left").get<int>();
    m.trainer_state = j.at("trainer_state");
    if (m.shards < 1 || m.world_size < 1 || m.chunk_elements < 1 || m.step < 0) {
      return DataLossError(where, ": nonsense sizes (shards ", m.shards, ", world_size ", m.world_size, ")");
    }
    for (const json& g : j.at("groups")) {
      GroupEntry ge;
      ge.name = g.at("name").get<std::string>();
      ge.lr = g.at("lr").get<double>();
      ge.weight_decay = g.at("weight_decay").get<double>();
      ge.alignment = g.at("alignment").get<int64_t>();
      ge.kinds = g.at("kinds").get<std::vector<std::string>>();
      for (const json& t : g.at("tensors")) {
        TensorEntry te;
        te.name = t.at("name").get<std::string>();
        te.shape = t.at("shape").get<std::vector<int64_t>>();
        ASSIGN_OR_RETURN(te.dtype, ParseDType(t.at("dtype").get<std::string>()), where, ": tensor '", te.name, "'");
        te.offset = t.at("offset").get<int64_t>();
        te.numel = t.at("numel").get<int64_t>();
        ge.tensors.push_back(std::move(te));
      }
      m.groups.push_back(std::move(ge));
    }
    return m;
  });
}

std::string EncodeIndex(const RankIndex& r) {
  json j;
  j["format"] = kFormatName;
  j["version"] = kFormatVersion;
  j["nonce"] = r.nonce;
  j["step"] = r.step;
  j["rank"] = r.rank;
  j["shards"] = r.shards;
  j["data_file"] = r.data_file;
  j["data_bytes"] = r.data_bytes;
  // Chunks as arrays (compact: O(chunks) bytes): [group, kind, elem_offset, elements, file_offset,
  // stored_bytes, codec, xxh3]
  json chunks = json::array();
  for (const ChunkEntry& c : r.chunks) {
    chunks.push_back(json::array({c.group, c.kind, c.elem_offset, c.elements, c.file_offset, c.stored_bytes,
                                  CodecName(c.codec), Hex(c.xxh3)}));
  }
  j["chunks"] = std::move(chunks);
  return Seal(std::move(j));
}

Result<RankIndex> DecodeIndex(std::string_view text, const std::string& where) {
  ASSIGN_OR_RETURN(json j, Open(text, where));
  return Guard(where, [&]() -> Result<RankIndex> {
    RankIndex r;
    r.nonce = j.at("nonce").get<std::string>();
    r.step = j.at("step").get<int64_t>();
    r.rank = j.at("rank").get<int>();
    r.shards = j.at("shards").get<int>();
    r.data_file = j.at("data_file").get<std::string>();
    r.data_bytes = j.at("data_bytes").get<int64_t>();
    for (const json& c : j.at("chunks")) {
      ChunkEntry e;
      e.group = c.at(0).get<int>();
      e.kind = c.at(1).get<int>();
      e.elem_offset = c.at(2).get<int64_t>();
      e.elements = c.at(3).get<int64_t>();
      e.file_offset = c.at(4).get<int64_t>();
      e.stored_bytes = c.at(5).get<int64_t>();
      ASSIGN_OR_RETURN(e.codec, ParseCodec(c.at(6).get<std::string>()), where);
      e.xxh3 = std::stoull(c.at(7).get<std::string>(), nullptr, 16);
      if (e.elements < 0 || e.stored_bytes < 0 || e.file_offset < 0 || e.file_offset + e.stored_bytes > r.data_bytes) {
        return DataLossError(where, ": chunk outside the data file");
      }
      r.chunks.push_back(e);
    }
    return r;
  });
}

Result<ShardLayout> SavedLayout(const Manifest& m, int group) {
  if (group < 0 || group >= static_cast<int>(m.groups.size())) return DataLossError("manifest: no group #", group);
  std::vector<int64_t> numels;
  for (const TensorEntry& t : m.groups[static_cast<size_t>(group)].tensors) numels.push_back(t.numel);
  ASSIGN_OR_RETURN(ShardLayout l, ShardLayout::Create(numels, m.shards, m.groups[static_cast<size_t>(group)].alignment),
                   "manifest group '", m.groups[static_cast<size_t>(group)].name, "'");
  // The offsets recorded must be the ones the layout gives (a reader in another language relies on them).
  for (size_t t = 0; t < numels.size(); ++t) {
    if (l.tensor_offset(static_cast<int64_t>(t)) != m.groups[static_cast<size_t>(group)].tensors[t].offset) {
      return DataLossError("manifest group '", m.groups[static_cast<size_t>(group)].name, "': tensor offsets disagree with the layout");
    }
  }
  return l;
}

}  // namespace zrt::ckpt
