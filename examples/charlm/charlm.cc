// charlm: a character-level language model trained with zrt end to end, on Debian's word list.
//
//   mpirun -n 4 charlm --stage 3 --steps 400 --ckpt /tmp/charlm-ckpt --every 50
//   mpirun -n 2 charlm --stage 3 --offload nvme --nvme-dir /mnt/nvme/swap   # ZeRO-Infinity
//   mpirun -n 8 charlm --device cuda --stage 3     # one GPU per rank, NCCL (CUDA builds)
//
// The model's forward/backward runs on the host (it is tiny); with --device cuda the engine's buffers,
// reductions, optimizer and checkpoint snapshots are on the GPU, and the trainer copies the gathered
// parameters down and its gradients up, as a trainer whose model runs elsewhere would.
// Each rank draws its own micro-batch; the data a rank sees at a step depends only on (seed, step,
// rank), so a run restarted from a checkpoint continues exactly as if nothing had happened (with the
// same number of ranks: bit for bit; with another number it continues from the same state). On
// start it resumes from the newest complete checkpoint under --ckpt; SIGTERM/SIGUSR1 make it save at
// the next step boundary and exit.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>

#include <zrt/zrt.h>
#if defined(ZRT_HAVE_NCCL)
#include <zrt/gpu.h>
#endif

#include "examples/charlm/model.h"

using namespace zrt;

