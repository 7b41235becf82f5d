// The DDP baseline for bench/gpt_step (./scripts/bench): examples/gpt's model trained the plain way —
// fp32 parameters and AdamW state replicated on every rank, one MPI all-reduce of all gradients per
// step, a scalar AdamW loop — on the data, batch and schedule `gpt` uses, so that tokens/s beside
// zrt's at the same world size is the cost (or gain) of ZeRO over DDP.
//   mpirun -n 2 gpt_ddp --preset small --steps 6 --batch 8 --accum 2
#include <CLI/CLI.hpp>
#include <cblas.h>
#include <mpi.h>

#include <chrono>
#include <cmath>
#include <cstdio>

#include "examples/gpt/model.h"

int main(int argc, char** argv) {
  CLI::App app{"gpt_ddp: examples/gpt's model with all-reduce + AdamW (the DDP baseline)"};
  std::string preset = "tiny";
  int steps = 6, batch = 8, accum = 2;
  app.add_option("--preset", preset, "tiny, small or gpt2");
  app.add_option("--steps", steps, "steps (the first two are not timed)");
  app.add_option("--batch", batch, "sequences per rank per micro-step");
  app.add_option("--accum", accum, "micro-steps per step");
  CLI11_PARSE(app, argc, argv);
  openblas_set_num_threads(1);
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  auto c = gpt::Preset(preset);
  if (!c.ok()) {
    std::fprintf(stderr, "gpt_ddp: %s\n", c.status().ToString().c_str());
    return 2;
  }
  const auto defs = gpt::Tensors(*c);
  std::vector<size_t> offset;
  size_t total = 0;
  for (const auto& d : defs) {
    offset.push_back(total);
    size_t n = 1;
    for (int64_t s : d.shape) n *= static_cast<size_t>(s);
    total += n;
  }
  offset.push_back(total);
  std::vector<float> w(total), g(total), m(total, 0.0f), v(total, 0.0f);
  for (size_t t = 0; t < defs.size(); ++t) {
    for (size_t i = offset[t]; i < offset[t + 1]; ++i) w[i] = gpt::InitValue(*c, defs, 1337, static_cast<int64_t>(t), static_cast<int64_t>(i - offset[t]));
  }
  std::vector<const float*> wp;
  std::vector<float*> gp;
  for (size_t t = 0; t < defs.size(); ++t) {
    wp.push_back(w.data() + offset[t]);
    gp.push_back(g.data() + offset[t]);
  }
  gpt::Model model(*c, batch);
  const size_t row = static_cast<size_t>(c->context) + 1;
  std::vector<uint8_t> tokens(static_cast<size_t>(batch) * row);
  uint64_t rng = 12345 + static_cast<uint64_t>(rank);
  double timed = 0;
  for (int step = 0; step < steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    std::fill(g.begin(), g.end(), 0.0f);
    for (int micro = 0; micro < accum; ++micro) {
      for (auto& x : tokens) x = static_cast<uint8_t>(((rng = rng * 6364136223846793005ull + 1442695040888963407ull) >> 33) % 96 + 32);
      gpt::Forward(model, *c, wp, tokens.data());
      gpt::Backward(model, *c, wp, gp);
    }
    MPI_Allreduce(MPI_IN_PLACE, g.data(), static_cast<int>(total), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    const float scale = 1.0f / static_cast<float>(world * accum), lr = 1e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f;
    const float c1 = 1.0f - std::pow(b1, static_cast<float>(step + 1)), c2 = 1.0f - std::pow(b2, static_cast<float>(step + 1));
    for (size_t t = 0; t < defs.size(); ++t) {
      const float wd = defs[t].decay ? 0.1f : 0.0f;
      for (size_t i = offset[t]; i < offset[t + 1]; ++i) {
        const float gi = g[i] * scale;
        m[i] = b1 * m[i] + (1 - b1) * gi;
        v[i] = b2 * v[i] + (1 - b2) * gi * gi;
        w[i] = w[i] * (1 - lr * wd) - lr * (m[i] / c1) / (std::sqrt(v[i] / c2) + eps);
      }
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (step >= 2) timed += s;
  }
  const double tokens_per_step = static_cast<double>(batch) * accum * c->context * world;
  if (rank == 0) std::printf("BASELINE tokens_per_s=%.0f\n", steps > 2 ? tokens_per_step * (steps - 2) / timed : 0.0);
  MPI_Finalize();
  return 0;
}
