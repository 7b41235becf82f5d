// gpt: a GPT-2 architecture transformer trained on zrt (examples/gpt/model.h), byte-level, on the
// English text of Debian's fortunes package.
//
//   mpirun -n 4 gpt --preset small --stage 3 --steps 300 --ckpt /tmp/gpt      # ~11M parameters
//   mpirun -n 2 gpt --preset tiny --offload nvme --nvme-dir /tmp/swap
//   gpt --preset tiny --reference DIR     # one forward/backward on fixed weights, for tests/gpt/torch_reference.py
//   mpirun -n 2 gpt --preset tiny --experts 4 --top-k 2   # a mixture of 4 experts in every block
//   mpirun -n 4 gpt --preset tiny --experts 4 --top-k 2 --expert-parallel 2   # 2 experts per rank
//
// One gather group per block (stage 3 gathers block by block, prefetching in the recorded order), bf16
// parameters with fp32 master weights and fp32 gradients, AdamW without decay on biases, LayerNorm
// and embeddings, warmup + cosine, clipping, accumulation, async checkpoints with retention,
// preemption (SIGTERM/SIGUSR1), resume with fallback and resharding. The data a rank reads at a step
// depends only on (seed, step, micro-step, rank), so a resumed run is the uninterrupted one.
#include <CLI/CLI.hpp>
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>

#include <zrt/zrt.h>

#include "examples/gpt/model.h"

using zrt::bf16;
using zrt::Status;

namespace {

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The fortunes text files (not the .dat indexes nor the .u8 duplicates), in name order.
zrt::Result<std::string> ReadCorpus(const std::string& dir) {
  std::vector<std::filesystem::path> files;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (e.is_regular_file() && !e.path().has_extension()) files.push_back(e.path());
  }
  if (ec || files.empty()) return zrt::NotFoundError("no text files in ", dir, " (apt-get install fortunes fortunes-min)");
  std::sort(files.begin(), files.end());
  std::string text;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    text.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return text;
}

struct Options {
  std::string preset = "tiny", ckpt, dump, init, init_names, data = "/usr/share/games/fortunes", offload = "none", nvme_dir, reference, trace;
  std::string moments = "f32";  // optimizer state precision (EngineConfig::state) of every group but the embeddings ...
  bool no_master = false;
  bool quantized_weights = false, quantized_gradients = false;
  int quantized_gradient_bits = 8;
  int64_t quantization_block = 0;
  int secondary_shard_group = 0;  // hpZ
  bool compact_embed = false;   // ... unless this (the 8-bit Adam paper keeps embeddings' state in 32 bits)
  int stage = 3, batch = 8, accum = 2, every = 50, keep_last = 2, print_every = 10, val_every = 100, sample = 120;
  int64_t steps = 200, warmup = 20;
  double lr = 1e-3, clip = 1.0, temperature = 0.8;
  uint64_t seed = 1337;
  int experts = 0, top_k = 1;  // a mixture of experts in place of each block's MLP
  int expert_parallel = 1;     // ranks per expert-parallel group (ExpertGroups)
  double aux_loss = 0.01;
};

// --expert-parallel P: each P consecutive ranks form an expert-parallel group, whose all-to-alls
// bring every expert the tokens of the group's ranks (gpt::ExpertParallel); rank r holds experts
// [(r % P) E / P, (r % P + 1) E / P) of every block. The ranks at the same place in their groups
// (rank % P alike) form the experts' expert-data-parallel group, which their tensors are sharded and
// reduced over (ParamOptions::data_parallel); the dense tensors use the whole world.
class ExpertGroups {
 public:
  static zrt::Result<std::unique_ptr<ExpertGroups>> Create(zrt::MpiCommunicator& comm, int p) {
    std::unique_ptr<ExpertGroups> g(new ExpertGroups);
    if (p == 1) return g;
    if (comm.size() % p != 0) return zrt::InvalidArgumentError("--expert-parallel ", p, " does not divide the ", comm.size(), " ranks");
    if (MPI_Comm_split(comm.comm(), comm.rank() / p, comm.rank(), &g->ep_) != MPI_SUCCESS) {
      return zrt::InternalError("MPI_Comm_split of the expert-parallel groups failed");
    }
    ASSIGN_OR_RETURN(g->edp_, comm.Split(comm.rank() % p, comm.rank()), "the expert-data-parallel groups");
    g->model_ = {p, comm.rank() % p, [ep = g->ep_](std::vector<std::vector<float>> send) { return AllToAll(ep, send); }};
    return g;
  }
  ~ExpertGroups() {
    if (ep_ != MPI_COMM_NULL) MPI_Comm_free(&ep_);
  }
  const gpt::ExpertParallel& model() const { return model_; }
  zrt::Communicator* edp() const { return edp_.get(); }  // null with P = 1

 private:
  ExpertGroups() = default;
  // send[q] to rank q of `ep`; what each sent this one (their counts first, then the floats).
  static std::vector<std::vector<float>> AllToAll(MPI_Comm ep, const std::vector<std::vector<float>>& send) {
    const size_t p = send.size();
    std::vector<int> sc(p), rc(p), sd(p), rd(p);
    std::vector<float> flat;
    for (size_t q = 0; q < p; ++q) {
      sc[q] = static_cast<int>(send[q].size());
      sd[q] = static_cast<int>(flat.size());
      flat.insert(flat.end(), send[q].begin(), send[q].end());
    }
    MPI_Alltoall(sc.data(), 1, MPI_INT, rc.data(), 1, MPI_INT, ep);
    int total = 0;
    for (size_t q = 0; q < p; ++q) {
      rd[q] = total;
      total += rc[q];
    }
    std::vector<float> in(static_cast<size_t>(total));
    MPI_Alltoallv(flat.data(), sc.data(), sd.data(), MPI_FLOAT, in.data(), rc.data(), rd.data(), MPI_FLOAT, ep);
    std::vector<std::vector<float>> out(p);
    for (size_t q = 0; q < p; ++q) out[q].assign(in.begin() + rd[q], in.begin() + rd[q] + rc[q]);
    return out;
  }
  MPI_Comm ep_ = MPI_COMM_NULL;
  std::unique_ptr<zrt::Communicator> edp_;
  gpt::ExpertParallel model_;
};

