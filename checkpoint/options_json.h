// CheckpointOptions from JSON (the "checkpoint" object of a trainer's configuration file;
// docs/configuration.md lists the keys): root, compression {codec, level}, chunk_elements, keep_last,
// keep_every, io {...}. Unknown keys and bad values are refused with their path.
#pragma once

#include <nlohmann/json.hpp>

#include "zrt/checkpoint/checkpointer.h"

namespace zrt::ckpt {

Result<CheckpointOptions> CheckpointOptionsFromJson(const nlohmann::json& j, const CheckpointOptions& defaults = {},
                                                    const std::string& path = "checkpoint");

}  // namespace zrt::ckpt
