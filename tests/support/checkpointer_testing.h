// A Checkpointer whose file I/O and durability steps go through test hooks (the fault-injection seam:
// offload/io_engine.h IoHooks; tests/support/io_hooks.h builds them from lambdas).
#pragma once

#include <memory>

#include "zrt/checkpoint/checkpointer.h"
#include "zrt/offload/io_engine.h"

namespace zrt::ckpt::internal {

struct CheckpointerTesting {
  // `hooks` must outlive the checkpointer.
  static Result<std::unique_ptr<Checkpointer>> Create(Communicator* comm, Device* device, const CheckpointOptions& o,
                                                      IoHooks* hooks) {
    return Checkpointer::Create(comm, device, o, hooks);
  }
};

}  // namespace zrt::ckpt::internal
