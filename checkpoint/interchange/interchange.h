// What the interchange formats (safetensors, HDF5) share: the options of an import into a
// checkpoint and the renaming of tensors between zrt's names and another program's.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "zrt/core/status.h"

namespace zrt::ckpt {

struct ImportOptions {
  int world_size = 1;
  int stage = 3;  // recorded in the manifest; stage 0 gives one shard file
  int64_t alignment = 64;
};

// Renames tensors between two programs' conventions: exact names first (to "" drops the tensor),
// then the first prefix rule whose prefix the name starts with; other names stay as they are.
struct NameMap {
  std::map<std::string, std::string> exact;
  std::vector<std::pair<std::string, std::string>> prefixes;

  std::optional<std::string> Apply(const std::string& name) const;  // nullopt: dropped
  bool empty() const { return exact.empty() && prefixes.empty(); }
  // A JSON file: {"name": "new name" | null, ...}, or {"exact": {...}, "prefix": {"from": "to", ...}}.
  static Result<NameMap> FromJsonFile(const std::string& path);
  // A prefix rule written FROM=TO (the CLI's --rename).
  Status AddRule(const std::string& from_eq_to);
};

}  // namespace zrt::ckpt
