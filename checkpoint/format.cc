#include "zrt/checkpoint/format.h"

#include "zrt/checkpoint/codec.h"
#include "zrt/core/base.h"
#include "zrt/core/quant_math.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <set>
#include <stdexcept>

namespace zrt::ckpt {
namespace {

using nlohmann::json;

std::string Hex(uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof(b), "%016llx", static_cast<unsigned long long>(v));
  return b;
}

using internal::Seal;

// M6: how a group's kinds are stored. q8 and q4 blocks never straddle a chunk or a shard (both
// multiples of the block), so every chunk decodes on its own and resharding moves whole blocks.
Status ValidateStored(const Manifest& m, const GroupEntry& g) {
  if (!g.stored.empty() && g.stored.size() != g.kinds.size()) {
    return DataLossError("group '", g.name, "': ", g.stored.size(), " stored types for ", g.kinds.size(), " kinds");
  }
  bool blocks = false;
  for (size_t k = 0; k < g.stored.size(); ++k) {
    if (IsBlockwise(g.stored[k]) && g.kinds[k] != "exp_avg" && g.kinds[k] != "exp_avg_sq") {
      return DataLossError("group '", g.name, "': ", g.kinds[k], " cannot be stored as ", PrecisionName(g.stored[k]),
                           " (only exp_avg and exp_avg_sq)");
    }
    blocks = blocks || IsBlockwise(g.stored[k]);
  }
  if (!blocks) {
    if (g.block != 0) return DataLossError("group '", g.name, "': a block size without a q8 or q4 kind");
    return Status();
  }
  if (g.block < 8 || g.block > kMaxQuantBlock || (g.block & (g.block - 1)) != 0 || g.alignment % g.block != 0 ||
      m.chunk_elements % g.block != 0) {
    return DataLossError("group '", g.name, "': q8/q4 block ", g.block, " is not a power of two in [8, ", kMaxQuantBlock,
                         "] dividing the alignment (", g.alignment, ") and chunk_elements (", m.chunk_elements, ")");
  }
  return Status();
}

// M7: groups that list their files (a group over a mesh of its own). Every rank wrote its file, one
// part each; a group's files are distinct files of the save, one at stage 0 (a replicated shard).
Status ValidateFiles(const Manifest& m) {
  if (m.shards != m.world_size || m.parts != 1) {
    return DataLossError("groups list their files, but shards ", m.shards, " / parts ", m.parts, " are not world_size ", m.world_size,
                         " / 1 (every rank writes its own file)");
  }
  for (const GroupEntry& g : m.groups) {
    const size_t n = g.files.empty() ? static_cast<size_t>(m.shards) : g.files.size();
    if (m.stage == 0 ? n != 1 : n > static_cast<size_t>(m.shards)) {
      return DataLossError("group '", g.name, "': ", n, " shard(s) at stage ", m.stage, " in a save of ", m.shards, " files",
                           m.stage == 0 ? " (stage 0 saves one shard of each group)" : "");
    }
    std::set<int> seen;
    for (int f : g.files) {
      if (f < 0 || f >= m.shards || !seen.insert(f).second) {
        return DataLossError("group '", g.name, "': file ", f, " is outside [0, ", m.shards, ") or listed twice");
      }
    }
  }
  return Status();
}

// The manifest's own rules (docs/checkpoint-format.md "Rules", M1-M7).
Status ValidateManifest(const Manifest& m) {
  if (m.shards < 1 || m.shards > kMaxShards || m.world_size < 1 || m.world_size > kMaxShards) {
    return DataLossError("shards ", m.shards, " / world_size ", m.world_size, " outside [1, ", kMaxShards, "]");
  }
  if (m.stage < 0 || m.stage > 3) return DataLossError("stage ", m.stage, " is not 0..3");
  const bool listed = std::any_of(m.groups.begin(), m.groups.end(), [](const GroupEntry& g) { return !g.files.empty(); });
  if (listed) {
    RETURN_IF_ERROR(ValidateFiles(m));
  } else if (m.stage == 0 ? m.shards != 1 : m.world_size % m.shards != 0) {
    return DataLossError("shards ", m.shards, " disagrees with stage ", m.stage, " and world_size ", m.world_size,
                         " (stage 0 saves one shard, stages 1-3 one per shard group rank, a divisor of the world)");
  }
  if (m.parts < 1 || m.parts > kMaxParts || m.parts > m.world_size / m.shards) {
    return DataLossError("parts ", m.parts, " outside [1, ", std::min(kMaxParts, m.world_size / m.shards),
                         "] (each part of a shard is written by another of its ", m.world_size / m.shards, " replicas)");
  }
  if (m.step < 0) return DataLossError("negative step ", m.step);
  if (m.chunk_elements < 1 || m.chunk_elements > kMaxChunkElements) {
    return DataLossError("chunk_elements ", m.chunk_elements, " outside [1, ", kMaxChunkElements, "]");
  }
  if (!(m.loss_scale > 0) || !std::isfinite(m.loss_scale) || m.scaler_good_steps < 0 || m.scaler_hysteresis_left < 0) {
    return DataLossError("loss scaler state out of range (scale ", m.loss_scale, ")");
  }
  if (m.groups.empty()) return DataLossError("no parameter groups");
  std::set<std::string> group_names, tensor_names;
  for (const GroupEntry& g : m.groups) {
    if (g.name.empty() || !group_names.insert(g.name).second) return DataLossError("group name '", g.name, "' is empty or repeated");
    if (g.alignment < 1 || g.alignment > kMaxAlignment) {
      return DataLossError("group '", g.name, "': alignment ", g.alignment, " outside [1, ", kMaxAlignment, "]");
    }
    std::set<std::string> kinds;
    for (const std::string& k : g.kinds) {
      if (std::find(std::begin(kStateKinds), std::end(kStateKinds), k) == std::end(kStateKinds)) {
        return DataLossError("group '", g.name, "': unknown state kind '", k, "'");
      }
      if (!kinds.insert(k).second) return DataLossError("group '", g.name, "': state kind '", k, "' repeated");
    }
    if (!kinds.contains("master")) return DataLossError("group '", g.name, "' has no master weights");
    RETURN_IF_ERROR(ValidateStored(m, g));
    if (g.tensors.empty()) return DataLossError("group '", g.name, "' has no tensors");
    for (const TensorEntry& te : g.tensors) {
      if (te.name.empty() || !tensor_names.insert(te.name).second) {
        return DataLossError("tensor name '", te.name, "' is empty or repeated");
      }
      if (!IsFloating(te.dtype)) return DataLossError("tensor '", te.name, "': dtype ", DTypeName(te.dtype), " is not a float type");
      if (te.numel < 0 || te.numel > kMaxNumel || te.offset < 0) {
        return DataLossError("tensor '", te.name, "': numel ", te.numel, " or offset ", te.offset, " out of range");
      }
      int64_t n = 1;
      for (int64_t d : te.shape) {
        if (d < 0 || d > kMaxNumel || (d != 0 && n > kMaxNumel / d)) {
          return DataLossError("tensor '", te.name, "': shape dimension ", d, " out of range");
        }
        n *= d;
      }
      if (n != te.numel) return DataLossError("tensor '", te.name, "': shape has ", n, " elements, numel says ", te.numel);
    }
  }
  for (int g = 0; g < static_cast<int>(m.groups.size()); ++g) RETURN_IF_ERROR(SavedLayout(m, g).status());
  return Status();
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
  // Found by the fuzzer: json::value() throws when the member exists with another type.
  const json& format = j.contains("format") ? j["format"] : json();
  const json& version = j.contains("version") ? j["version"] : json();
  if (!format.is_string() || format.get<std::string>() != kFormatName) return DataLossError(where, ": not a zrt checkpoint file");
  if (!version.is_number_integer() || version.get<int64_t>() < 1 || version.get<int64_t>() > kFormatVersion) {
    return DataLossError(where, ": format version ", version.dump(), " (this zrt reads 1 to ", kFormatVersion, ")");
  }
  return j;
}

// Strict typed access (the fuzzer found that nlohmann converts an out-of-range float to int with
// undefined behaviour): integers must be JSON integers in range, strings strings, arrays arrays.
struct FieldError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
const json& At(const json& o, const char* name) {
  if (!o.is_object() || !o.contains(name)) throw FieldError(std::string("missing member '") + name + "'");
  return o[name];
}
int64_t I64(const json& v, const char* name) {
  if (!v.is_number_integer()) throw FieldError(std::string(name) + " is not an integer");
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) throw FieldError(std::string(name) + " is out of range");
  return v.get<int64_t>();
}
int I32(const json& v, const char* name) {
  const int64_t x = I64(v, name);
  if (x < INT32_MIN || x > INT32_MAX) throw FieldError(std::string(name) + " is out of range");
  return static_cast<int>(x);
}
double F64(const json& v, const char* name) {
  if (!v.is_number()) throw FieldError(std::string(name) + " is not a number");
  return v.get<double>();
}
std::string Str(const json& v, const char* name) {
  if (!v.is_string()) throw FieldError(std::string(name) + " is not a string");
  return v.get<std::string>();
}
const json& Arr(const json& v, const char* name) {
  if (!v.is_array()) throw FieldError(std::string(name) + " is not an array");
  return v;
}
const json& Item(const json& a, size_t i, const char* name) {
  if (!a.is_array() || i >= a.size()) throw FieldError(std::string(name) + " is too short");
  return a[i];
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

namespace internal {
// Adds "checksum" over the compact dump of the object without it.
std::string Seal(json j) {
  j.erase("checksum");
  const std::string body = j.dump();
  j["checksum"] = "xxh3:" + Hex(Checksum(body.data(), body.size()));
  return j.dump(1) + "\n";
}
}  // namespace internal

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

int GroupShards(const Manifest& m, int g) {
  const GroupEntry& ge = m.groups[static_cast<size_t>(g)];
  return ge.files.empty() ? m.shards : static_cast<int>(ge.files.size());
}

int FileOf(const Manifest& m, int g, int shard) {
  const GroupEntry& ge = m.groups[static_cast<size_t>(g)];
  return ge.files.empty() ? shard : ge.files[static_cast<size_t>(shard)];
}

int ShardIn(const Manifest& m, int g, int file) {
  const GroupEntry& ge = m.groups[static_cast<size_t>(g)];
  if (ge.files.empty()) return file >= 0 && file < m.shards ? file : -1;
  const auto it = std::find(ge.files.begin(), ge.files.end(), file);
  return it == ge.files.end() ? -1 : static_cast<int>(it - ge.files.begin());
}

RankIndex IndexOf(const Manifest& m, int rank, int part) {
  RankIndex idx;
  idx.nonce = m.nonce;
  idx.step = m.step;
  idx.rank = rank;
  idx.shards = m.shards;
  idx.part = part;
  idx.parts = m.parts;
  idx.data_file = DataFileName(rank, part, m.parts);
  for (int g = 0; g < static_cast<int>(m.groups.size()); ++g) {
    if (!m.groups[static_cast<size_t>(g)].files.empty() && ShardIn(m, g, rank) >= 0) idx.holds.emplace_back(g, ShardIn(m, g, rank));
  }
  return idx;
}

namespace {
__extension__ typedef __int128 Wide;  // a shard's bytes times the parts
}  // namespace

PartPlan::PartPlan(const Manifest& m, std::span<const ShardLayout> layouts, int file)
    : raw_(static_cast<size_t>(std::max(m.parts, 1)), 0), file_(raw_.size(), 0) {
  // The chunks' bytes before compression, in order; then each chunk goes to the part its first byte
  // falls in when the total is cut into m.parts equal runs.
  int64_t total = 0;
  auto held = [&](size_t g) { return ShardIn(m, static_cast<int>(g), file) >= 0; };
  for (size_t g = 0; g < m.groups.size(); ++g) {
    const GroupEntry& ge = m.groups[g];
    const int64_t shard = held(g) ? layouts[g].shard_size() : 0;
    for (size_t k = 0; k < ge.kinds.size(); ++k) {
      total += ge.format(k).Bytes(shard);
    }
  }
  int64_t at = 0;
  for (size_t g = 0; g < m.groups.size(); ++g) {
    const GroupEntry& ge = m.groups[g];
    const int64_t shard = layouts[g].shard_size();
    auto& kinds = parts_.emplace_back(ge.kinds.size());
    for (size_t k = 0; k < ge.kinds.size(); ++k) {
      for (int64_t e = 0; e < shard && !held(g); e += m.chunk_elements) kinds[k].push_back(-1);
      for (int64_t e = 0; e < shard && held(g); e += m.chunk_elements) {
        const int64_t bytes = ge.format(k).Bytes(std::min(m.chunk_elements, shard - e));
        const int p = total == 0 ? 0 : static_cast<int>(static_cast<Wide>(at) * m.parts / total);  // exact: every rank agrees
        kinds[k].push_back(p);
        raw_[static_cast<size_t>(p)] += bytes;
        file_[static_cast<size_t>(p)] += AlignUp(bytes, 4096);  // raw chunks start on 4 KiB
        at += bytes;
      }
    }
  }
}

std::vector<std::vector<std::vector<char>>> PartPlan::Mask(int part) const {
  std::vector<std::vector<std::vector<char>>> out;
  for (const auto& kinds : parts_) {
    auto& o = out.emplace_back();
    for (const std::vector<int>& chunks : kinds) {
      auto& c = o.emplace_back();
      for (int p : chunks) c.push_back(p == part ? 1 : 0);
    }
  }
  return out;
}

namespace {
std::string ShardFileName(int rank, int part, int parts, const char* suffix) {
  char b[64];
  if (parts <= 1) {
    std::snprintf(b, sizeof(b), "rank-%05d.%s", rank, suffix);
  } else {
    std::snprintf(b, sizeof(b), "rank-%05d.part-%03d.%s", rank, part, suffix);
  }
  return b;
}
}  // namespace

std::string DataFileName(int rank, int part, int parts) { return ShardFileName(rank, part, parts, "data"); }
std::string IndexFileName(int rank, int part, int parts) { return ShardFileName(rank, part, parts, "index.json"); }

json ManifestJson(const Manifest& m) {
  json j;
  j["format"] = kFormatName;
  j["version"] = std::any_of(m.groups.begin(), m.groups.end(), [](const GroupEntry& g) { return !g.files.empty(); }) ? 2 : 1;
  j["nonce"] = m.nonce;
  j["step"] = m.step;
  j["world_size"] = m.world_size;
  j["shards"] = m.shards;
  if (m.parts != 1) j["parts"] = m.parts;  // absent: 1, as in every checkpoint before spread saves
  j["stage"] = m.stage;
  j["zrt_version"] = m.zrt_version;
  j["created_unix"] = m.created_unix;
  j["chunk_elements"] = m.chunk_elements;
  j["engine"] = {{"loss_scale", m.loss_scale}, {"scaler_good_steps", m.scaler_good_steps},
                 {"scaler_hysteresis_left", m.scaler_hysteresis_left}, {"state", m.engine_state}};
  j["trainer_state"] = m.trainer_state;
  json groups = json::array();
  for (const GroupEntry& g : m.groups) {
    json tensors = json::array();
    for (const TensorEntry& t : g.tensors) {
      tensors.push_back({{"name", t.name}, {"shape", t.shape}, {"dtype", DTypeName(t.dtype)}, {"offset", t.offset}, {"numel", t.numel}});
    }
    json& o = groups.emplace_back(json{{"name", g.name}, {"lr", g.lr}, {"weight_decay", g.weight_decay}, {"alignment", g.alignment},
                                       {"kinds", g.kinds}, {"tensors", std::move(tensors)}});
    if (!g.files.empty()) o["files"] = g.files;
    if (std::any_of(g.stored.begin(), g.stored.end(), [](Precision a) { return a != Precision::kF32; })) {  // else as before it existed
      for (Precision a : g.stored) o["stored"].push_back(PrecisionName(a));
      if (g.block != 0) o["block"] = g.block;
    }
  }
  j["groups"] = std::move(groups);
  return j;
}

std::string EncodeManifest(const Manifest& m) { return Seal(ManifestJson(m)); }

Result<Manifest> DecodeManifest(std::string_view text, const std::string& where) {
  ASSIGN_OR_RETURN(json j, Open(text, where));
  return Guard(where, [&]() -> Result<Manifest> {
    Manifest m;
    m.nonce = Str(At(j, "nonce"), "nonce");
    m.step = I64(At(j, "step"), "step");
    m.world_size = I32(At(j, "world_size"), "world_size");
    m.shards = I32(At(j, "shards"), "shards");
    if (j.contains("parts")) m.parts = I32(j["parts"], "parts");
    m.stage = I32(At(j, "stage"), "stage");
    m.zrt_version = Str(At(j, "zrt_version"), "zrt_version");
    m.created_unix = I64(At(j, "created_unix"), "created_unix");
    m.chunk_elements = I64(At(j, "chunk_elements"), "chunk_elements");
    const json& e = At(j, "engine");
    m.loss_scale = F64(At(e, "loss_scale"), "loss_scale");
    m.scaler_good_steps = I64(At(e, "scaler_good_steps"), "scaler_good_steps");
    m.scaler_hysteresis_left = I32(At(e, "scaler_hysteresis_left"), "scaler_hysteresis_left");
    if (e.contains("state")) {  // absent in checkpoints written before it existed
      m.engine_state = e["state"];
      if (!m.engine_state.is_object()) throw FieldError("engine.state is not an object");
    }
    m.trainer_state = At(j, "trainer_state");
    for (const json& g : Arr(At(j, "groups"), "groups")) {
      GroupEntry ge;
      ge.name = Str(At(g, "name"), "group name");
      ge.lr = F64(At(g, "lr"), "lr");
      ge.weight_decay = F64(At(g, "weight_decay"), "weight_decay");
      ge.alignment = I64(At(g, "alignment"), "alignment");
      for (const json& k : Arr(At(g, "kinds"), "kinds")) ge.kinds.push_back(Str(k, "kind"));
      if (g.contains("stored")) {
        for (const json& k : Arr(g["stored"], "stored")) {
          const std::string t = Str(k, "stored");
          const Result<Precision> p = ParsePrecision(t);
          if (!p.ok()) throw FieldError("group '" + ge.name + "': unknown stored type '" + t + "' (f32, bf16, q8, q4)");
          ge.stored.push_back(*p);
        }
      }
      if (g.contains("block")) ge.block = I64(g["block"], "block");
      if (g.contains("files")) {
        for (const json& f : Arr(g["files"], "files")) ge.files.push_back(I32(f, "files"));
        if (ge.files.empty()) throw FieldError("group '" + ge.name + "': an empty files list");
      }
      for (const json& t : Arr(At(g, "tensors"), "tensors")) {
        TensorEntry te;
        te.name = Str(At(t, "name"), "tensor name");
        for (const json& d : Arr(At(t, "shape"), "shape")) te.shape.push_back(I64(d, "shape"));
        ASSIGN_OR_RETURN(te.dtype, ParseDType(Str(At(t, "dtype"), "dtype")), where, ": tensor '", te.name, "'");
        te.offset = I64(At(t, "offset"), "offset");
        te.numel = I64(At(t, "numel"), "numel");
        ge.tensors.push_back(std::move(te));
      }
      m.groups.push_back(std::move(ge));
    }
    RETURN_IF_ERROR(ValidateManifest(m), where);
    const bool listed = std::any_of(m.groups.begin(), m.groups.end(), [](const GroupEntry& g) { return !g.files.empty(); });
    if (listed != (j["version"].get<int64_t>() == 2)) {
      return DataLossError(where, ": format version ", j["version"].get<int64_t>(), listed ? " with" : " without",
                           " groups listing their files (version 2 exactly when some group does)");
    }
    return m;
  });
}

std::string EncodeIndex(const RankIndex& r) {
  json j;
  j["format"] = kFormatName;
  j["version"] = 1;  // unchanged by version 2
  j["nonce"] = r.nonce;
  j["step"] = r.step;
  j["rank"] = r.rank;
  j["shards"] = r.shards;
  if (r.parts != 1) {
    j["part"] = r.part;
    j["parts"] = r.parts;
  }
  j["data_file"] = r.data_file;
  j["data_bytes"] = r.data_bytes;
  if (!r.holds.empty()) {
    j["holds"] = json::array();
    for (const auto& [g, s] : r.holds) j["holds"].push_back(json::array({g, s}));
  }
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
    r.nonce = Str(At(j, "nonce"), "nonce");
    r.step = I64(At(j, "step"), "step");
    r.rank = I32(At(j, "rank"), "rank");
    r.shards = I32(At(j, "shards"), "shards");
    if (j.contains("parts")) {
      r.part = I32(At(j, "part"), "part");
      r.parts = I32(j["parts"], "parts");
    }
    r.data_file = Str(At(j, "data_file"), "data_file");
    r.data_bytes = I64(At(j, "data_bytes"), "data_bytes");
    if (j.contains("holds")) {
      for (const json& h : Arr(j["holds"], "holds")) r.holds.emplace_back(I32(Item(h, 0, "holds"), "holds group"), I32(Item(h, 1, "holds"), "holds shard"));
    }
    for (const json& c : Arr(At(j, "chunks"), "chunks")) {
      ChunkEntry e;
      e.group = I32(Item(c, 0, "chunk"), "chunk group");
      e.kind = I32(Item(c, 1, "chunk"), "chunk kind");
      e.elem_offset = I64(Item(c, 2, "chunk"), "chunk elem_offset");
      e.elements = I64(Item(c, 3, "chunk"), "chunk elements");
      e.file_offset = I64(Item(c, 4, "chunk"), "chunk file_offset");
      e.stored_bytes = I64(Item(c, 5, "chunk"), "chunk stored_bytes");
      ASSIGN_OR_RETURN(e.codec, ParseCodec(Str(Item(c, 6, "chunk"), "chunk codec")), where);
      const std::string hex = Str(Item(c, 7, "chunk"), "chunk checksum");
      if (hex.empty() || hex.size() > 16 || hex.find_first_not_of("0123456789abcdef") != std::string::npos) {
        return DataLossError(where, ": bad chunk checksum '", hex, "'");
      }
      e.xxh3 = std::stoull(hex, nullptr, 16);
      if (e.elements < 0 || e.elem_offset < 0 || e.stored_bytes < 0 || e.file_offset < 0) {
        return DataLossError(where, ": chunk ", r.chunks.size(), " has a negative size or offset");
      }
      if (r.data_bytes < 0 || e.stored_bytes > r.data_bytes || e.file_offset > r.data_bytes - e.stored_bytes) {
        return DataLossError(where, ": chunk ", r.chunks.size(), " (bytes ", e.file_offset, "+", e.stored_bytes,
                             ") lies outside the data file of ", r.data_bytes, " bytes");
      }
      r.chunks.push_back(e);
    }
    return r;
  });
}

