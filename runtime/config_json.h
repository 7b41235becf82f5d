// Configuration from JSON: every EngineConfig field under the same names (docs/configuration.md is
// the reference), starting from `defaults`; unknown keys and bad values are refused with their path
// ("engine.offload.optimizr: unknown configuration key"). The checkpoint's options parse with
// ckpt::CheckpointOptionsFromJson, so one file configures a trainer:
//   {"engine": {...}, "checkpoint": {...}, "trainer": {... the trainer's own ...}}
//   ASSIGN_OR_RETURN(nlohmann::json j, zrt::ReadJsonFile(flag));
//   ASSIGN_OR_RETURN(EngineConfig cfg, zrt::EngineConfigFromJson(j.value("engine", nlohmann::json::object())));
#pragma once

#include <nlohmann/json.hpp>

#include "zrt/core/json_reader.h"
#include "zrt/offload/io_options.h"
#include "zrt/runtime/engine_config.h"

namespace zrt {

Result<EngineConfig> EngineConfigFromJson(const nlohmann::json& j, const EngineConfig& defaults = {},
                                          const std::string& path = "engine");

}  // namespace zrt
