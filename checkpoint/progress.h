// Progress reports of long offline operations (reshard, export, import): done out of total, in the
// operation's unit (bytes where it can). Called on the caller's thread or a worker; may be empty.
#pragma once

#include <cstdint>
#include <functional>

namespace zrt::ckpt {

using ProgressFn = std::function<void(int64_t done, int64_t total)>;

}  // namespace zrt::ckpt
