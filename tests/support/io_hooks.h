// IoHooks from lambdas, for fault-injection tests (the seam is offload/io_engine.h's IoHooks).
// Each function may be empty (no fault). They run on the engine's threads: capture atomics.
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "zrt/offload/io_engine.h"

namespace zrt::testing {

struct FnIoHooks final : IoHooks {
  std::function<int(bool write, const std::string& path, int64_t offset, size_t* len)> transfer;
  std::function<int(std::string_view op, const std::string& path)> file_op;
  std::function<int()> ring_wait;

  int BeforeTransfer(bool write, const std::string& path, int64_t offset, size_t* len) override {
    return transfer ? transfer(write, path, offset, len) : 0;
  }
  int BeforeFileOp(std::string_view op, const std::string& path) override { return file_op ? file_op(op, path) : 0; }
  int BeforeRingWait() override { return ring_wait ? ring_wait() : 0; }
};

}  // namespace zrt::testing
