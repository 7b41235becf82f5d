#include "zrt/offload/io_options.h"

#include "zrt/core/json_reader.h"

namespace zrt {

namespace {

Result<IoOptions::Backend> ParseIoBackend(std::string_view s) {
  if (s == "auto") return IoOptions::Backend::kAuto;
  if (s == "uring" || s == "io_uring") return IoOptions::Backend::kUring;
  if (s == "threads") return IoOptions::Backend::kThreads;
  return InvalidArgumentError("io backend must be auto, uring or threads, got '", s, "'");
}

}  // namespace

Status ReadIoOptions(JsonReader& r, IoOptions* io) {
  RETURN_IF_ERROR(r.Read<IoOptions::Backend>("backend", &io->backend, ParseIoBackend));
  RETURN_IF_ERROR(r.Read("queue_depth", &io->queue_depth));
  RETURN_IF_ERROR(r.Read("block_bytes", &io->block_bytes));
  RETURN_IF_ERROR(r.Read("threads", &io->threads));
  if (io->queue_depth < 1) return InvalidArgumentError(r.Path("queue_depth"), ": must be >= 1");
  if (io->block_bytes < 1) return InvalidArgumentError(r.Path("block_bytes"), ": must be >= 1");
  if (io->threads < 1) return InvalidArgumentError(r.Path("threads"), ": must be >= 1");
  return r.Finish();
}

}  // namespace zrt
