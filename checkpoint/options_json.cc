#include "zrt/checkpoint/options.h"

#include "zrt/core/json_reader.h"

namespace zrt::ckpt {

Result<CheckpointOptions> CheckpointOptionsFromJson(const nlohmann::json& j, const CheckpointOptions& defaults,
                                                    const std::string& path) {
  CheckpointOptions o = defaults;
  ASSIGN_OR_RETURN(JsonReader r, JsonReader::Object(j, path));
  RETURN_IF_ERROR(r.Read("root", &o.root));
  RETURN_IF_ERROR(r.Read("chunk_elements", &o.chunk_elements));
  RETURN_IF_ERROR(r.Read("keep_last", &o.keep_last));
  RETURN_IF_ERROR(r.Read("keep_every", &o.keep_every));
  RETURN_IF_ERROR(r.Read("writer_nice", &o.writer_nice));
  RETURN_IF_ERROR(r.Read("writer_threads", &o.writer_threads));
  RETURN_IF_ERROR(r.Read("staging_budget_bytes", &o.staging_budget_bytes));
  {
    ASSIGN_OR_RETURN(JsonReader c, r.Child("compression"));
    RETURN_IF_ERROR(c.Read<Codec>("codec", &o.compression.codec, ParseCodec));
    RETURN_IF_ERROR(c.Read("level", &o.compression.level));
    RETURN_IF_ERROR(c.Finish());
  }
  {
    ASSIGN_OR_RETURN(JsonReader io, r.Child("io"));
    RETURN_IF_ERROR(ReadIoOptions(io, &o.io));
  }
  if (j.is_object() && j.contains("memory")) {  // its presence turns the memory tier on
    MemoryTierOptions t = o.memory.value_or(MemoryTierOptions{});
    ASSIGN_OR_RETURN(JsonReader m, r.Child("memory"));
    RETURN_IF_ERROR(m.Read("dir", &t.dir));
    RETURN_IF_ERROR(m.Read("replicate", &t.replicate));
    RETURN_IF_ERROR(m.Read("ranks_per_node", &t.ranks_per_node));
    RETURN_IF_ERROR(m.Read("budget_bytes", &t.budget_bytes));
    RETURN_IF_ERROR(m.Finish());
    if (t.dir.empty()) return InvalidArgumentError(m.Path("dir"), ": must not be empty");
    if (t.ranks_per_node < 0) return InvalidArgumentError(m.Path("ranks_per_node"), ": must be >= 0 (0 = from the launcher)");
    if (t.budget_bytes < 0) return InvalidArgumentError(m.Path("budget_bytes"), ": must be >= 0 (0 = the free space of dir)");
    o.memory = t;
  }
  RETURN_IF_ERROR(r.Finish());
  if (o.chunk_elements < 1024 || o.chunk_elements % 1024 != 0) {
    return InvalidArgumentError(r.Path("chunk_elements"), ": must be a positive multiple of 1024, got ", o.chunk_elements);
  }
  if (o.keep_last < 0) return InvalidArgumentError(r.Path("keep_last"), ": must be >= 0 (0 = keep all)");
  if (o.keep_every < 0) return InvalidArgumentError(r.Path("keep_every"), ": must be >= 0 (0 = none)");
  if (o.staging_budget_bytes < 0) return InvalidArgumentError(r.Path("staging_budget_bytes"), ": must be >= 0 (0 = no bound)");
  return o;
}

}  // namespace zrt::ckpt