namespace {

uint64_t Mix(uint64_t x) {  // splitmix64: the data order, independent of the world size's history
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
float Uniform(uint64_t key) { return static_cast<float>((Mix(key) >> 11) * 0x1.0p-53) * 2.0f - 1.0f; }

int Fail(const Status& s) {
  std::fprintf(stderr, "charlm: %s\n", s.ToString().c_str());
  return 1;
}

struct Options {
  int stage = 3, shard_group_size = 0, batch = 64, print_every = 25, every = 0, keep_last = 3, threads = 1;
  int64_t steps = 400, warmup = -1;
  double lr = 1e-2;
  uint64_t seed = 1234;
  std::string ckpt_root, dump, words_path = "/usr/share/dict/words", offload = "none", nvme_dir, device_name = "cpu", moments = "f32";
  int memory_every = 0, ranks_per_node = 0;
  std::string memory_dir = "/dev/shm";
  charlm::Dims dims;
};

void DeclareOptions(CLI::App& app, Options& o) {
  app.add_option("--stage", o.stage, "ZeRO stage 0-3")->check(CLI::Range(0, 3));
  app.add_option("--shard-group-size", o.shard_group_size, "hybrid sharding: shard over groups of this many ranks, replicate across (0: all, -1: a node)")
      ->check(CLI::Range(-1, 1 << 20));
  app.add_option("--steps", o.steps, "optimizer steps in total (a resumed run counts from its checkpoint)");
  app.add_option("--batch", o.batch, "examples per rank per step");
  app.add_option("--lr", o.lr, "peak learning rate");
  app.add_option("--warmup", o.warmup, "warmup steps of the cosine schedule (default: 20, at most a fifth of --steps)");
  app.add_option("--hidden", o.dims.hidden, "hidden units");
  app.add_option("--seed", o.seed, "data order and initialisation");
  app.add_option("--ckpt", o.ckpt_root, "checkpoint root (resume from its newest complete checkpoint)");
  app.add_option("--every", o.every, "save a checkpoint every N steps (0: only at the end)");
  app.add_option("--keep-last", o.keep_last, "keep the newest N checkpoints");
  app.add_option("--memory-every", o.memory_every, "memory-tier snapshot every N steps (0: off; with --ckpt)")->check(CLI::NonNegativeNumber);
  app.add_option("--memory-dir", o.memory_dir, "node-local memory for the tier (tmpfs)");
  app.add_option("--ranks-per-node", o.ranks_per_node, "replica placement (0: from the launcher; smaller emulates nodes)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--print-every", o.print_every, "log the loss every N steps");
  app.add_option("--dump", o.dump, "write the final parameters (raw float32) to this file");
  app.add_option("--words", o.words_path, "word list (one word per line)");
  app.add_option("--threads", o.threads, "optimizer threads per rank");
  app.add_option("--offload", o.offload, "optimizer state (and at stage 3 the parameter shards) in: none, host or nvme")
      ->check(CLI::IsMember({"none", "host", "nvme"}));
  app.add_option("--nvme-dir", o.nvme_dir, "directory for the NVMe swap files (--offload nvme)");
  app.add_option("--moments", o.moments, "Adam moments kept in f32, bf16, q8 or q4 (EngineConfig::state)")
      ->check(CLI::IsMember({"f32", "bf16", "q8", "q4"}));
  app.add_option("--device", o.device_name, "where the engine works: cpu, or cuda (one GPU per rank, NCCL)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
}

Result<std::vector<std::string>> ReadWords(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFoundError("cannot read the word list ", path, " (apt-get install wamerican)");
  std::vector<std::string> words;
  for (std::string w; std::getline(in, w);) words.push_back(w);
  return words;
}

// The engine's device and communicator: the host and MPI, or a GPU per rank and NCCL.
struct Backend {
  CpuDevice cpu;
  std::unique_ptr<Device> gpu;
  std::unique_ptr<Communicator> nccl;
  Device* device = &cpu;
  Communicator* comm = nullptr;
};

Status OpenBackend(const std::string& name, MpiCommunicator& world, Backend* b) {
  b->comm = &world;
  if (name != "cuda") return Status();
#if defined(ZRT_HAVE_NCCL)
  ASSIGN_OR_RETURN(std::unique_ptr<CudaDevice> gpu, CudaDevice::Create());
  ASSIGN_OR_RETURN(b->nccl, NcclCommunicator::Create(&world, gpu.get()));
  b->gpu = std::move(gpu);
  b->nccl->set_check_args(false);
  b->device = b->gpu.get();
  b->comm = b->nccl.get();
  return Status();
#else
  return UnavailableError("--device cuda: this build has no CUDA/NCCL");
#endif
}

Result<EngineConfig> MakeEngineConfig(const Options& o) {
  EngineConfig cfg;
  cfg.stage = o.stage;
  cfg.shard_group_size = o.shard_group_size;
  cfg.adam.lr = o.lr;
  cfg.adam.weight_decay = 1e-4;
  const int64_t warmup = o.warmup < 0 ? std::min<int64_t>(20, o.steps / 5) : o.warmup;  // a short run is mostly training
  cfg.lr_schedule = LrSchedule::Cosine(warmup, /*total=*/o.steps, /*min_lr_ratio=*/0.1);
  cfg.max_grad_norm = 1.0;
  cfg.optimizer_threads = o.threads;
  cfg.bucket_bytes = 1 << 20;
  ASSIGN_OR_RETURN(cfg.offload.optimizer, ParseOffloadTarget(o.offload));
  if (o.stage == 3) cfg.offload.params = cfg.offload.optimizer;
  cfg.offload.nvme_dir = o.nvme_dir;
  cfg.offload.sub_group_elements = 4096;  // a small model: several sub-groups per group, so the pipeline streams
  ASSIGN_OR_RETURN(cfg.state.exp_avg, ParsePrecision(o.moments));
  cfg.state.exp_avg_sq = cfg.state.exp_avg;
  cfg.state.q8_block = 64;  // the small layers' alignment holds whole blocks
  return cfg;
}

// The model's tensors in three gather groups (its layers); no weight decay on the embedding and the biases.
struct TensorDef {
  const char* name;
  std::vector<int64_t> shape;
  ParamOptions options;
  float init_scale;
};
std::vector<TensorDef> ModelTensors(const charlm::Dims& dims) {
  const int in = charlm::kContext * dims.dim;
  return {
      {"embed", {charlm::kVocab, dims.dim}, {.group = "embed", .weight_decay = 0}, 0.5f},
      {"w1", {dims.hidden, in}, {.group = "hidden"}, 1.0f / std::sqrt(static_cast<float>(in))},
      {"b1", {dims.hidden}, {.group = "hidden", .weight_decay = 0}, 0.0f},
      {"w2", {charlm::kVocab, dims.hidden}, {.group = "out"}, 0.5f / std::sqrt(static_cast<float>(dims.hidden))},
      {"b2", {charlm::kVocab}, {.group = "out", .weight_decay = 0}, 0.0f},
  };
}

// One rank's training: the engine, the model's tensors as the host sees them, the checkpointer.
class Trainer {
 public:
  Trainer(const Options& o, MpiCommunicator& comm, Backend& b) : o_(o), comm_(comm), b_(b), rank_(comm.rank()), world_(comm.size()) {}

  Status Build() {
    staging_ = HostMemory::Create(0, "checkpoint staging");  // checkpoints stage through host memory (pinned with CUDA)
    ASSIGN_OR_RETURN(const EngineConfig cfg, MakeEngineConfig(o_));
    ASSIGN_OR_RETURN(engine_, ZeroEngine::Create(b_.comm, b_.device, cfg));
    const std::vector<TensorDef> tensors = ModelTensors(o_.dims);
    for (const TensorDef& t : tensors) {
      ASSIGN_OR_RETURN(const ParamHandle h, engine_->AddParam(t.name, t.shape, DType::kF32, t.options));
      handles_.push_back(h);
    }
    const uint64_t seed = o_.seed;
    return engine_->Finalize([&](int64_t p, int64_t off, int64_t n, float* out) {
      for (int64_t i = 0; i < n; ++i) {
        out[i] = tensors[static_cast<size_t>(p)].init_scale * Uniform(seed * 977 + static_cast<uint64_t>(p) * 1000003 + static_cast<uint64_t>(off + i));
      }
    });
  }

  // The newest state every rank can load (memory tier, then disk, older ones if it cannot), restored.
  Status StartFrom(size_t examples, size_t words) {
    if (!o_.ckpt_root.empty()) {
      ckpt::CheckpointOptions co;
      co.root = o_.ckpt_root;
      co.keep_last = o_.keep_last;
      if (o_.memory_every > 0) co.memory = ckpt::MemoryTierOptions{.dir = o_.memory_dir, .ranks_per_node = o_.ranks_per_node};
      ASSIGN_OR_RETURN(ck_, ckpt::Checkpointer::Create(&comm_, staging_.get(), co));
      ckpt::InstallPreemptionHandler();
      auto r = ck_->Resume(engine_->state_view());
      if (r.ok()) {
        RETURN_IF_ERROR(Resumed(*r));
      } else if (r.status().code() != StatusCode::kNotFound) {
        return r.status();
      }
    }
    if (rank_ == 0 && resumed_from_.empty()) {
      std::printf("charlm: %zu examples from %zu words, %d ranks, stage %d, offload %s, %lld steps\n", examples, words, world_, o_.stage,
                  o_.offload.c_str(), static_cast<long long>(o_.steps));
    }
    return Status();
  }

  // One optimizer step on this rank's micro-batch for it; `loss`: the mean over the ranks.
  Result<StepResult> Step(const std::vector<charlm::Example>& data, float* loss) {
    const int64_t step = engine_->steps();
    mb_.resize(static_cast<size_t>(o_.batch));
    for (int k = 0; k < o_.batch; ++k) {
      const uint64_t key = static_cast<uint64_t>(step) * 4099 + static_cast<uint64_t>(rank_) * 131 + static_cast<uint64_t>(k);
      mb_[static_cast<size_t>(k)] = data[Mix(o_.seed ^ Mix(key)) % data.size()];
    }
    // Forward + backward need every group's parameters and gradients.
    for (int g = 0; g < engine_->num_groups(); ++g) RETURN_IF_ERROR(engine_->Gather(g).status());
    float* pv[5];
    float* gv[5];
    for (size_t t = 0; t < 5; ++t) {
      ASSIGN_OR_RETURN(pv[t], ParamsView(t));
      ASSIGN_OR_RETURN(gv[t], GradsView(t));
    }
    charlm::Tensors gr{gv[0], gv[1], gv[2], gv[3], gv[4]};
    const double l = charlm::ForwardBackward(o_.dims, {pv[0], pv[1], pv[2], pv[3], pv[4]}, mb_.data(), o_.batch, &gr);
    for (size_t t = 0; t < 5; ++t) RETURN_IF_ERROR(GradsUp(t));
    for (int g = engine_->num_groups() - 1; g >= 0; --g) {
      RETURN_IF_ERROR(engine_->Release(g));
      RETURN_IF_ERROR(engine_->GradsReady(g));
    }
    ASSIGN_OR_RETURN(StepResult r, engine_->Step());
    *loss = static_cast<float>(l);
    RETURN_IF_ERROR(comm_.AllReduce(loss, loss, 1, DType::kF32, ReduceOp::kAvg));
    last_loss_ = *loss;
    return r;
  }

  // After a step: the log line, the saves it is due, and a preemption (*stop: saved, exit now).
  Status AfterStep(const StepResult& r, float loss, bool* stop) {
    if (rank_ == 0 && (r.step % o_.print_every == 0 || r.step == o_.steps)) {
      std::printf("step %5lld  loss %.4f  grad norm %.3f  lr %.2e\n", static_cast<long long>(r.step), loss, r.grad_norm, r.lr);
      std::fflush(stdout);
    }
    if (!ck_) return Status();
    if (o_.every > 0 && r.step % o_.every == 0 && r.step < o_.steps) RETURN_IF_ERROR(Save(r.step));
    if (o_.memory_every > 0 && r.step % o_.memory_every == 0) RETURN_IF_ERROR(ck_->SaveToMemory(engine_->state_view(), TrainerState(r.step)));
    RETURN_IF_ERROR(ck_->Poll());  // commits a save once every rank has written it
    auto pre = ckpt::PreemptionRequested(&comm_);
    if (pre.ok() && *pre) {
      if (rank_ == 0) std::printf("preempted: saving step %lld and exiting\n", static_cast<long long>(r.step));
      RETURN_IF_ERROR(Save(r.step));
      RETURN_IF_ERROR(ck_->Wait());
      *stop = true;
    }
    return Status();
  }

  // The last save, then the final parameters (gathered): sampled words, the dump, the summary.
  Status Finish(double seconds) {
    if (ck_) {
      RETURN_IF_ERROR(Save(engine_->steps()));
      RETURN_IF_ERROR(ck_->Wait());
      stall_total_ += ck_->last_stats().stall_seconds;
    }
    std::vector<float> all;
    float* pv[5];
    for (int g = 0; g < engine_->num_groups(); ++g) RETURN_IF_ERROR(engine_->Gather(g).status());
    for (size_t t = 0; t < 5; ++t) {
      ASSIGN_OR_RETURN(pv[t], ParamsView(t));
      all.insert(all.end(), pv[t], pv[t] + engine_->spec(handles_[t]).numel());
    }
    if (rank_ == 0) Report({pv[0], pv[1], pv[2], pv[3], pv[4]}, all, seconds);
    for (int g = 0; g < engine_->num_groups(); ++g) (void)engine_->Release(g);
    return Status();
  }

  int64_t steps() const { return engine_->steps(); }

 private:
  Status Resumed(const ckpt::ResumeResult& r) {
    const ckpt::LoadResult& l = r.loaded;
    if (l.trainer_state.value("seed", uint64_t{0}) != o_.seed) {
      return InvalidArgumentError("checkpoint ", r.dir, " was trained with seed ", l.trainer_state.value("seed", uint64_t{0}));
    }
    resumed_from_ = r.dir;
    if (r.source == "peer") std::printf("rank %d: its own memory-tier copy was unusable; restored from its peer's replica\n", rank_);
    if (rank_ == 0) {
      std::printf("resumed from %s (%s): step %lld, saved by %d rank(s) at stage %d, now %d rank(s) at stage %d\n", r.dir.c_str(),
                  r.source.c_str(), static_cast<long long>(l.counters.step), l.saved_world_size, l.saved_stage, world_, o_.stage);
      for (const std::string& s : r.skipped) std::printf("  (skipped %s)\n", s.c_str());
    }
    return Status();
  }

  void Report(const charlm::Tensors& p, const std::vector<float>& all, double seconds) const {
    std::printf("generated words:");
    for (int i = 0; i < 10; ++i) std::printf(" %s", charlm::Sample(o_.dims, p, o_.seed + static_cast<uint64_t>(i)).c_str());
    std::printf("\n");
    if (!o_.dump.empty()) {
      std::ofstream out(o_.dump, std::ios::binary | std::ios::trunc);
      out.write(reinterpret_cast<const char*>(all.data()), static_cast<std::streamsize>(all.size() * 4));
    }
    std::printf("memory per rank (peak):\n%s", engine_->memory().ToString().c_str());
    std::printf("SUMMARY steps=%lld final_loss=%.4f checkpoints=%d stall_per_save_ms=%.3f resumed_from=%s seconds=%.1f\n",
                static_cast<long long>(engine_->steps()), last_loss_, saves_, saves_ ? 1e3 * stall_total_ / saves_ : 0.0,
                resumed_from_.empty() ? "-" : resumed_from_.c_str(), seconds);
  }

  nlohmann::json TrainerState(int64_t step) const { return {{"seed", o_.seed}, {"examples_seen", step * o_.batch * world_}}; }

  Status Save(int64_t step) {
    if (saves_ > 0) stall_total_ += ck_->last_stats().stall_seconds;  // the previous save's stall, the next step's wait included
    RETURN_IF_ERROR(ck_->SaveAsync(engine_->state_view(), TrainerState(step)));
    ++saves_;
    return Status();
  }

  // The model's tensors, by handle. Device memory the host cannot address: the model works on host
  // copies (parameters copied down after the gather, gradients up before GradsReady).
  bool staged() const { return !b_.device->host_accessible(); }
  Result<float*> ParamsView(size_t t) {
    ASSIGN_OR_RETURN(TensorView v, engine_->Param(handles_[t]));
    if (!staged()) return v.as<float>().data();
    host_params_[t].resize(static_cast<size_t>(v.numel()));
    RETURN_IF_ERROR(b_.device->Copy(host_params_[t].data(), v.data, host_params_[t].size() * 4));
    return host_params_[t].data();
  }
  Result<float*> GradsView(size_t t) {
    ASSIGN_OR_RETURN(TensorView v, engine_->Grad(handles_[t]));
    if (!staged()) return v.as<float>().data();
    host_grads_[t].assign(static_cast<size_t>(v.numel()), 0.0f);
    return host_grads_[t].data();
  }
  Status GradsUp(size_t t) {
    if (!staged()) return Status();
    ASSIGN_OR_RETURN(TensorView v, engine_->Grad(handles_[t]));
    return b_.device->Copy(v.data, host_grads_[t].data(), host_grads_[t].size() * 4);
  }

  const Options& o_;
  MpiCommunicator& comm_;
  Backend& b_;
  const int rank_, world_;
  std::unique_ptr<HostMemory> staging_;
  std::unique_ptr<ZeroEngine> engine_;
  std::unique_ptr<ckpt::Checkpointer> ck_;
  std::vector<ParamHandle> handles_;
  std::vector<float> host_params_[5], host_grads_[5];
  std::vector<charlm::Example> mb_;
  std::string resumed_from_;
  float last_loss_ = 0;
  double stall_total_ = 0;
  int saves_ = 0;
};

Status Run(const Options& o, MpiCommunicator& comm) {
  ASSIGN_OR_RETURN(const std::vector<std::string> words, ReadWords(o.words_path));
  const std::vector<charlm::Example> data = charlm::BuildExamples(words);
  if (data.empty()) return InvalidArgumentError("no usable words in ", o.words_path);
  Backend backend;
  RETURN_IF_ERROR(OpenBackend(o.device_name, comm, &backend));
  Trainer trainer(o, comm, backend);
  RETURN_IF_ERROR(trainer.Build());
  RETURN_IF_ERROR(trainer.StartFrom(data.size(), words.size()));
  const auto t0 = std::chrono::steady_clock::now();
  while (trainer.steps() < o.steps) {
    float loss = 0;
    ASSIGN_OR_RETURN(const StepResult r, trainer.Step(data, &loss));
    bool stop = false;
    RETURN_IF_ERROR(trainer.AfterStep(r, loss, &stop));
    if (stop) return Status();
  }
  return trainer.Finish(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"charlm: a character-level language model trained with zrt"};
  Options o;
  DeclareOptions(app, o);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  auto session = MpiSession::Init(&argc, &argv);
  if (!session.ok()) return Fail(session.status());
  auto comm = MpiCommunicator::Create(MPI_COMM_WORLD);
  if (!comm.ok()) return Fail(comm.status());
  const Status st = Run(o, **comm);
  return st.ok() ? 0 : Fail(st);
}
