// The optimizer store's two placements (optimizer_store.h), each a file of its own: resident
// (device or host memory: resident_store.cc) and swapped (NVMe swap files: swapped_store.cc).
// OptimizerStore::Create picks one. Internal to zrt_runtime.
#pragma once

#include <future>
#include <memory>
#include <vector>

#include "zrt/offload/io_engine.h"
#include "zrt/core/thread_pool.h"
#include "zrt/runtime/optimizer_store.h"

namespace zrt {

// The copies of one Update around the per-group work (optimizer_store.h), shared by both placements.
class OptimizerStore::Copies {
 public:
  explicit Copies(OptimizerStore& s) : s_(s), down_(s.slots_.size()), up_(s.slots_.size()) {
    if (!s_.copier_) return;
    for (size_t g = 0; g < down_.size(); ++g) down_[g] = s_.copier_->Submit([this, g] { return s_.GradsDown(s_.slots_[g]); });
  }
  ~Copies() { (void)Finish(Status()); }
  // Before group g's work: the groups before it are done (their parameters go up); g's gradients are here.
  Status Begin(size_t g) {
    for (; s_.copier_ && next_up_ < g; ++next_up_) {
      up_[next_up_] = s_.copier_->Submit([this, k = next_up_] { return s_.ParamsUp(s_.slots_[k]); });
    }
    return g < down_.size() && down_[g].valid() ? down_[g].get() : Status();
  }
  // The last parameters go up; every copy is waited for, even after an error (the first error wins).
  Status Finish(Status st) {
    if (st.ok()) st = Begin(down_.size());
    for (auto* fs : {&down_, &up_}) {
      for (auto& f : *fs) {
        if (!f.valid()) continue;
        Status c = f.get();
        if (st.ok()) st = std::move(c);
      }
    }
    return st;
  }

 private:
  OptimizerStore& s_;
  std::vector<std::future<Status>> down_, up_;
  size_t next_up_ = 0;
};

}  // namespace zrt

namespace zrt::internal {

std::unique_ptr<OptimizerStore> MakeResidentStore(Communicator* comm, Device* device, Compute* compute, HostMemory* host, Compute* host_compute,
                                                  const OptimizerStore::Options& o);
std::unique_ptr<OptimizerStore> MakeSwappedStore(Communicator* comm, Device* device, Compute* compute, HostMemory* host, Compute* host_compute,
                                                 const OptimizerStore::Options& o, std::unique_ptr<IoEngine> io);

}  // namespace zrt::internal
