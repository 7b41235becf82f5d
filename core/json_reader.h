// JsonReader: reads a JSON configuration object field by field, so that every error names the
// field's path ("engine.offload.host_budget_bytes: expected an integer, got \"2G\"") and a key
// nobody read is refused (Finish) instead of silently ignored, as a typo would be.
//
//   ASSIGN_OR_RETURN(JsonReader r, JsonReader::Object(j, "engine"));
//   RETURN_IF_ERROR(r.Read("stage", &cfg.stage));        // absent: cfg.stage keeps its default
//   ASSIGN_OR_RETURN(JsonReader off, r.Child("offload")); ... RETURN_IF_ERROR(off.Finish());
//   RETURN_IF_ERROR(r.Finish());
//
// Not thread-safe. A reader holds its own copy of the object (configurations are small), so it may
// be made from a temporary.
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "zrt/core/status.h"

namespace zrt {

class JsonReader {
 public:
  // j must be an object; `path` names it in errors ("engine").
  static Result<JsonReader> Object(const nlohmann::json& j, std::string path);

  // Each Read leaves *out unchanged when the key is absent; a present key of the wrong type or out of
  // range is an error naming its path. Integers must be JSON integers (1.5 and "8" are refused).
  Status Read(std::string_view key, bool* out);
  Status Read(std::string_view key, int* out);
  Status Read(std::string_view key, int64_t* out);
  Status Read(std::string_view key, double* out);
  Status Read(std::string_view key, std::string* out);
  // A string parsed by `parse` (an enum's name), whose error is given the path.
  template <typename T>
  Status Read(std::string_view key, T* out, const std::function<Result<T>(std::string_view)>& parse) {
    std::string s;
    if (!has(key)) return Status();
    RETURN_IF_ERROR(Read(key, &s));
    ASSIGN_OR_RETURN(*out, parse(s), Path(key));
    return Status();
  }
  // A nested object (absent: an empty one, so defaults stay).
  Result<JsonReader> Child(std::string_view key);
  // The raw value of a key the caller interprets itself (marked as read); null when absent. Valid
  // while the reader lives.
  const nlohmann::json& Raw(std::string_view key);

  bool has(std::string_view key) const;
  const std::string& path() const { return path_; }
  std::string Path(std::string_view key) const;
  // Error if the object has a key no Read/Child/Raw asked for (lists them, with their paths).
  Status Finish() const;

 private:
  JsonReader(nlohmann::json j, std::string path) : j_(std::move(j)), path_(std::move(path)) {}
  const nlohmann::json* Get(std::string_view key);
  nlohmann::json j_;
  std::string path_;
  std::set<std::string, std::less<>> read_;
};

// The JSON text of a file or string; a syntax error names the file (or `what`) and the byte offset.
Result<nlohmann::json> ReadJsonFile(const std::string& path);
Result<nlohmann::json> ParseJson(std::string_view text, std::string_view what);

}  // namespace zrt