// The expert a tensor belongs to (its name's "mlp.experts.<e>."), or -1.
int ExpertOf(const std::string& name) {
  const size_t at = name.find("mlp.experts.");
  return at == std::string::npos ? -1 : std::stoi(name.substr(at + 12));
}

// The trainer's side of the model: fp32 copies of the gathered bf16 parameters (a block's while it
// computes, the embedding's and the head's through the step), the engine's fp32 gradient views. With
// expert parallelism the tensors of other ranks' experts have no handle (null weights and gradients)
// and a block's local experts are a gather group of their own.
class Net {
 public:
  Net(zrt::ZeroEngine& e, const gpt::Config& c, std::vector<std::optional<zrt::ParamHandle>> h) : e_(e), c_(c), h_(std::move(h)) {
    for (int l = 0; l < c_.layers; ++l) {
      int g = -1;
      for (int i = 0; i < c_.block_tensors(); ++i) {
        const auto& t = h_[block_tensor(l, i)];
        if (t && e_.group(*t) != group_of_block(l)) g = e_.group(*t);
      }
      experts_.push_back(g);
    }
  }
  size_t block_tensor(int l, int i) const { return 2 + static_cast<size_t>(l * c_.block_tensors() + i); }
  int group_of_block(int l) const { return e_.group(*h_[block_tensor(l, 0)]); }
  int embed() const { return e_.group(*h_[0]); }
  int head() const { return e_.group(*h_.back()); }
  // fp32 values of tensor t (its group gathered); null for another rank's expert.
  zrt::Result<const float*> W(size_t t) {
    if (!h_[t]) return nullptr;
    ASSIGN_OR_RETURN(zrt::TensorView v, e_.Param(*h_[t]));
    std::span<const bf16> s = v.as<bf16>();
    std::vector<float>& f = w_[t];
    f.assign(s.begin(), s.end());
    return f.data();
  }
  zrt::Result<float*> G(size_t t) {
    if (!h_[t]) return nullptr;
    ASSIGN_OR_RETURN(zrt::TensorView v, e_.Grad(*h_[t]));
    return v.as<float>().data();  // fp32_grads
  }
  zrt::Result<gpt::BlockParams> Block(int l) {
    gpt::BlockParams p;
    for (int i = 0; i < c_.block_tensors(); ++i) {
      ASSIGN_OR_RETURN(const float* w, W(block_tensor(l, i)));
      p.p.push_back(w);
    }
    return p;
  }
  zrt::Result<gpt::BlockGrads> BlockGrads(int l) {
    gpt::BlockGrads g;
    for (int i = 0; i < c_.block_tensors(); ++i) {
      ASSIGN_OR_RETURN(float* d, G(block_tensor(l, i)));
      g.g.push_back(d);
    }
    return g;
  }
  size_t ln_f() const { return h_.size() - 2; }
  // Frees block l's fp32 copies once the block is done (so the trainer holds one block's, as stage 3
  // holds one block's gathered parameters).
  void Drop(int l) {
    for (int i = 0; i < c_.block_tensors(); ++i) w_.erase(block_tensor(l, i));
  }

  // Block l's groups: its own, and its experts' when they are a group of their own.
  Status GatherBlock(int l) {
    RETURN_IF_ERROR(e_.Gather(group_of_block(l)).status());
    return experts_[static_cast<size_t>(l)] < 0 ? Status() : e_.Gather(experts_[static_cast<size_t>(l)]).status();
  }
  Status ReleaseBlock(int l) {
    RETURN_IF_ERROR(e_.Release(group_of_block(l)));
    return experts_[static_cast<size_t>(l)] < 0 ? Status() : e_.Release(experts_[static_cast<size_t>(l)]);
  }
  Status BlockGradsReady(int l) {
    RETURN_IF_ERROR(e_.GradsReady(group_of_block(l)));
    return experts_[static_cast<size_t>(l)] < 0 ? Status() : e_.GradsReady(experts_[static_cast<size_t>(l)]);
  }

  // Forward through every block, gathering each group when it is needed. Returns the mean loss.
  zrt::Result<double> Forward(gpt::Model& m, const uint8_t* tokens) {
    RETURN_IF_ERROR(e_.Gather(embed()).status());
    ASSIGN_OR_RETURN(const float* wte, W(0));
    ASSIGN_OR_RETURN(const float* wpe, W(1));
    m.Embed(wte, wpe, tokens);
    RETURN_IF_ERROR(e_.Release(embed()));
    for (int l = 0; l < c_.layers; ++l) {
      RETURN_IF_ERROR(GatherBlock(l));
      ASSIGN_OR_RETURN(gpt::BlockParams p, Block(l));
      m.Block(l, p);
      Drop(l);
      RETURN_IF_ERROR(ReleaseBlock(l));
    }
    RETURN_IF_ERROR(e_.Gather(head()).status());
    RETURN_IF_ERROR(e_.Gather(embed()).status());  // the tied output projection
    ASSIGN_OR_RETURN(const float* lw, W(ln_f()));
    ASSIGN_OR_RETURN(const float* lb, W(ln_f() + 1));
    ASSIGN_OR_RETURN(const float* wte2, W(0));
    return m.Head(lw, lb, wte2);
  }
  // Backward after Forward (head and embed still gathered).
  Status Backward(gpt::Model& m) {
    ASSIGN_OR_RETURN(float* dlw, G(ln_f()));
    ASSIGN_OR_RETURN(float* dlb, G(ln_f() + 1));
    ASSIGN_OR_RETURN(float* dwte, G(0));
    m.HeadBackward(w_[ln_f()].data(), w_[ln_f() + 1].data(), w_[0].data(), dlw, dlb, dwte);
    RETURN_IF_ERROR(e_.Release(head()));
    RETURN_IF_ERROR(e_.GradsReady(head()));
    RETURN_IF_ERROR(e_.Release(embed()));
    for (int l = c_.layers - 1; l >= 0; --l) {
      RETURN_IF_ERROR(GatherBlock(l));
      ASSIGN_OR_RETURN(gpt::BlockParams p, Block(l));
      ASSIGN_OR_RETURN(gpt::BlockGrads g, BlockGrads(l));
      m.BlockBackward(l, p, g);
      Drop(l);
      RETURN_IF_ERROR(ReleaseBlock(l));
      RETURN_IF_ERROR(BlockGradsReady(l));
    }
    ASSIGN_OR_RETURN(float* dwpe, G(1));
    ASSIGN_OR_RETURN(dwte, G(0));
    m.EmbedBackward(dwte, dwpe);
    return e_.GradsReady(embed());
  }

