#include "zrt/core/json_reader.h"

#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>

namespace zrt {

namespace {

const nlohmann::json& Null() {
  static const nlohmann::json null;
  return null;
}

std::string Shown(const nlohmann::json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

}  // namespace

Result<JsonReader> JsonReader::Object(const nlohmann::json& j, std::string path) {
  if (!j.is_object()) {
    return InvalidArgumentError(path.empty() ? "configuration" : path, ": expected an object, got ", Shown(j));
  }
  return JsonReader(j, std::move(path));
}

std::string JsonReader::Path(std::string_view key) const {
  return path_.empty() ? std::string(key) : internal::StrCat(path_, ".", key);
}

bool JsonReader::has(std::string_view key) const { return j_.find(key) != j_.end(); }

const nlohmann::json* JsonReader::Get(std::string_view key) {
  auto it = j_.find(key);
  if (it == j_.end()) return nullptr;
  read_.emplace(key);
  return &*it;
}

Status JsonReader::Read(std::string_view key, bool* out) {
  const nlohmann::json* v = Get(key);
  if (v == nullptr) return Status();
  if (!v->is_boolean()) return InvalidArgumentError(Path(key), ": expected true or false, got ", Shown(*v));
  *out = v->get<bool>();
  return Status();
}

Status JsonReader::Read(std::string_view key, int64_t* out) {
  const nlohmann::json* v = Get(key);
  if (v == nullptr) return Status();
  if (v->is_number_unsigned()) {
    const auto u = v->get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return InvalidArgumentError(Path(key), ": ", u, " is too large");
    *out = static_cast<int64_t>(u);
    return Status();
  }
  if (!v->is_number_integer()) return InvalidArgumentError(Path(key), ": expected an integer, got ", Shown(*v));
  *out = v->get<int64_t>();
  return Status();
}

Status JsonReader::Read(std::string_view key, int* out) {
  int64_t x = *out;
  RETURN_IF_ERROR(Read(key, &x));
  if (x < std::numeric_limits<int>::min() || x > std::numeric_limits<int>::max()) {
    return InvalidArgumentError(Path(key), ": ", x, " is out of range");
  }
  *out = static_cast<int>(x);
  return Status();
}

Status JsonReader::Read(std::string_view key, double* out) {
  const nlohmann::json* v = Get(key);
  if (v == nullptr) return Status();
  if (!v->is_number()) return InvalidArgumentError(Path(key), ": expected a number, got ", Shown(*v));
  const double d = v->get<double>();
  if (!std::isfinite(d)) return InvalidArgumentError(Path(key), ": expected a finite number");
  *out = d;
  return Status();
}

Status JsonReader::Read(std::string_view key, std::string* out) {
  const nlohmann::json* v = Get(key);
  if (v == nullptr) return Status();
  if (!v->is_string()) return InvalidArgumentError(Path(key), ": expected a string, got ", Shown(*v));
  *out = v->get<std::string>();
  return Status();
}

Result<JsonReader> JsonReader::Child(std::string_view key) {
  const nlohmann::json* v = Get(key);
  static const nlohmann::json empty = nlohmann::json::object();
  return Object(v == nullptr ? empty : *v, Path(key));
}

const nlohmann::json& JsonReader::Raw(std::string_view key) {
  const nlohmann::json* v = Get(key);
  return v == nullptr ? Null() : *v;
}

Status JsonReader::Finish() const {
  std::string unknown;
  for (auto it = j_.begin(); it != j_.end(); ++it) {
    if (read_.count(it.key()) == 0) unknown += (unknown.empty() ? "" : ", ") + Path(it.key());
  }
  if (!unknown.empty()) return InvalidArgumentError("unknown configuration key(s): ", unknown);
  return Status();
}

Result<nlohmann::json> ParseJson(std::string_view text, std::string_view what) {
  nlohmann::json j = nlohmann::json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    // Parse again for the position (the non-throwing parse does not report it).
    try {
      nlohmann::json again = nlohmann::json::parse(text.begin(), text.end());
      (void)again;
    } catch (const nlohmann::json::parse_error& e) {
      return InvalidArgumentError(what, ": not valid JSON at byte ", e.byte, ": ", e.what());
    }
    return InvalidArgumentError(what, ": not valid JSON");
  }
  return j;
}

Result<nlohmann::json> ReadJsonFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError("configuration file ", path, ": cannot be opened");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return IoError("configuration file ", path, ": read failed");
  return ParseJson(ss.str(), path);
}

}  // namespace zrt
