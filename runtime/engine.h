// ZeroEngine: ZeRO stages 0-3 over a Communicator and a Device (../shared/DESIGN.md "Data flow").
//
// Use:
//   engine = ZeroEngine::Create(comm, device, config)
//   engine->AddParam("w1", {1024, 512}, DType::kBF16, "layer0") ... (same order on every rank)
//   engine->Finalize(init)                   // init fills fp32 values of a tensor range
//   each step, per micro-batch:
//     p = engine->Gather(g)                  // full parameters of group g (stage 3: all-gathered)
//     ... forward ... engine->Release(g)
//     gbuf = engine->GradBuffer(g)           // full gradient of group g, zeroed at first use; +=
//     ... backward ... engine->GradsReady(g) // queued for bucketed reduce-scatter (async)
//   result = engine->Step()
//
// Groups are the unit of gathering and reduction: each has one flat buffer (its tensors in
// registration order, ShardLayout-padded) and one dtype. Stage 0: all-reduce, full optimizer state on
// every rank. Stage 1: full params and grads, optimizer state sharded. Stage 2: gradients sharded too
// (a group's full gradient lives only from GradBuffer to GradsReady). Stage 3: parameters sharded too.
//
// Gradient accumulation: SetSync(false) for the first micro-steps (no communication; full gradients
// persist, also at stages 2-3), SetSync(true) before the last; gradients are divided by
// `grad_accum_steps` at the step. The trainer scales its loss by loss_scale() (fp16).
//
// Thread-safety: one thread at a time. Pointers returned by Gather/GradBuffer are valid until
// Release/GradsReady (stages 2-3) or the next Step.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "zrt/kernels/adam.h"
#include "zrt/core/communicator.h"
#include "zrt/core/device.h"
#include "zrt/offload/swapper.h"
#include "zrt/core/state_view.h"
#include "zrt/runtime/grad_bucketer.h"
#include "zrt/runtime/loss_scaler.h"

namespace zrt {

class Compute;

// Where state lives besides the device (ZeRO-Offload / ZeRO-Infinity); docs/configuration.md.
enum class OffloadTarget { kNone, kHost, kNvme };
Result<OffloadTarget> ParseOffloadTarget(std::string_view s);  // "none", "host", "nvme"
std::string_view OffloadTargetName(OffloadTarget t);

struct OffloadConfig {
  // fp32 master weights and Adam moments: device memory (none), host memory, or files under nvme_dir
  // streamed through host memory sub-group by sub-group at each step.
  OffloadTarget optimizer = OffloadTarget::kNone;
  // Stage 3 only: this rank's parameter shards in host memory or on NVMe (nvme needs optimizer = nvme),
  // read ahead of Gather() in the recorded prefetch order.
  OffloadTarget params = OffloadTarget::kNone;
  std::string nvme_dir;             // an existing directory; swap files go to <dir>/zrt-swap.rank<r>/
  int64_t host_budget_bytes = 0;    // bound on the host memory offload allocates (0: unbounded)
  int64_t sub_group_elements = 0;   // nvme: elements per streamed sub-group (0: the largest the budget allows)
  IoOptions io;                     // nvme: the I/O engine (backend, queue depth, block size)
};

struct EngineConfig {
  int stage = 2;                          // 0..3
  DType reduce_dtype = DType::kF32;       // gradient reductions: f32, or the model dtype (f32 accumulation)
  int64_t bucket_bytes = 32 << 20;        // per gradient bucket; two are allocated
  int64_t alignment = 64;                 // elements; each tensor and shard starts at a multiple
  int64_t max_live_gathered_bytes = int64_t{1} << 30;  // stage 3: bound for prefetching
  int prefetch_depth = 2;                 // stage 3: groups gathered ahead of use
  double max_grad_norm = 0;               // global-norm clipping; 0 = off
  int grad_accum_steps = 1;               // gradients are divided by this at the step
  LossScaleConfig loss_scale;             // fp16: dynamic; bf16/f32: none
  kernels::AdamConfig adam;               // defaults for every group (lr, weight decay per group settable)
  int optimizer_threads = 0;              // CPU Adam threads (caller included); <= 0: all hardware threads
  OffloadConfig offload;
};

struct StepResult {
  bool skipped = false;     // non-finite gradients on some rank: nothing was updated
  double grad_norm = 0;     // global pre-clip norm of the (unscaled, averaged) gradients
  double loss_scale = 1;    // the scale used for this step's gradients
  double lr = 0;            // of the first group
  int64_t step = 0;         // optimizer steps taken so far (skipped ones excluded)
};

class ZeroEngine {
 public:
  // comm and device must outlive the engine.
  static Result<std::unique_ptr<ZeroEngine>> Create(Communicator* comm, Device* device, const EngineConfig& config);
  ~ZeroEngine();