 private:
  zrt::ZeroEngine& e_;
  gpt::Config c_;
  std::vector<std::optional<zrt::ParamHandle>> h_;
  std::vector<int> experts_;  // per block, its experts' gather group (-1: the block's own)
  std::map<size_t, std::vector<float>> w_;
};

void Append(const std::string& path, const void* data, size_t bytes) {
  std::ofstream(path, std::ios::binary | std::ios::app).write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
}

// --trace DIR: what tests/gpt/torch_train.py needs to train the same model in PyTorch and compare the
// loss curves: the configuration and the initial fp32 weights (meta.json, weights.bin, rank 0), each
// rank's tokens of every micro-step (tokens.rank<r>.bin, appended as they are used) and each step's
// loss, gradient norm and lr (steps.jsonl, rank 0). A fresh run only: a resumed one would miss steps.
Status BeginTrace(const gpt::Config& c, const Options& o, zrt::Communicator& comm, bool resumed) {
  const int world = comm.size(), rank = comm.rank();
  if (resumed) return zrt::InvalidArgumentError("--trace: a fresh run only (this one resumed or was initialised from a file)");
  if (rank == 0) {
    std::filesystem::remove_all(o.trace);
    std::filesystem::create_directories(o.trace);
  }
  RETURN_IF_ERROR(comm.Barrier());
  if (rank != 0) return Status();
  const auto defs = gpt::Tensors(c);
  nlohmann::json meta = {{"vocab", c.vocab}, {"context", c.context}, {"layers", c.layers}, {"dim", c.dim}, {"heads", c.heads},
                         {"batch", o.batch}, {"accum", o.accum}, {"world", world}, {"steps", o.steps}, {"lr", o.lr},
                         {"warmup", o.warmup}, {"min_lr_ratio", 0.1}, {"clip", o.clip}, {"betas", {0.9, 0.95}}, {"eps", 1e-8},
                         {"weight_decay", 0.1}, {"param_dtype", "bf16"}, {"tensors", nlohmann::json::array()}};
  for (size_t t = 0; t < defs.size(); ++t) {
    int64_t n = 1;
    for (int64_t d : defs[t].shape) n *= d;
    std::vector<float> w(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) w[static_cast<size_t>(i)] = gpt::InitValue(c, defs, o.seed, static_cast<int64_t>(t), i);
    Append(o.trace + "/weights.bin", w.data(), w.size() * 4);
    meta["tensors"].push_back({{"name", defs[t].name}, {"shape", defs[t].shape}, {"decay", defs[t].decay}});
  }
  std::ofstream(o.trace + "/meta.json") << meta.dump(1) << "\n";
  return Status();
}

// One forward/backward on the initial weights in fp32, written for tests/gpt/torch_reference.py.
Status WriteReference(const gpt::Config& c, const Options& o, const std::string& text) {
  const auto defs = gpt::Tensors(c);
  std::vector<std::vector<float>> w(defs.size()), g(defs.size());
  nlohmann::json meta = {{"vocab", c.vocab}, {"context", c.context}, {"layers", c.layers}, {"dim", c.dim}, {"heads", c.heads},
                         {"batch", o.batch}, {"tensors", nlohmann::json::array()}};
  for (size_t t = 0; t < defs.size(); ++t) {
    int64_t n = 1;
    for (int64_t d : defs[t].shape) n *= d;
    w[t].resize(static_cast<size_t>(n));
    g[t].assign(static_cast<size_t>(n), 0.0f);
    for (int64_t i = 0; i < n; ++i) w[t][static_cast<size_t>(i)] = gpt::InitValue(c, defs, o.seed, static_cast<int64_t>(t), i);
    meta["tensors"].push_back({{"name", defs[t].name}, {"shape", defs[t].shape}});
  }
  std::vector<uint8_t> tokens(static_cast<size_t>(o.batch) * static_cast<size_t>(c.context + 1));
  for (int b = 0; b < o.batch; ++b) {
    const size_t at = Mix(o.seed + static_cast<uint64_t>(b)) % (text.size() - static_cast<size_t>(c.context) - 1);
    std::copy_n(text.begin() + static_cast<std::ptrdiff_t>(at), c.context + 1, tokens.begin() + b * (c.context + 1));
  }
  gpt::Model m(c, o.batch);
  std::vector<const float*> wp;
  std::vector<float*> gp;
  for (size_t t = 0; t < defs.size(); ++t) {
    wp.push_back(w[t].data());
    gp.push_back(g[t].data());
  }
  meta["loss"] = gpt::Forward(m, c, wp, tokens.data());
  gpt::Backward(m, c, wp, gp);
  std::filesystem::create_directories(o.reference);
  auto write = [&](const std::string& name, const void* data, size_t bytes) {
    std::ofstream(o.reference + "/" + name, std::ios::binary | std::ios::app).write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  };
  for (const char* f : {"weights.bin", "grads.bin", "tokens.bin"}) std::filesystem::remove(o.reference + "/" + f);
  for (size_t t = 0; t < defs.size(); ++t) {
    write("weights.bin", w[t].data(), w[t].size() * 4);
    write("grads.bin", g[t].data(), g[t].size() * 4);
  }
  write("tokens.bin", tokens.data(), tokens.size());
  std::ofstream(o.reference + "/meta.json") << meta.dump(1) << "\n";
  std::printf("reference: loss %.6f, %zu tensors in %s\n", meta["loss"].get<double>(), defs.size(), o.reference.c_str());
  return Status();
}

