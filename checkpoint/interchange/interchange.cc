// NameMap (interchange.h): renaming tensors between zrt's names and another program's.
#include "zrt/checkpoint/interchange/interchange.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "zrt/checkpoint/fs_util.h"

namespace zrt::ckpt {

using nlohmann::json;


std::optional<std::string> NameMap::Apply(const std::string& name) const {
  if (auto it = exact.find(name); it != exact.end()) {
    if (it->second.empty()) return std::nullopt;
    return it->second;
  }
  for (const auto& [from, to] : prefixes) {
    if (name.compare(0, from.size(), from) == 0) return to + name.substr(from.size());
  }
  return name;
}

Status NameMap::AddRule(const std::string& rule) {
  const size_t eq = rule.find('=');
  if (eq == std::string::npos) return InvalidArgumentError("--rename '", rule, "': expected FROM=TO (a name prefix and its replacement)");
  prefixes.emplace_back(rule.substr(0, eq), rule.substr(eq + 1));
  return Status();
}

Result<NameMap> NameMap::FromJsonFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadWholeFile(path), "name map");
  json j = json::parse(text, nullptr, false);
  if (!j.is_object()) return InvalidArgumentError("name map ", path, ": not a JSON object");
  NameMap m;
  auto exact = [&](const json& o, const std::string& where) -> Status {
    for (auto it = o.begin(); it != o.end(); ++it) {
      if (it->is_null()) m.exact[it.key()] = "";
      else if (it->is_string() && !it->get<std::string>().empty()) m.exact[it.key()] = it->get<std::string>();
      else return InvalidArgumentError("name map ", path, ": ", where, "\"", it.key(), "\" must map to a name or null (drop it)");
    }
    return Status();
  };
  const bool structured = j.contains("exact") || j.contains("prefix");
  if (!structured) {
    RETURN_IF_ERROR(exact(j, ""));
    return m;
  }
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() != "exact" && it.key() != "prefix") return InvalidArgumentError("name map ", path, ": unknown key \"", it.key(), "\"");
    if (!it->is_object()) return InvalidArgumentError("name map ", path, ": \"", it.key(), "\" must be an object");
  }
  if (j.contains("exact")) RETURN_IF_ERROR(exact(j["exact"], "exact: "));
  if (j.contains("prefix")) {
    for (auto it = j["prefix"].begin(); it != j["prefix"].end(); ++it) {
      if (!it->is_string()) return InvalidArgumentError("name map ", path, ": prefix \"", it.key(), "\" must map to a string");
      m.prefixes.emplace_back(it.key(), it->get<std::string>());
    }
    // Longest prefix first, so that a more specific rule wins whatever the file's key order.
    std::stable_sort(m.prefixes.begin(), m.prefixes.end(), [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  }
  return m;
}

}  // namespace zrt::ckpt