Result<std::vector<ShardLayout>> SavedLayouts(const Manifest& m) {
  std::vector<ShardLayout> out;
  for (int g = 0; g < static_cast<int>(m.groups.size()); ++g) {
    ASSIGN_OR_RETURN(ShardLayout l, SavedLayout(m, g));
    out.push_back(std::move(l));
  }
  return out;
}

Status ValidateIndexFile(const Manifest& m, std::span<const ShardLayout> layouts, const RankIndex& r, int rank, int part,
                         const std::string& where) {
  if (layouts.size() != m.groups.size()) return InternalError(where, ": layouts for ", layouts.size(), " groups");
  if (r.rank != rank || r.part != part) {
    return DataLossError(where, ": index of shard ", r.rank, " part ", r.part, " under the name of shard ", rank, " part ", part);
  }
  if (r.nonce != m.nonce || r.step != m.step || r.shards != m.shards || r.parts != m.parts) {
    return DataLossError(where, ": belongs to another save (nonce/step/shards/parts disagree with the manifest)");
  }
  const std::string data = DataFileName(rank, part, m.parts);
  if (r.data_file != data) return DataLossError(where, ": data file '", r.data_file, "' is not ", data);
  if (r.holds != IndexOf(m, rank, part).holds) {
    return DataLossError(where, ": the shards of groups over meshes of their own it holds (\"holds\") disagree with the manifest's files");
  }
  std::vector<std::pair<int64_t, int64_t>> spans;
  spans.reserve(r.chunks.size());
  for (size_t k = 0; k < r.chunks.size(); ++k) {
    const ChunkEntry& c = r.chunks[k];
    if (c.group < 0 || c.group >= static_cast<int>(m.groups.size())) return DataLossError(where, ": chunk ", k, " names unknown group ", c.group);
    const GroupEntry& ge = m.groups[static_cast<size_t>(c.group)];
    if (c.kind < 0 || c.kind >= static_cast<int>(ge.kinds.size())) {
      return DataLossError(where, ": chunk ", k, " names unknown state kind ", c.kind, " of group '", ge.name, "'");
    }
    if (ShardIn(m, c.group, rank) < 0) return DataLossError(where, ": chunk ", k, " is of group '", ge.name, "', which this file holds no shard of");
    const int64_t shard = layouts[static_cast<size_t>(c.group)].shard_size();
    if (c.elements < 1 || c.elements > m.chunk_elements || c.elem_offset < 0 || c.elem_offset > shard - c.elements) {
      return DataLossError(where, ": chunk ", k, " (elements ", c.elem_offset, "+", c.elements, ") lies outside the shard of ",
                           shard, " elements of group '", ge.name, "' (chunks hold at most ", m.chunk_elements, ")");
    }
    const Precision as = ge.stored_as(static_cast<size_t>(c.kind));
    if (IsBlockwise(as) && (c.elem_offset % ge.block != 0 || c.elements % ge.block != 0)) {
      return DataLossError(where, ": chunk ", k, " (elements ", c.elem_offset, "+", c.elements, ") of ", PrecisionName(as),
                           " state splits a block of ", ge.block);
    }
    const int64_t bytes = ge.format(static_cast<size_t>(c.kind)).Bytes(c.elements);
    if (c.codec == Codec::kRaw ? c.stored_bytes != bytes : (c.stored_bytes < 1 || c.stored_bytes >= bytes)) {
      return DataLossError(where, ": chunk ", k, " stores ", c.stored_bytes, " bytes for ", c.elements, " elements (",
                           CodecName(c.codec), ", ", PrecisionName(as), ")");
    }
    spans.emplace_back(c.file_offset, c.stored_bytes);
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i) {
    if (spans[i].first < spans[i - 1].first + spans[i - 1].second) {
      return DataLossError(where, ": chunks overlap: two share bytes at offset ", spans[i].first, " of ", r.data_file);
    }
  }
  return Status();
}