// The engine's configuration from the command line, with each core's GEMM peak for MFU, measured by
// each rank in turn (so that no rank shares its core while it measures), the best of them: MFU is
// against a core per rank, also when ranks share cores.
zrt::Result<zrt::EngineConfig> MakeEngineConfig(zrt::Communicator& comm, const gpt::Config& c, const Options& o) {
  zrt::EngineConfig cfg;
  cfg.stage = o.stage;
  cfg.adam = {.lr = o.lr, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  cfg.lr_schedule = zrt::LrSchedule::Cosine(o.warmup, std::max(o.steps, o.warmup + 1), 0.1);
  cfg.max_grad_norm = o.clip;
  cfg.grad_accum_steps = o.accum;
  cfg.fp32_grads = true;
  cfg.bucket_bytes = 4 << 20;
  ASSIGN_OR_RETURN(cfg.state.exp_avg, zrt::ParsePrecision(o.moments));
  cfg.state.exp_avg_sq = cfg.state.exp_avg;
  cfg.state.master = !o.no_master;
  cfg.quantized_weights = o.quantized_weights;
  cfg.quantized_gradients = o.quantized_gradients;
  cfg.quantized_gradient_bits = o.quantized_gradient_bits;
  cfg.quantization_block = o.quantization_block;
  cfg.secondary_shard_group = o.secondary_shard_group;
  ASSIGN_OR_RETURN(cfg.offload.optimizer, zrt::ParseOffloadTarget(o.offload));
  if (o.stage == 3) cfg.offload.params = cfg.offload.optimizer;
  cfg.offload.nvme_dir = o.nvme_dir;
  const double tokens_per_step = static_cast<double>(o.batch) * o.accum * c.context;
  cfg.metrics.tokens_per_step = tokens_per_step;
  cfg.metrics.flops_per_step = tokens_per_step * c.flops_per_token();
  double peak = 0;
  for (int r = 0; r < comm.size(); ++r) {
    if (r == comm.rank()) peak = gpt::MeasurePeakGemmFlops();
    RETURN_IF_ERROR(comm.Barrier());
  }
  float peak_f = static_cast<float>(peak);
  RETURN_IF_ERROR(comm.AllReduce(&peak_f, &peak_f, 1, zrt::DType::kF32, zrt::ReduceOp::kMax));
  cfg.metrics.peak_flops = peak_f;
  return cfg;
}

// What a run adds up for its report.
struct RunTotals {
  double loss = 0, val_loss = -1;
  double tok_s = 0, mfu = 0, reduce_s = 0, reduce_wait_s = 0;  // summed over `timed` steady steps
  int timed = 0;
  int saves = 0;
  double stall = 0;  // the saves' stalls
  std::string resumed_from = "-";
};

// --sample: text from the trained model (every rank runs the forwards: stage 3 gathers are collective).
Status SampleText(zrt::ZeroEngine& engine, Net& net, const gpt::Config& c, const Options& o, const ExpertGroups& groups, int rank) {
  gpt::Model one(c, 1, groups.model());
  std::string out = "The ";
  std::vector<uint8_t> ctx(static_cast<size_t>(c.context) + 1, ' ');
  uint64_t rng = o.seed;
  while (static_cast<int>(out.size()) < o.sample) {
    const size_t n = std::min(out.size(), static_cast<size_t>(c.context));
    std::fill(ctx.begin(), ctx.end(), ' ');
    std::copy_n(out.end() - static_cast<std::ptrdiff_t>(n), n, ctx.begin());
    RETURN_IF_ERROR(net.Forward(one, ctx.data()).status());
    RETURN_IF_ERROR(engine.Release(net.head()));
    RETURN_IF_ERROR(engine.Release(net.embed()));
    // p^(1 / temperature), renormalised: below 1 the likelier bytes win more often.
    const float* p = one.probs(static_cast<int>(n) - 1);
    std::vector<double> w(static_cast<size_t>(c.vocab));
    double sum = 0;
    for (int v = 0; v < c.vocab; ++v) sum += w[static_cast<size_t>(v)] = std::pow(static_cast<double>(p[v]), 1.0 / o.temperature);
    rng = Mix(rng);
    double u = static_cast<double>(rng >> 11) * 0x1.0p-53 * sum, acc = 0;
    int next = 0;
    for (; next < c.vocab - 1; ++next) {
      if ((acc += w[static_cast<size_t>(next)]) > u) break;
    }
    out.push_back(static_cast<char>(next));
  }
  for (char& ch : out) {  // bytes the model made up that are not printable text
    if ((ch < 32 && ch != '\n') || static_cast<unsigned char>(ch) >= 127) ch = '?';
  }
  if (rank == 0) std::printf("sample: %s\n", out.c_str());
  return Status();
}

// Rank 0's report: memory per rank by category beside the ZeRO paper's model-state formula (bf16
// parameters and fp32 gradients here: 2 + 4 + K bytes per parameter before sharding; K = 12 for f32
// state, the embeddings' unless --compact-embed, else two moments at --moments and a master unless
// --no-master), the gradient reductions hidden behind backward, and the SUMMARY line.
void PrintReport(zrt::ZeroEngine& engine, const zrt::EngineConfig& cfg, const gpt::Config& c, const Options& o, int world, const gpt::Model& model,
                 const RunTotals& t) {
  const zrt::StateFormat moment = zrt::StateFormat::Of(cfg.state.exp_avg, "exp_avg", cfg.state.q8_block);
  const double mb = static_cast<double>(moment.Bytes(cfg.state.q8_block)) / static_cast<double>(cfg.state.q8_block);
  double psi_embed = 0, psi_x = 0;  // psi_x: the experts' parameters, with --expert-parallel
  for (const gpt::TensorDef& d : gpt::Tensors(c)) {
    const auto numel = static_cast<double>(zrt::TensorSpec{d.name, d.shape, zrt::DType::kBF16}.numel());
    if (d.group == "embed" && !o.compact_embed) psi_embed += numel;
    if (o.expert_parallel > 1 && ExpertOf(d.name) >= 0) psi_x += numel;
  }
  const double psi = static_cast<double>(c.num_params()), n = o.stage == 0 ? 1 : world, kb = 2 * mb + (o.no_master ? 0 : 4);
  // The formula for `p` parameters (`k` optimizer bytes) over `s` ranks: the dense part over the
  // world, and a rank's 1/P of the experts over their N / P holders.
  auto zero = [&](double p, double k, double s) {
    const double f[] = {6 * p + k, 6 * p + k / s, 2 * p + (4 * p + k) / s, (6 * p + k) / s};
    return f[o.stage];
  };
  const double P = o.expert_parallel;
  const double formula = zero(psi - psi_x, 12 * psi_embed + kb * (psi - psi_embed - psi_x), n) +
                         zero(psi_x / P, kb * psi_x / P, o.stage == 0 ? 1 : n / P);
  const auto m = engine.memory();
  const double state = static_cast<double>(m.peak_of(zrt::MemCategory::kParameters) + m.peak_of(zrt::MemCategory::kGradients) +
                                           m.peak_of(zrt::MemCategory::kOptimizerState));
  std::printf("memory per rank: model state %.1f MiB (ZeRO formula %.1f MiB) + activations %.1f MiB\n%s", state / 1048576,
              formula / 1048576, static_cast<double>(model.activation_bytes()) / 1048576, m.ToString().c_str());
  if (o.offload != "none") std::printf("host memory (offload):\n%s", engine.host_memory().ToString().c_str());
  // Gradient reductions hidden behind backward: 1 - (time blocked on them) / (time they were in flight).
  const double hidden = t.reduce_s > 0 ? 1 - t.reduce_wait_s / t.reduce_s : 0;
  if (world > 1 && t.timed > 0) {
    std::printf("gradient reductions: %.1f ms in flight per step, %.1f ms of it waited for: %.0f%% hidden behind backward\n",
                1e3 * t.reduce_s / t.timed, 1e3 * t.reduce_wait_s / t.timed, 100 * hidden);
  }
  std::printf("SUMMARY steps=%lld loss=%.4f val_loss=%.4f tokens_per_s=%.0f mfu=%.4f reduce_hidden=%.3f checkpoints=%d stall_per_save_ms=%.2f resumed_from=%s\n",
              static_cast<long long>(engine.steps()), t.loss, t.val_loss, t.timed ? t.tok_s / t.timed : 0.0, t.timed ? t.mfu / t.timed : 0.0, hidden,
              t.saves, t.saves ? 1e3 * t.stall / t.saves : 0.0, t.resumed_from.c_str());
}

// The model's tensors registered with the engine (each group's own state precision, the embeddings'
// f32 unless --compact-embed) and initialised (each tensor as without expert parallelism). With
// --expert-parallel, this rank's experts of block l in group "h.<l>.experts" over their
// expert-data-parallel group; other ranks' experts not at all (no handle).
zrt::Result<std::vector<std::optional<zrt::ParamHandle>>> AddModel(zrt::ZeroEngine& engine, const gpt::Config& c, const Options& o,
                                                                   const ExpertGroups& groups) {
  const auto defs = gpt::Tensors(c);
  std::vector<std::optional<zrt::ParamHandle>> handles;
  std::vector<int64_t> def_of;  // by registration
  for (size_t t = 0; t < defs.size(); ++t) {
    const gpt::TensorDef& d = defs[t];
    const int expert = ExpertOf(d.name);
    zrt::ParamOptions po{.group = d.group};
    if (!d.decay) po.weight_decay = 0;
    if (d.group == "embed" && !o.compact_embed) po.state = zrt::StatePrecision{};
    if (expert >= 0 && groups.edp() != nullptr) {
      if (!groups.model().holds(expert, c.experts)) {
        handles.emplace_back();  // another rank's
        continue;
      }
      po.group = d.group + ".experts";
      po.data_parallel = groups.edp();
    }
    ASSIGN_OR_RETURN(zrt::ParamHandle h, engine.AddParam(d.name, d.shape, zrt::DType::kBF16, po));
    handles.emplace_back(h);
    def_of.push_back(static_cast<int64_t>(t));
  }
  RETURN_IF_ERROR(engine.Finalize([&](int64_t p, int64_t off, int64_t n, float* out) {
    for (int64_t i = 0; i < n; ++i) out[i] = gpt::InitValue(c, defs, o.seed, def_of[static_cast<size_t>(p)], off + i);
  }));
  return handles;
}

// Where the run starts: the newest checkpoint under --ckpt (then `ck` saves there), else the
// pretrained weights of --init, else the initialisation. Sets t.resumed_from.
Status StartFrom(zrt::Communicator& comm, zrt::Device& device, zrt::ZeroEngine& engine, const zrt::EngineConfig& cfg, const Options& o,
                 std::unique_ptr<zrt::ckpt::Checkpointer>* ck, RunTotals& t) {
  if (!o.ckpt.empty()) {
    ASSIGN_OR_RETURN(*ck, zrt::ckpt::Checkpointer::Create(&comm, &device, {.root = o.ckpt, .keep_last = o.keep_last}));
    zrt::ckpt::InstallPreemptionHandler();
    auto r = zrt::ckpt::Resume(&comm, {.root = o.ckpt}, engine.state_view());
    if (r.ok()) t.resumed_from = r->dir;
    if (r.ok() && comm.rank() == 0) {
      std::printf("resumed from %s (saved by %d ranks at stage %d)\n", r->dir.c_str(), r->loaded.saved_world_size, r->loaded.saved_stage);
    }
    if (!r.ok() && r.status().code() != zrt::StatusCode::kNotFound) return r.status();
    // A resume brings back the saved schedule; this run's --steps decides where it ends (the same
    // schedule when the command line is the same).
    RETURN_IF_ERROR(engine.SetLrSchedule(cfg.lr_schedule));
  }
  if (!o.init.empty() && t.resumed_from == "-") {  // a fresh start from pretrained weights (a resume wins)
    zrt::ckpt::SafetensorsLoadOptions lo;
    if (!o.init_names.empty()) {
      ASSIGN_OR_RETURN(lo.names, zrt::ckpt::NameMap::FromJsonFile(o.init_names));
    }
    ASSIGN_OR_RETURN(zrt::ckpt::LoadResult l, zrt::ckpt::LoadSafetensors(&comm, o.init, engine.state_view(), lo));
    if (comm.rank() == 0) {
      std::printf("initialised from %s (%.1f MiB of weights on rank 0%s)\n", o.init.c_str(), static_cast<double>(l.bytes_read) / 1048576,
                  l.unexpected.empty() ? "" : ", some tensors dropped by the name map");
    }
  }
  return Status();
}

// A batch of `batch` rows of context + 1 bytes, each from a place of [lo, hi) of the text drawn by `key`.
struct Batches {
  const std::string& text;
  int batch;
  size_t row;
  std::vector<uint8_t> tokens = std::vector<uint8_t>(static_cast<size_t>(batch) * row);
  const uint8_t* Fill(uint64_t key, size_t lo, size_t hi) {
    for (int b = 0; b < batch; ++b) {
      const size_t at = lo + Mix(key * 131 + static_cast<uint64_t>(b)) % (hi - lo - row);
      std::copy_n(text.begin() + static_cast<std::ptrdiff_t>(at), row, tokens.begin() + static_cast<std::ptrdiff_t>(b * row));
    }
    return tokens.data();
  }
};

// The validation loss after step `step`: four batches from the held-out tail of the text (from
// `split`), averaged over the ranks.
zrt::Result<double> Validate(zrt::Communicator& comm, zrt::ZeroEngine& engine, Net& net, gpt::Model& model, Batches& batches, int64_t step, size_t split) {
  double val = 0;
  for (int k = 0; k < 4; ++k) {
    const uint64_t key = Mix(static_cast<uint64_t>(step) * 7 + static_cast<uint64_t>(k) * 1000003 + static_cast<uint64_t>(comm.rank()));
    ASSIGN_OR_RETURN(double l, net.Forward(model, batches.Fill(key, split, batches.text.size())));
    val += l / 4;
    RETURN_IF_ERROR(engine.Release(net.head()));
    RETURN_IF_ERROR(engine.Release(net.embed()));
  }
  float v = static_cast<float>(val);
  RETURN_IF_ERROR(comm.AllReduce(&v, &v, 1, zrt::DType::kF32, zrt::ReduceOp::kAvg));
  return static_cast<double>(v);
}

// Rank 0's line for step r.
void PrintStep(const zrt::StepResult& r, double loss) {
  const zrt::StepTimes& st = r.times;
  std::printf("step %5lld  loss %.4f  lr %.2e  norm %.2f  %.0f tok/s  MFU %.1f%%  %.1f ms (fwd %.0f%% bwd %.0f%% comm %.0f%% opt %.0f%% io %.0f%% ckpt %.0f%%)\n",
              static_cast<long long>(r.step), loss, r.lr, r.grad_norm, r.tokens_per_second, 100 * r.mfu, 1e3 * st.total, 100 * st.forward / st.total,
              100 * st.backward / st.total, 100 * st.comm_wait / st.total, 100 * st.optimizer / st.total, 100 * st.offload_io / st.total,
              100 * st.checkpoint_stall / st.total);
  std::fflush(stdout);
}

void PrintBanner(const gpt::Config& c, const Options& o, const zrt::EngineConfig& cfg, int world, size_t text_bytes) {
  std::printf("gpt %s: %lld parameters, %d layers, dim %d, %d heads, context %d; %d ranks, stage %d, offload %s; state %s%s; %zu bytes "
              "of text; GEMM peak %.1f GFLOP/s per core\n",
              o.preset.c_str(), static_cast<long long>(c.num_params()), c.layers, c.dim, c.heads, c.context, world, o.stage,
              o.offload.c_str(), zrt::StatePrecisionName(cfg.state).c_str(), o.compact_embed ? "" : " (embeddings: f32 with a master)",
              text_bytes, cfg.metrics.peak_flops / 1e9);
  if (c.experts > 0) std::printf("mixture of experts: %d per block, top %d per token, load-balancing weight %g\n", c.experts, c.top_k, c.aux_loss);
  if (o.expert_parallel > 1) {
    std::printf("expert parallelism: %d experts per rank in groups of %d ranks, each expert's state over its %d holders\n",
                c.experts / o.expert_parallel, o.expert_parallel, world / o.expert_parallel);
  }
}

// One step's forward and backward passes over o.accum micro-batches: their mean loss over the ranks.
zrt::Result<double> Passes(zrt::MpiCommunicator& comm, zrt::ZeroEngine& engine, Net& net, gpt::Model& model, Batches& batches, const Options& o,
                      size_t split) {
  const int rank = comm.rank();
  double loss = 0;
  for (int micro = 0; micro < o.accum; ++micro) {
    engine.SetSync(micro == o.accum - 1);
    const uint8_t* tokens =
        batches.Fill(Mix(o.seed ^ Mix(static_cast<uint64_t>(engine.steps()) * 1009 + static_cast<uint64_t>(micro) * 37 + static_cast<uint64_t>(rank))), 0, split);
    if (!o.trace.empty()) Append(o.trace + "/tokens.rank" + std::to_string(rank) + ".bin", tokens, batches.tokens.size());
    engine.Mark(zrt::Phase::kForward);
    ASSIGN_OR_RETURN(double l, net.Forward(model, tokens));
    loss += l / o.accum;
    engine.Mark(zrt::Phase::kBackward);
    RETURN_IF_ERROR(net.Backward(model));
  }
  float avg = static_cast<float>(loss);
  RETURN_IF_ERROR(comm.AllReduce(&avg, &avg, 1, zrt::DType::kF32, zrt::ReduceOp::kAvg));
  return static_cast<double>(avg);
}

// A steady-state step (past warm-up, no save in it) counts toward the report's rates.
void CountSteady(const zrt::StepResult& r, const zrt::CommStats& before, const zrt::CommStats& now, RunTotals& t) {
  if (r.step <= 2 || r.times.checkpoint_stall != 0) return;
  t.tok_s += r.tokens_per_second;
  t.mfu += r.mfu;
  t.reduce_s += now.reduce_seconds - before.reduce_seconds;
  t.reduce_wait_s += now.reduce_wait_seconds - before.reduce_wait_seconds;
  ++t.timed;
}

Status Train(zrt::MpiCommunicator& comm, const gpt::Config& c, const Options& o, const std::string& text) {
  const int rank = comm.rank(), world = comm.size();
  const size_t split = text.size() / 10 * 9;  // train: the first 90%, validation: the rest
  zrt::CpuDevice device;
  ASSIGN_OR_RETURN(const zrt::EngineConfig cfg, MakeEngineConfig(comm, c, o));
  ASSIGN_OR_RETURN(auto engine, zrt::ZeroEngine::Create(&comm, &device, cfg));
  ASSIGN_OR_RETURN(std::unique_ptr<ExpertGroups> groups, ExpertGroups::Create(comm, o.expert_parallel));
  ASSIGN_OR_RETURN(auto handles, AddModel(*engine, c, o, *groups));
  Net net(*engine, c, std::move(handles));
  std::unique_ptr<zrt::ckpt::Checkpointer> ck;
  RunTotals t;
  auto save = [&]() -> Status {
    if (t.saves > 0) t.stall += ck->last_stats().stall_seconds;  // the previous save's, the next step's wait included
    RETURN_IF_ERROR(ck->SaveAsync(engine->state_view(), {{"seed", o.seed}}));
    ++t.saves;
    return Status();
  };
  RETURN_IF_ERROR(StartFrom(comm, device, *engine, cfg, o, &ck, t));
  if (rank == 0) PrintBanner(c, o, cfg, world, text.size());
  if (!o.trace.empty()) RETURN_IF_ERROR(BeginTrace(c, o, comm, t.resumed_from != "-" || !o.init.empty()));
  gpt::Model model(c, o.batch, groups->model());
  Batches batches{text, o.batch, static_cast<size_t>(c.context) + 1};
  double& loss = t.loss;
  zrt::CommStats comm_before = engine->comm_stats();
  while (engine->steps() < o.steps) {
    ASSIGN_OR_RETURN(loss, Passes(comm, *engine, net, model, batches, o, split));
    engine->Record("loss", loss);
    ASSIGN_OR_RETURN(zrt::StepResult r, engine->Step());
    if (!o.trace.empty() && rank == 0) {
      const std::string line = nlohmann::json{{"step", r.step}, {"loss", loss}, {"grad_norm", r.grad_norm}, {"lr", r.lr}, {"skipped", r.skipped}}.dump() + "\n";
      Append(o.trace + "/steps.jsonl", line.data(), line.size());
    }
    const zrt::CommStats comm_now = engine->comm_stats();
    CountSteady(r, comm_before, comm_now, t);
    comm_before = comm_now;
    if (rank == 0 && (r.step % o.print_every == 0 || r.step == o.steps)) PrintStep(r, loss);
    if (o.val_every > 0 && (r.step % o.val_every == 0 || r.step == o.steps)) {
      ASSIGN_OR_RETURN(t.val_loss, Validate(comm, *engine, net, model, batches, r.step, split));
      if (rank == 0) std::printf("step %5lld  validation loss %.4f\n", static_cast<long long>(r.step), t.val_loss);
    }
    if (ck) {
      if (o.every > 0 && r.step % o.every == 0) RETURN_IF_ERROR(save());
      RETURN_IF_ERROR(ck->Poll());
      ASSIGN_OR_RETURN(bool preempted, zrt::ckpt::PreemptionRequested(&comm));
      if (preempted) {
        if (rank == 0) std::printf("preempted: saving step %lld\n", static_cast<long long>(r.step));
        RETURN_IF_ERROR(save());
        return ck->Wait();
      }
    }
  }
  if (ck) {
    RETURN_IF_ERROR(ck->Wait());
    if (t.saves > 0) t.stall += ck->last_stats().stall_seconds;
  }
  if (o.sample > 0) RETURN_IF_ERROR(SampleText(*engine, net, c, o, *groups, rank));
  std::ofstream dump;
  if (rank == 0 && !o.dump.empty()) dump.open(o.dump, std::ios::binary | std::ios::trunc);
  RETURN_IF_ERROR(engine->ForEachFullTensor({}, [&](const zrt::TensorSpec&, std::string_view, std::span<const float> v) {
    dump.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size_bytes()));
    return Status();
  }));
  if (rank == 0) PrintReport(*engine, cfg, c, o, world, model, t);
  return Status();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"gpt: a GPT-2 architecture transformer trained with zrt on Debian's fortunes"};
  Options o;
  app.add_option("--preset", o.preset, "tiny, small (~11M parameters) or gpt2 (GPT-2 124M's shape, byte tokens)");
  app.add_option("--experts", o.experts, "a mixture of this many experts in place of each block's MLP (0: dense)")->check(CLI::Range(0, 256));
  app.add_option("--top-k", o.top_k, "experts per token (--experts)")->check(CLI::PositiveNumber);
  app.add_option("--aux-loss", o.aux_loss, "the load-balancing loss's weight (--experts)")->check(CLI::NonNegativeNumber);
  app.add_option("--expert-parallel", o.expert_parallel,
                 "the experts split over groups of this many consecutive ranks (all-to-all token dispatch), each expert's state over "
                 "the ranks holding it (--experts)")
      ->check(CLI::PositiveNumber);
  app.add_option("--stage", o.stage, "ZeRO stage")->check(CLI::Range(0, 3));
  app.add_option("--steps", o.steps, "optimizer steps in total");
  app.add_option("--batch", o.batch, "sequences per rank per micro-step");
  app.add_option("--accum", o.accum, "micro-steps per step")->check(CLI::PositiveNumber);
  app.add_option("--lr", o.lr, "peak learning rate");
  app.add_option("--warmup", o.warmup, "warmup steps (then cosine to 10%)");
  app.add_option("--clip", o.clip, "global-norm clipping (0: off)");
  app.add_option("--seed", o.seed, "initialisation and data order");
  app.add_option("--data", o.data, "directory of text files");
  app.add_option("--offload", o.offload, "none, host or nvme")->check(CLI::IsMember({"none", "host", "nvme"}));
  app.add_option("--moments", o.moments, "Adam moments in f32, bf16, q8 or q4 (8- or 4-bit block-wise)")
      ->check(CLI::IsMember({"f32", "bf16", "q8", "q4"}));
  app.add_flag("--no-master", o.no_master, "no fp32 master: bf16 parameters updated with stochastic rounding");
  app.add_flag("--quantized-weights", o.quantized_weights, "stage 3: parameter gathers as int8 codes with a scale per block of values (qwZ)");
  app.add_flag("--quantized-gradients", o.quantized_gradients, "stages 1-3: gradient reduce-scatters as an all-to-all of int8 codes (qgZ)");
  app.add_option("--quantized-gradient-bits", o.quantized_gradient_bits, "qgZ's codes: 8 or 4 bits")->check(CLI::IsMember({4, 8}));
  app.add_option("--quantization-block", o.quantization_block, "values per f32 scale of qwZ / qgZ (0: 256 for int8, 64 for int4)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--secondary-shard-group", o.secondary_shard_group,
                 "stage 3: the backward's gathers inside groups of this many ranks (hpZ; -1: a node)");
  app.add_flag("--compact-embed", o.compact_embed, "the embeddings' state in --moments / --no-master too (default: f32 with a master)");
  app.add_option("--nvme-dir", o.nvme_dir, "swap directory for --offload nvme");
  app.add_option("--ckpt", o.ckpt, "checkpoint root (resumes from its newest complete checkpoint)");
  app.add_option("--every", o.every, "save every N steps");
  app.add_option("--keep-last", o.keep_last, "keep the newest N checkpoints");
  app.add_option("--print-every", o.print_every, "log every N steps");
  app.add_option("--val-every", o.val_every, "validation loss every N steps (0: never)");
  app.add_option("--sample", o.sample, "characters of text to generate at the end (0: none)");
  app.add_option("--temperature", o.temperature, "sampling temperature of --sample (1: the model's distribution)")->check(CLI::PositiveNumber);
  app.add_option("--dump", o.dump, "write the final fp32 weights here (rank 0)");
  app.add_option("--init", o.init, "start from pretrained weights: a safetensors file, index or directory (unless resuming)");
  app.add_option("--init-names", o.init_names, "JSON name map for --init: file names -> these (docs/interop.md)");
  app.add_option("--reference", o.reference, "write one fp32 forward/backward on the initial weights into this directory and exit");
  app.add_option("--trace", o.trace, "write the configuration, initial weights, tokens and per-step losses here (tests/gpt/torch_train.py)");
  CLI11_PARSE(app, argc, argv);
  openblas_set_num_threads(1);  // one rank per core; the ranks are the parallelism
  auto c = gpt::Preset(o.preset);
  if (c.ok()) {
    c->experts = o.experts;
    c->top_k = o.top_k;
    c->aux_loss = static_cast<float>(o.aux_loss);
  }
  auto text = ReadCorpus(o.data);
  Status s = !c.ok() ? c.status() : !text.ok() ? text.status() : Status();
  if (s.ok() && o.experts > 0 && o.top_k > o.experts) s = zrt::InvalidArgumentError("--top-k ", o.top_k, " exceeds --experts ", o.experts);
  if (s.ok() && o.expert_parallel > 1 && (o.experts == 0 || o.experts % o.expert_parallel != 0)) {
    s = zrt::InvalidArgumentError("--expert-parallel ", o.expert_parallel, " must divide --experts (", o.experts, ")");
  }
  if (s.ok() && o.experts > 0 && (!o.reference.empty() || !o.trace.empty())) {
    s = zrt::InvalidArgumentError("--reference and --trace are for the dense model (tests/gpt/torch_*.py know no experts)");
  }
  if (s.ok() && !o.reference.empty()) {
    s = WriteReference(*c, o, *text);
  } else if (s.ok()) {
    auto session = zrt::MpiSession::Init(&argc, &argv);
    auto comm = session.ok() ? zrt::MpiCommunicator::Create() : zrt::Result<std::unique_ptr<zrt::MpiCommunicator>>(session.status());
    s = comm.ok() ? Train(**comm, *c, o, *text) : comm.status();
  }
  if (!s.ok()) std::fprintf(stderr, "gpt: %s\n", s.ToString().c_str());
  return s.ok() ? 0 : 1;
}
