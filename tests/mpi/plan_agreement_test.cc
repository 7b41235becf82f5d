// `zrt plan` and the engine agree on the model state per rank: for every parameter dtype, stage and
// placement of the optimizer state (and, at stage 3, of the parameters) and every state precision, what the planner counts
// (`model_state`: parameters, gradients, optimizer state, wherever they live) is what the engine
// allocates (device and host memory, and the swap files on NVMe), to within the layout's padding.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <filesystem>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tools/lib/plan.h"
#include "zrt/runtime/engine.h"
#include "zrt/zrt.h"

namespace zrt {
namespace {

namespace fs = std::filesystem;

struct Placement {
  int stage;
  const char* optimizer;  // the planner's name: none | cpu | nvme
  const char* params;
};

OffloadTarget Target(const std::string& s) { return s == "cpu" ? OffloadTarget::kHost : s == "nvme" ? OffloadTarget::kNvme : OffloadTarget::kNone; }

// Bytes of the swap files of this rank under `dir`: the state streams and the parameter stream.
std::pair<int64_t, int64_t> SwapBytes(const std::string& dir, int rank) {
  int64_t state = 0, params = 0;
  std::error_code ec;
  for (const auto& f : fs::directory_iterator(dir + "/zrt-swap.rank" + std::to_string(rank), ec)) {
    const std::string name = f.path().filename().string();
    if (!name.ends_with(".swp")) continue;
    (name.find("params") != std::string::npos ? params : state) += static_cast<int64_t>(f.file_size());
  }
  return {state, params};
}

TEST(PlanAgreement, TheEngineAllocatesWhatThePlannerCounts) {
  auto comm = MpiCommunicator::Create(MPI_COMM_WORLD);
  ASSERT_TRUE(comm.ok());
  const int n = (*comm)->size(), rank = (*comm)->rank();
  char path[256] = {};
  if (rank == 0) std::snprintf(path, sizeof(path), "%s", (fs::temp_directory_path() / ("zrt_plan_" + std::to_string(::getpid()))).c_str());
  MPI_Bcast(path, sizeof(path), MPI_CHAR, 0, MPI_COMM_WORLD);
  const std::string swap = path;
  if (rank == 0) fs::create_directories(swap);
  MPI_Barrier(MPI_COMM_WORLD);
  // Four groups of a "layer" each, sizes that divide by nothing in particular.
  const std::vector<int64_t> sizes = {250007, 250007, 250007, 250007};
  double psi = 0;
  for (int64_t s : sizes) psi += static_cast<double>(s);
  std::vector<Placement> placements;
  for (int stage = 0; stage <= 3; ++stage) {
    for (const char* opt : {"none", "cpu", "nvme"}) {
      if (stage == 0 && std::string(opt) != "none") continue;  // offload shards the state: stages 1-3
      for (const char* par : {"none", "cpu", "nvme"}) {
        if (stage != 3 && std::string(par) != "none") continue;
        if (std::string(par) == "nvme" && std::string(opt) != "nvme") continue;
        placements.push_back({stage, opt, par});
      }
    }
  }
  // The state's precision (EngineConfig::state; `zrt plan --moments --master`), in every placement;
  // only bf16 models go without a master.
  struct State {
    const char* moments;
    bool master;
  };
  const State states[] = {{"f32", true}, {"bf16", true}, {"q8", true}, {"q8", false}, {"bf16", false}, {"q4", true}, {"q4", false}};
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (const Placement& p : placements) {
    for (const State& st : states) {
        if (!st.master && dtype != DType::kBF16) continue;
        SCOPED_TRACE(std::string(DTypeName(dtype)) + " stage " + std::to_string(p.stage) + " optimizer " + p.optimizer + " params " + p.params +
                     " moments " + st.moments + (st.master ? "" : " no master"));
        tools::PlanInput in;
        in.moments = st.moments;
        in.master = st.master;
        in.params = psi;
        in.largest_layer = static_cast<double>(sizes[0]);
        in.gpus = n;
        in.stage = p.stage;
        in.offload = p.optimizer;
        in.offload_params = p.params;
        in.param_bytes = static_cast<int>(DTypeSize(dtype));
        std::ostringstream os;
        (void)tools::Plan(in, true, os);  // "nothing fits" is not this test's business
        const nlohmann::json plan = nlohmann::json::parse(os.str());
        const nlohmann::json& want = plan["model_state"];

        EngineConfig cfg;
        cfg.stage = p.stage;
        cfg.state.exp_avg = cfg.state.exp_avg_sq = ParsePrecision(st.moments).value();
        cfg.state.master = st.master;
        cfg.offload.optimizer = Target(p.optimizer);
        cfg.offload.params = Target(p.params);
        cfg.offload.nvme_dir = swap;
        CpuDevice device;
        auto e = ZeroEngine::Create(comm->get(), &device, cfg);
        ASSERT_TRUE(e.ok()) << e.status();
        for (size_t i = 0; i < sizes.size(); ++i) {
          ASSERT_TRUE((*e)->AddParam("w" + std::to_string(i), {sizes[i]}, dtype, {.group = "g" + std::to_string(i)}).ok());
        }
        ASSERT_TRUE((*e)->Finalize([](int64_t, int64_t, int64_t k, float* out) { std::fill(out, out + k, 0.5f); }).ok());
        const auto dev = (*e)->memory();
        const auto host = (*e)->host_memory();
        const auto [swap_state, swap_params] = SwapBytes(swap, rank);
        const double got[3] = {
            static_cast<double>(dev.current_of(MemCategory::kParameters) + host.current_of(MemCategory::kParameters) + swap_params),
            static_cast<double>(dev.current_of(MemCategory::kGradients) + host.current_of(MemCategory::kGradients)),
            static_cast<double>(dev.current_of(MemCategory::kOptimizerState) + host.current_of(MemCategory::kOptimizerState) + swap_state)};
        const char* names[3] = {"params", "grads", "optimizer"};
        for (int k = 0; k < 3; ++k) {
          const double w = want[names[k]].get<double>();
          // Padding: each group's shard rounds up to the alignment (64 elements) per rank, and swap
          // files to whole 4 KiB blocks.
          EXPECT_NEAR(got[k], w, 0.01 * w + 4 * 8192.0 * 4) << names[k] << "\n" << dev.ToString() << host.ToString();
        }
      }
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) fs::remove_all(swap);
}

}  // namespace
}  // namespace zrt