Status ValidateCover(const Manifest& m, std::span<const ShardLayout> layouts, std::span<const RankIndex> parts,
                     const std::string& where) {
  // Per (group, kind): the chunks' element ranges, to tile the shard exactly once. The chunks were
  // checked to name a group and kind of the manifest (ValidateIndexFile).
  std::vector<std::vector<std::vector<std::pair<int64_t, int64_t>>>> cover(m.groups.size());
  for (size_t g = 0; g < m.groups.size(); ++g) cover[g].resize(m.groups[g].kinds.size());
  for (const RankIndex& r : parts) {
    for (const ChunkEntry& c : r.chunks) cover[static_cast<size_t>(c.group)][static_cast<size_t>(c.kind)].emplace_back(c.elem_offset, c.elements);
  }
  const int file = parts.empty() ? 0 : parts.front().rank;
  for (size_t g = 0; g < m.groups.size(); ++g) {
    if (ShardIn(m, static_cast<int>(g), file) < 0) continue;  // none of its chunks is here (ValidateIndexFile)
    const int64_t shard = layouts[g].shard_size();
    for (size_t k = 0; k < m.groups[g].kinds.size(); ++k) {
      auto& v = cover[g][k];
      std::sort(v.begin(), v.end());
      int64_t at = 0;
      for (const auto& [off, n] : v) {
        if (off != at) {
          return DataLossError(where, ": group '", m.groups[g].name, "' ", m.groups[g].kinds[k], ": chunks ",
                               off < at ? "overlap" : "leave a gap", " at element ", std::min(off, at));
        }
        at += n;
      }
      if (at != shard) {
        return DataLossError(where, ": group '", m.groups[g].name, "' ", m.groups[g].kinds[k], ": chunks cover ", at, " of ", shard,
                             " elements");
      }
    }
  }
  return Status();
}

Status ValidateIndex(const Manifest& m, std::span<const ShardLayout> layouts, const RankIndex& r, int rank,
                     const std::string& where) {
  if (m.parts != 1) return DataLossError(where, ": one index for a shard saved in ", m.parts, " parts");
  RETURN_IF_ERROR(ValidateIndexFile(m, layouts, r, rank, 0, where));
  return ValidateCover(m, layouts, std::span<const RankIndex>(&r, 1), where);
}


Result<ShardLayout> SavedLayout(const Manifest& m, int group) {
  if (group < 0 || group >= static_cast<int>(m.groups.size())) return DataLossError("manifest: no group #", group);
  std::vector<int64_t> numels;
  for (const TensorEntry& t : m.groups[static_cast<size_t>(group)].tensors) numels.push_back(t.numel);
  ASSIGN_OR_RETURN(ShardLayout l, ShardLayout::Create(numels, GroupShards(m, group), m.groups[static_cast<size_t>(group)].alignment),
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