  // Registers a parameter (before Finalize). All parameters of a group share one dtype.
  Status AddParam(const std::string& name, const std::vector<int64_t>& shape, DType dtype,
                  const std::string& group = "default");

  // Initial values: init(param, offset, count, out) writes fp32 values of elements [offset,
  // offset+count) of parameter `param` (registration index). Each rank is asked only for its shard.
  using InitFn = std::function<void(int64_t param, int64_t offset, int64_t count, float* out)>;
  // Checks that every rank registered the same parameters (the error names the first that differs),
  // builds the layouts and allocates the buffers.
  Status Finalize(const InitFn& init);

  int num_groups() const;
  Result<int> GroupIndex(const std::string& name) const;
  // Where parameter `param` lives: its group and element offset in the group's full buffers.
  struct ParamLocation {
    int group;
    int64_t offset;
    int64_t numel;
    DType dtype;
  };
  Result<ParamLocation> Locate(int64_t param) const;

  Result<void*> Gather(int group);
  Status Release(int group);
  Result<void*> GradBuffer(int group);
  Status GradsReady(int group);
  void SetSync(bool sync) { sync_ = sync; }

  Result<StepResult> Step();

  Status SetLr(int group, double lr);
  Status SetWeightDecay(int group, double weight_decay);
  double loss_scale() const { return scaler_.scale(); }
  int64_t steps() const { return steps_; }

  // This rank's optimizer state, for checkpoints.
  StateView state_view();
  // After restoring master/moments through state_view() buffers: re-derive the model parameters.
  Status RefreshParamsFromMaster();
  // After a checkpoint load: the step counter and loss scaler state, then RefreshParamsFromMaster.
  Status Restore(int64_t step, const LossScaler::State& scaler);

  MemoryTracker::Snapshot memory() const;
  // Host memory taken by offload (state with offload = host; NVMe buffer sets), by category.
  MemoryTracker::Snapshot host_memory() const;
  // NVMe offload: the last Step's (or initialisation's) streaming figures; zeros otherwise.
  SwapStats swap_stats() const;
  // Communication bytes this rank moved so far (reductions and parameter gathers).
  CommStats comm_stats() const;

  struct Group;  // internal

 private:
  ZeroEngine(Communicator* comm, Device* device, const EngineConfig& config);
  Status CheckRegistration();
  Status Allocate(const InitFn& init);
  Status ParamsFromMaster(Group& g);  // cast master shard into the model params of this rank
  Status CreateSwapper(const InitFn* init);
  void* ParamsAt(Group& g, const StateSwapper::Window& w);  // where a window's updated parameters go
  // Adam over elements [offset, offset+count) of a group's shard, with the kernels of `c` (the device's,
  // or the CPU's for offloaded state); `grads` is the group's gradient shard where `c` can read it.
  Status UpdateRange(Group& g, Compute& c, const void* grads, const kernels::AdamStepScalars& s, int64_t offset,
                     int64_t count, float* master, float* m, float* v, float* vmax, void* params);
  // Offloaded optimizer with device memory the host cannot address: the host copies (mirrors) of the
  // gradient shard and of this rank's parameters. No-ops without mirrors.
  Status GradsDown(Group& g);
  Status ParamsUp(Group& g);
  Status PushParams();                      // ParamsUp of every group
  const void* HostGrads(Group& g) const;    // the gradient shard where the CPU can read it
  void* HostParams(Group& g) const;         // this rank's parameters where the CPU can write them
  Status StreamParamsFromMaster();  // nvme: cast every master sub-group into the parameter shards
  // This rank's block of the group's model parameters (stage 3: the parameter shard) and of its
  // reduced gradient (stages 0-1: inside the full gradient; 2-3: the gradient shard).
  void* OwnParams(Group& g) const;
  void* GradShard(Group& g) const;
  Status GatherUpdatedParams();
  Status ReduceGroup(int g);
  Result<Group*> Get(int group, const char* what);

  Communicator* comm_;
  Device* device_;
  EngineConfig config_;
  LossScaler scaler_;
  bool finalized_ = false;
  bool sync_ = true;
  int64_t steps_ = 0;
  std::vector<TensorSpec> params_;
  std::vector<std::string> param_groups_;
  std::vector<std::unique_ptr<Group>> groups_;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zrt
