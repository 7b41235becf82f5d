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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"charlm: a character-level language model trained with zrt"};
  int stage = 3, shard_group_size = 0, batch = 64, print_every = 25, every = 0, keep_last = 3, threads = 1;
  int64_t steps = 400, warmup = -1;
  double lr = 1e-2;
  uint64_t seed = 1234;
  std::string ckpt_root, dump, words_path = "/usr/share/dict/words", offload = "none", nvme_dir, device_name = "cpu", moments = "f32";
  charlm::Dims dims;
  app.add_option("--stage", stage, "ZeRO stage 0-3")->check(CLI::Range(0, 3));
  app.add_option("--shard-group-size", shard_group_size, "hybrid sharding: shard over groups of this many ranks, replicate across (0: all, -1: a node)")
      ->check(CLI::Range(-1, 1 << 20));
  app.add_option("--steps", steps, "optimizer steps in total (a resumed run counts from its checkpoint)");
  app.add_option("--batch", batch, "examples per rank per step");
  app.add_option("--lr", lr, "peak learning rate");
  app.add_option("--warmup", warmup, "warmup steps of the cosine schedule (default: 20, at most a fifth of --steps)");
  app.add_option("--hidden", dims.hidden, "hidden units");
  app.add_option("--seed", seed, "data order and initialisation");
  app.add_option("--ckpt", ckpt_root, "checkpoint root (resume from its newest complete checkpoint)");
  app.add_option("--every", every, "save a checkpoint every N steps (0: only at the end)");
  app.add_option("--keep-last", keep_last, "keep the newest N checkpoints");
  int memory_every = 0, ranks_per_node = 0;
  std::string memory_dir = "/dev/shm";
  app.add_option("--memory-every", memory_every, "memory-tier snapshot every N steps (0: off; with --ckpt)")->check(CLI::NonNegativeNumber);
  app.add_option("--memory-dir", memory_dir, "node-local memory for the tier (tmpfs)");
  app.add_option("--ranks-per-node", ranks_per_node, "replica placement (0: from the launcher; smaller emulates nodes)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--print-every", print_every, "log the loss every N steps");
  app.add_option("--dump", dump, "write the final parameters (raw float32) to this file");
  app.add_option("--words", words_path, "word list (one word per line)");
  app.add_option("--threads", threads, "optimizer threads per rank");
  app.add_option("--offload", offload, "optimizer state (and at stage 3 the parameter shards) in: none, host or nvme")
      ->check(CLI::IsMember({"none", "host", "nvme"}));
  app.add_option("--nvme-dir", nvme_dir, "directory for the NVMe swap files (--offload nvme)");
  app.add_option("--moments", moments, "Adam moments kept in f32, bf16 or q8 (EngineConfig::state)")->check(CLI::IsMember({"f32", "bf16", "q8"}));
  app.add_option("--device", device_name, "where the engine works: cpu, or cuda (one GPU per rank, NCCL)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  auto session = MpiSession::Init(&argc, &argv);
  if (!session.ok()) return Fail(session.status());
  auto comm_or = MpiCommunicator::Create(MPI_COMM_WORLD);
  if (!comm_or.ok()) return Fail(comm_or.status());
  MpiCommunicator& comm = **comm_or;
  const int rank = comm.rank(), world = comm.size();

  std::vector<std::string> words;
  {
    std::ifstream in(words_path);
    if (!in) return Fail(NotFoundError("cannot read the word list ", words_path, " (apt-get install wamerican)"));
    for (std::string w; std::getline(in, w);) words.push_back(w);
  }
  const std::vector<charlm::Example> data = charlm::BuildExamples(words);
  if (data.empty()) return Fail(InvalidArgumentError("no usable words in ", words_path));

  // The engine's device and communicator; checkpoints stage through host memory (pinned with CUDA).
  CpuDevice cpu;
  Device* device = &cpu;
  Communicator* engine_comm = &comm;
  std::unique_ptr<Device> gpu;
  std::unique_ptr<Communicator> nccl;
  if (device_name == "cuda") {
#if defined(ZRT_HAVE_NCCL)
    auto g = CudaDevice::Create();
    if (!g.ok()) return Fail(g.status());
    auto n = NcclCommunicator::Create(&comm, g->get());
    if (!n.ok()) return Fail(n.status());
    (*n)->set_check_args(false);
    gpu = std::move(*g);
    nccl = std::move(*n);
    device = gpu.get();
    engine_comm = nccl.get();
#else
    return Fail(UnavailableError("--device cuda: this build has no CUDA/NCCL"));
#endif
  }
  auto staging = HostMemory::Create(0, "checkpoint staging");
  EngineConfig cfg;
  cfg.stage = stage;
  cfg.shard_group_size = shard_group_size;
  cfg.adam.lr = lr;
  cfg.adam.weight_decay = 1e-4;
  if (warmup < 0) warmup = std::min<int64_t>(20, steps / 5);  // a short run is mostly training, not warmup
  cfg.lr_schedule = LrSchedule::Cosine(warmup, /*total=*/steps, /*min_lr_ratio=*/0.1);
  cfg.max_grad_norm = 1.0;
  cfg.optimizer_threads = threads;
  cfg.bucket_bytes = 1 << 20;
  auto target = ParseOffloadTarget(offload);
  if (!target.ok()) return Fail(target.status());
  cfg.offload.optimizer = *target;
  if (stage == 3) cfg.offload.params = *target;
  cfg.offload.nvme_dir = nvme_dir;
  cfg.offload.sub_group_elements = 4096;  // a small model: several sub-groups per group, so the pipeline streams
  auto moment_format = kernels::ParseMomentFormat(moments);
  if (!moment_format.ok()) return Fail(moment_format.status());
  cfg.state.exp_avg = cfg.state.exp_avg_sq = *moment_format;
  cfg.state.q8_block = 64;  // the small layers' alignment holds whole blocks
  auto engine_or = ZeroEngine::Create(engine_comm, device, cfg);
  if (!engine_or.ok()) return Fail(engine_or.status());
  ZeroEngine& engine = **engine_or;
  const int in = charlm::kContext * dims.dim;
  // Three gather groups (the model's layers); no weight decay on the embedding and the biases.
  const struct {
    const char* name;
    std::vector<int64_t> shape;
    ParamOptions options;
    float init_scale;
  } tensors[] = {
      {"embed", {charlm::kVocab, dims.dim}, {.group = "embed", .weight_decay = 0}, 0.5f},
      {"w1", {dims.hidden, in}, {.group = "hidden"}, 1.0f / std::sqrt(static_cast<float>(in))},
      {"b1", {dims.hidden}, {.group = "hidden", .weight_decay = 0}, 0.0f},
      {"w2", {charlm::kVocab, dims.hidden}, {.group = "out"}, 0.5f / std::sqrt(static_cast<float>(dims.hidden))},
      {"b2", {charlm::kVocab}, {.group = "out", .weight_decay = 0}, 0.0f},
  };
  std::vector<ParamHandle> handles;
  for (const auto& t : tensors) {
    auto h = engine.AddParam(t.name, t.shape, DType::kF32, t.options);
    if (!h.ok()) return Fail(h.status());
    handles.push_back(*h);
  }
  Status st;
  st = engine.Finalize([&](int64_t p, int64_t off, int64_t n, float* out) {
    for (int64_t i = 0; i < n; ++i) out[i] = tensors[p].init_scale * Uniform(seed * 977 + static_cast<uint64_t>(p) * 1000003 + static_cast<uint64_t>(off + i));
  });
  if (!st.ok()) return Fail(st);

  std::unique_ptr<ckpt::Checkpointer> ck;
  std::string resumed_from;
  if (!ckpt_root.empty()) {
    ckpt::CheckpointOptions co;
    co.root = ckpt_root;
    co.keep_last = keep_last;
    if (memory_every > 0) co.memory = ckpt::MemoryTierOptions{.dir = memory_dir, .ranks_per_node = ranks_per_node};
    auto ck_or = ckpt::Checkpointer::Create(&comm, staging.get(), co);
    if (!ck_or.ok()) return Fail(ck_or.status());
    ck = std::move(*ck_or);
    ckpt::InstallPreemptionHandler();
    // The newest state every rank can load — memory tier, then disk, older ones if it cannot — the
    // engine restored.
    auto r = ck->Resume(engine.state_view());
    if (r.ok()) {
      const ckpt::LoadResult& l = r->loaded;
      if (l.trainer_state.value("seed", uint64_t{0}) != seed) {
        return Fail(InvalidArgumentError("checkpoint ", r->dir, " was trained with seed ", l.trainer_state.value("seed", uint64_t{0})));
      }
      resumed_from = r->dir;
      if (r->source == "peer") std::printf("rank %d: its own memory-tier copy was unusable; restored from its peer's replica\n", rank);
      if (rank == 0) {
        std::printf("resumed from %s (%s): step %lld, saved by %d rank(s) at stage %d, now %d rank(s) at stage %d\n", r->dir.c_str(),
                    r->source.c_str(), static_cast<long long>(l.counters.step), l.saved_world_size, l.saved_stage, world, stage);
        for (const std::string& s : r->skipped) std::printf("  (skipped %s)\n", s.c_str());
      }
    } else if (r.status().code() != StatusCode::kNotFound) {
      return Fail(r.status());
    }
  }
  if (rank == 0 && resumed_from.empty()) {
    std::printf("charlm: %zu examples from %zu words, %d ranks, stage %d, offload %s, %lld steps\n", data.size(), words.size(),
                world, stage, offload.c_str(), static_cast<long long>(steps));
  }

  // The model's tensors, by handle. Device memory the host cannot address: the model works on host
  // copies (parameters copied down after the gather, gradients up before GradsReady).
  const bool staged = !device->host_accessible();
  std::vector<float> host_params[5], host_grads[5];
  auto params_view = [&](size_t t) -> Result<float*> {
    ASSIGN_OR_RETURN(TensorView v, engine.Param(handles[t]));
    if (!staged) return v.as<float>().data();
    host_params[t].resize(static_cast<size_t>(v.numel()));
    RETURN_IF_ERROR(device->Copy(host_params[t].data(), v.data, host_params[t].size() * 4));
    return host_params[t].data();
  };
  auto grads_view = [&](size_t t) -> Result<float*> {
    ASSIGN_OR_RETURN(TensorView v, engine.Grad(handles[t]));
    if (!staged) return v.as<float>().data();
    host_grads[t].assign(static_cast<size_t>(v.numel()), 0.0f);
    return host_grads[t].data();
  };
  auto grads_up = [&](size_t t) -> Status {
    if (!staged) return Status();
    ASSIGN_OR_RETURN(TensorView v, engine.Grad(handles[t]));
    return device->Copy(v.data, host_grads[t].data(), host_grads[t].size() * 4);
  };

  std::vector<charlm::Example> mb(static_cast<size_t>(batch));
  double last_loss = 0, stall_total = 0;
  int saves = 0;
  auto save = [&](int64_t step) -> Status {
    nlohmann::json ts = {{"seed", seed}, {"examples_seen", step * batch * world}};
    // The previous save's stall, the next step's wait for its copy included.
    if (saves > 0) stall_total += ck->last_stats().stall_seconds;
    RETURN_IF_ERROR(ck->SaveAsync(engine.state_view(), ts));
    ++saves;
    return Status();
  };
  const auto t0 = std::chrono::steady_clock::now();
  while (engine.steps() < steps) {
    const int64_t step = engine.steps();
    for (int k = 0; k < batch; ++k) {
      mb[static_cast<size_t>(k)] = data[Mix(seed ^ Mix(static_cast<uint64_t>(step) * 4099 + static_cast<uint64_t>(rank) * 131 + static_cast<uint64_t>(k))) % data.size()];
    }
    // Forward + backward need every group's parameters and gradients.
    float* pv[5];
    float* gv[5];
    for (int g = 0; g < engine.num_groups(); ++g) {
      if (!(st = engine.Gather(g).status()).ok()) return Fail(st);
    }
    for (size_t t = 0; t < 5; ++t) {
      auto a = params_view(t);
      auto b = grads_view(t);
      if (!a.ok() || !b.ok()) return Fail(a.ok() ? b.status() : a.status());
      pv[t] = *a;
      gv[t] = *b;
    }
    charlm::Tensors gr{gv[0], gv[1], gv[2], gv[3], gv[4]};
    double loss = charlm::ForwardBackward(dims, {pv[0], pv[1], pv[2], pv[3], pv[4]}, mb.data(), batch, &gr);
    for (size_t t = 0; t < 5; ++t) {
      if (!(st = grads_up(t)).ok()) return Fail(st);
    }
    for (int g = engine.num_groups() - 1; g >= 0; --g) {
      if (!(st = engine.Release(g)).ok() || !(st = engine.GradsReady(g)).ok()) return Fail(st);
    }
    auto r = engine.Step();
    if (!r.ok()) return Fail(r.status());
    float l = static_cast<float>(loss);
    if (!(st = comm.AllReduce(&l, &l, 1, DType::kF32, ReduceOp::kAvg)).ok()) return Fail(st);
    last_loss = l;
    if (rank == 0 && (r->step % print_every == 0 || r->step == steps)) {
      std::printf("step %5lld  loss %.4f  grad norm %.3f  lr %.2e\n", static_cast<long long>(r->step), l, r->grad_norm, r->lr);
      std::fflush(stdout);
    }
    if (ck && every > 0 && r->step % every == 0 && r->step < steps) {
      if (!(st = save(r->step)).ok()) return Fail(st);
    }
    if (ck && memory_every > 0 && r->step % memory_every == 0) {
      nlohmann::json ts = {{"seed", seed}, {"examples_seen", r->step * batch * world}};
      if (!(st = ck->SaveToMemory(engine.state_view(), ts)).ok()) return Fail(st);
    }
    if (ck && !(st = ck->Poll()).ok()) return Fail(st);  // commits a save once every rank has written it
    if (ck) {
      auto pre = ckpt::PreemptionRequested(&comm);
      if (pre.ok() && *pre) {
        if (rank == 0) std::printf("preempted: saving step %lld and exiting\n", static_cast<long long>(r->step));
        if (!(st = save(r->step)).ok() || !(st = ck->Wait()).ok()) return Fail(st);
        return 0;
      }
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (ck) {
    if (!(st = save(engine.steps())).ok() || !(st = ck->Wait()).ok()) return Fail(st);
    stall_total += ck->last_stats().stall_seconds;
  }

  // Final parameters (gathered) for sampling and the optional dump.
  std::vector<float> all;
  float* pv[5];
  for (int g = 0; g < engine.num_groups(); ++g) {
    if (!(st = engine.Gather(g).status()).ok()) return Fail(st);
  }
  for (size_t t = 0; t < 5; ++t) {
    auto a = params_view(t);
    if (!a.ok()) return Fail(a.status());
    pv[t] = *a;
    all.insert(all.end(), pv[t], pv[t] + engine.spec(handles[t]).numel());
  }
  if (rank == 0) {
    const charlm::Tensors p{pv[0], pv[1], pv[2], pv[3], pv[4]};
    std::printf("generated words:");
    for (int i = 0; i < 10; ++i) std::printf(" %s", charlm::Sample(dims, p, seed + static_cast<uint64_t>(i)).c_str());
    std::printf("\n");
    if (!dump.empty()) {
      std::ofstream out(dump, std::ios::binary | std::ios::trunc);
      out.write(reinterpret_cast<const char*>(all.data()), static_cast<std::streamsize>(all.size() * 4));
    }
    std::printf("memory per rank (peak):\n%s", engine.memory().ToString().c_str());
    std::printf("SUMMARY steps=%lld final_loss=%.4f checkpoints=%d stall_per_save_ms=%.3f resumed_from=%s seconds=%.1f\n",
                static_cast<long long>(engine.steps()), last_loss, saves, saves ? 1e3 * stall_total / saves : 0.0,
                resumed_from.empty() ? "-" : resumed_from.c_str(), seconds);
  }
  for (int g = 0; g < engine.num_groups(); ++g) (void)engine.Release(g);
  return 0;
}
