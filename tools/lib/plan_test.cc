#include <gtest/gtest.h>

#include <sstream>

#include <nlohmann/json.hpp>

#include "tools/lib/plan.h"

namespace zrt::tools {
namespace {

nlohmann::json PlanJson(const PlanInput& in, StatusCode want = StatusCode::kOk) {
  std::ostringstream os;
  Status s = Plan(in, true, os);
  EXPECT_EQ(s.code(), want) << s;
  return nlohmann::json::parse(os.str());
}

constexpr double kGiB = double(int64_t{1} << 30);

TEST(Plan, ZeroFormulas) {
  PlanInput in;
  in.params = 7.5e9;  // the ZeRO paper's example: 7.5B parameters on 64 GPUs
  in.gpus = 64;
  const double expect[] = {120e9, 31.4e9, 16.6e9, 1.88e9};  // paper, Figure 1 (GB)
  for (int stage = 0; stage <= 3; ++stage) {
    in.stage = stage;
    const auto j = PlanJson(in);
    EXPECT_NEAR(j["device"]["model_states"].get<double>(), expect[stage], 0.01 * expect[stage]) << "stage " << stage;
  }
  in.stage = 2;
  EXPECT_NEAR(PlanJson(in)["comm_bytes_per_step"].get<double>(), 2 * 7.5e9 * 2 * 63 / 64, 1e3);
  in.stage = 3;
  EXPECT_NEAR(PlanJson(in)["comm_bytes_per_step"].get<double>(), 3 * 7.5e9 * 2 * 63 / 64, 1e3);
  in.offload = "cpu";
  EXPECT_EQ(PlanJson(in)["device"]["optimizer"].get<double>(), 0);
  EXPECT_GT(PlanJson(in)["host"].get<double>(), 0);
}

// Hybrid sharding: state divided by S instead of N, the group's collectives inside a node when S fits
// in one, the replicas' all-reduce across; TP x PP divide the model per device; the recommendation is
// the S with the least time across nodes that fits.
TEST(Plan, TheMeshSplitsMemoryAndLinks) {
  PlanInput in;
  in.params = 8e9;
  in.gpus = 64;
  in.gpus_per_node = 8;
  in.stage = 3;
  const auto flat = PlanJson(in);
  in.shard_group = 8;
  const auto hybrid = PlanJson(in);
  EXPECT_NEAR(hybrid["device"]["model_states"].get<double>(), 8 * flat["device"]["model_states"].get<double>(), 1e3);
  const double M = 8e9 * 2;
  EXPECT_NEAR(flat["mesh"]["by_shard_group"].back()["across_nodes_bytes"].get<double>(), 3 * M * 63 / 64, 1e3);
  EXPECT_EQ(flat["mesh"]["by_shard_group"].back()["inside_node_bytes"].get<double>(), 0);
  for (const auto& row : hybrid["mesh"]["by_shard_group"]) {
    if (row["shard_group"] != 8) continue;
    EXPECT_NEAR(row["inside_node_bytes"].get<double>(), 3 * M * 7 / 8, 1e3);
    EXPECT_NEAR(row["across_nodes_bytes"].get<double>(), 2 * M / 8 * 7 / 8, 1e3);
  }
  EXPECT_NEAR(hybrid["comm_bytes_per_step"].get<double>(), 3 * M * 7 / 8 + 2 * M / 8 * 7 / 8, 1e3);
  // 80 GiB devices: S = 1 (16 bytes x 8e9 = 128 GB) does not fit; S = 8, a node, crosses least (the
  // replicas' all-reduce shrinks with S; S = 16 spans two nodes and its gathers cross).
  EXPECT_FALSE(hybrid["mesh"]["by_shard_group"][0]["fits"].get<bool>());
  EXPECT_EQ(hybrid["mesh"]["recommended_shard_group"], 8);
  // With link rates the time decides, and the text shows the table.
  in.intra_gbps = 300;
  in.inter_gbps = 25;
  std::ostringstream text;
  ASSERT_TRUE(Plan(in, false, text).ok());
  EXPECT_NE(text.str().find("in shard groups of 8 (8 replicas)"), std::string::npos) << text.str();
  EXPECT_NE(text.str().find("recommended: --shard-group"), std::string::npos) << text.str();
  // A checkpoint's bytes per device: the state of a shard group's share, saved once.
  EXPECT_NEAR(hybrid["failures"]["checkpoint_bytes_per_device"].get<double>(), 12 * 8e9 / 8, 1e3);
  EXPECT_NEAR(flat["failures"]["checkpoint_bytes_per_device"].get<double>(), 12 * 8e9 / 64, 1e3);
  // Written spread over the 8 replicas of each shard: a device writes 1/64 of the state either way,
  // and the save is durable after that much at the disk's rate.
  EXPECT_NEAR(hybrid["failures"]["checkpoint_written_bytes_per_device"].get<double>(), 12 * 8e9 / 64, 1e3);
  EXPECT_NEAR(flat["failures"]["checkpoint_written_bytes_per_device"].get<double>(), 12 * 8e9 / 64, 1e3);
  // The memory tier: 8 live replicas send none (restorable once snapshotted); plain ZeRO sends one at
  // the peer rate. Either way the replicas lose less work per failure than own copies alone, and train
  // more. (Own copies alone need not beat the disk: with saves as cheap as snapshots the tier only
  // shortens the restart, and the disk is saved less often as fewer failures roll back to it.)
  EXPECT_EQ(hybrid["failures"]["replicas"], 8);
  EXPECT_EQ(flat["failures"]["replicas"], 1);
  EXPECT_EQ(hybrid["failures"]["costs_seconds"]["tier_write"].get<double>(), 0);
  EXPECT_NEAR(flat["failures"]["costs_seconds"]["tier_write"].get<double>(), 12 * 8e9 / 64 / 12.5e9, 1e-6);
  for (const auto* j : {&hybrid, &flat}) {
    const auto& f = (*j)["failures"];
    EXPECT_LT(f["memory_tier"]["work_lost_per_failure_seconds"].get<double>(),
              f["memory_tier_own_copies"]["work_lost_per_failure_seconds"].get<double>());
    EXPECT_GT(f["memory_tier"]["ettr"].get<double>(), f["memory_tier_own_copies"]["ettr"].get<double>());
  }
  // TP x PP divide the model per device.
  in.tp = 4;
  in.pp = 2;
  EXPECT_NEAR(PlanJson(in)["device"]["model_states"].get<double>(), hybrid["device"]["model_states"].get<double>() / 8, 1e3);
  // Bad meshes.
  in.shard_group = 7;
  std::ostringstream os;
  EXPECT_EQ(Plan(in, true, os).code(), StatusCode::kInvalidArgument);
}

// qwZ and qgZ: the gathers and the reduce-scatter at 1 + 4/block bytes per value instead of the
// dtype's 2; qgZ over 16 nodes of 8 goes two levels (7/8 of its codes inside the node, 1/8 of them
// across).
TEST(Plan, QuantizedCollectivesShrinkTheirVolumes) {
  PlanInput in;
  in.params = 8e9;
  in.gpus = 128;
  in.gpus_per_node = 8;
  in.stage = 3;
  const double E = 8e9, f = 127.0 / 128;
  const double exact = PlanJson(in)["comm_bytes_per_step"].get<double>();
  EXPECT_NEAR(exact, 3 * 2 * E * f, 1e3);
  in.quantized_weights = true;
  EXPECT_NEAR(PlanJson(in)["comm_bytes_per_step"].get<double>(), (2 * (1 + 4.0 / 256) + 2) * E * f, 1e3);
  in.quantized_gradients = true;  // two levels: 7/8 of the codes inside a node, 1/8 x 15/16 across
  const double two = 7.0 / 8 + 1.0 / 8 * 15 / 16;
  EXPECT_NEAR(PlanJson(in)["comm_bytes_per_step"].get<double>(), (2 * f + two) * (1 + 4.0 / 256) * E, 1e3);
  EXPECT_NEAR(PlanJson(in)["mesh"]["by_shard_group"].back()["across_nodes_bytes"].get<double>(),
              (2 * f + 1.0 / 8 * 15 / 16) * (1 + 4.0 / 256) * E, 1e3);
  in.quantization_block = 64;
  EXPECT_NEAR(PlanJson(in)["comm_bytes_per_step"].get<double>(), (2 * f + two) * (1 + 4.0 / 64) * E, 1e3);
  // Stage 2: the reduce-scatter quantized, the gather of the updated parameters exact.
  in.quantized_weights = false;
  in.quantization_block = 256;
  in.stage = 2;
  EXPECT_NEAR(PlanJson(in)["comm_bytes_per_step"].get<double>(), (1 + 4.0 / 256) * two * E + 2 * E * f, 1e3);
  std::ostringstream text;
  ASSERT_TRUE(Plan(in, false, text).ok());
  EXPECT_NE(text.str().find("int8 reductions (qgZ)"), std::string::npos) << text.str();
  // int4 codes: half a byte per value, with a scale per 256 values, and by default (block 0) per 64.
  in.quantized_gradient_bits = 4;
  EXPECT_NEAR(PlanJson(in)["comm_bytes_per_step"].get<double>(), (0.5 + 4.0 / 256) * two * E + 2 * E * f, 1e3);
  in.quantization_block = 0;
  EXPECT_NEAR(PlanJson(in)["comm_bytes_per_step"].get<double>(), (0.5 + 4.0 / 64) * two * E + 2 * E * f, 1e3);
  in.quantization_block = 256;
  std::ostringstream text4;
  ASSERT_TRUE(Plan(in, false, text4).ok());
  EXPECT_NE(text4.str().find("int4 reductions (qgZ)"), std::string::npos) << text4.str();
  in.quantization_block = 255;
  std::ostringstream odd;
  const Status odd_block = Plan(in, false, odd);
  EXPECT_EQ(odd_block.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(odd_block.message().find("255"), std::string::npos) << odd_block;
  in.quantization_block = 256;
  in.quantized_gradient_bits = 8;
  // Where they cannot be.
  for (auto bad : {std::make_pair(2, true), std::make_pair(0, false)}) {
    PlanInput b;
    b.params = 1e9;
    b.stage = bad.first;
    b.quantized_weights = bad.second;
    b.quantized_gradients = !bad.second;
    std::ostringstream os;
    EXPECT_EQ(Plan(b, true, os).code(), StatusCode::kInvalidArgument) << "stage " << bad.first;
  }
}

// hpZ: the backward's gather moves inside the node (in the dtype, over P devices), a P-th of the
// parameters more on every device; refused where it cannot apply.
TEST(Plan, SecondaryShardsMoveTheBackwardsGatherInsideTheNode) {
  PlanInput in;
  in.params = 8e9;
  in.gpus = 128;
  in.gpus_per_node = 8;
  in.stage = 3;
  in.intra_gbps = 100;
  in.inter_gbps = 10;
  const double E = 8e9, f = 127.0 / 128;
  const auto flat = PlanJson(in);
  in.secondary_shard_group = 8;
  const auto hpz = PlanJson(in);
  EXPECT_NEAR(hpz["comm_bytes_per_step"].get<double>(), 2 * 2 * E * f + 2 * E * 7.0 / 8, 1e3);
  EXPECT_NEAR(hpz["device"]["params"].get<double>() - flat["device"]["params"].get<double>(), 2 * E / 8, 1e3);
  const auto& row = hpz["mesh"]["by_shard_group"];
  for (const auto& r : row) {
    if (r["shard_group"].get<int>() != 128) continue;
    EXPECT_NEAR(r["across_nodes_bytes"].get<double>(), 2 * 2 * E * f, 1e3) << "the forward's gather and the reduce-scatter";
    EXPECT_NEAR(r["inside_node_bytes"].get<double>(), 2 * E * 7.0 / 8, 1e3) << "the backward's gather";
  }
  std::ostringstream text;
  ASSERT_TRUE(Plan(in, false, text).ok());
  EXPECT_NE(text.str().find("(hpZ)"), std::string::npos) << text.str();
  for (auto [stage, p, shards] : {std::tuple{2, 8, 0}, std::tuple{3, 128, 0}, std::tuple{3, 3, 0}, std::tuple{3, 8, 8}}) {
    PlanInput b = in;
    b.stage = stage;
    b.secondary_shard_group = p;
    b.shard_group = shards;
    std::ostringstream os;
    EXPECT_EQ(Plan(b, true, os).code(), StatusCode::kInvalidArgument) << stage << " " << p << " " << shards;
  }
}

TEST(Plan, TransformerShapeActivationsAndTime) {
  PlanInput in;  // GPT-3 175B-like shape
  in.layers = 96;
  in.hidden = 12288;
  in.heads = 96;
  in.seq = 2048;
  in.vocab = 51200;
  in.batch = 1;
  in.gpus = 1024;
  in.tokens = 300e9;
  in.tflops = 140;
  in.power_watts = 400;
  const auto j = PlanJson(in);
  EXPECT_NEAR(j["params"].get<double>(), 175e9, 0.02 * 175e9);
  // Per layer s*b*h*(34 + 5*a*s/h); full recomputation keeps 2*s*b*h per layer.
  EXPECT_NEAR(j["device"]["activations"].get<double>(), 96.0 * 2048 * 12288 * (34 + 5.0 * 96 * 2048 / 12288), 1e6);
  EXPECT_NEAR(j["device"]["activations_recompute"].get<double>(), 96.0 * 2 * 2048 * 12288, 1e3);
  const double p = j["params"].get<double>();
  EXPECT_NEAR(j["train_seconds"]["with_recompute"].get<double>(), 8 * p * 300e9 / (1024 * 140e12), 1);
  EXPECT_GT(j["energy_kwh"]["with_recompute"].get<double>(), 0);
}

TEST(Plan, NonsenseIsRejected) {
  std::ostringstream os;
  PlanInput in;
  EXPECT_EQ(Plan(in, false, os).code(), StatusCode::kInvalidArgument);  // no size
  in.params = 1e9;
  in.gpus = 0;
  EXPECT_EQ(Plan(in, false, os).code(), StatusCode::kInvalidArgument);
  in.gpus = 8;
  in.stage = 7;
  EXPECT_EQ(Plan(in, false, os).code(), StatusCode::kInvalidArgument);
  in.stage = 0;
  in.offload = "nvme";
  EXPECT_EQ(Plan(in, false, os).code(), StatusCode::kInvalidArgument);  // stage 0 has no shard to offload
  in.stage = 2;
  in.offload = "none";
  in.offload_params = "cpu";
  EXPECT_EQ(Plan(in, false, os).code(), StatusCode::kInvalidArgument);  // parameters offload at stage 3 only
  in.offload_params = "none";
  in.offload = "tape";
  in.stage = 3;
  EXPECT_EQ(Plan(in, false, os).code(), StatusCode::kInvalidArgument);
  PlanInput shape;
  shape.layers = 2;
  shape.hidden = 10;
  shape.heads = 3;
  shape.seq = 8;
  shape.vocab = 10;
  EXPECT_EQ(Plan(shape, false, os).code(), StatusCode::kInvalidArgument);  // hidden % heads
}

// Llama shapes: SwiGLU, grouped-query attention, untied embeddings, no position table.
TEST(Plan, LlamaShapesCountTheirParameters) {
  PlanInput in;
  in.arch = "llama";
  in.gpus = 64;
  in.recompute = true;
  in.layers = 80, in.hidden = 8192, in.heads = 64, in.kv_heads = 8, in.ffn = 28672, in.vocab = 32000, in.seq = 4096;
  EXPECT_NEAR(PlanJson(in)["params"].get<double>(), 68.98e9, 0.01e9);  // Llama-2-70B: 68,976,648,192
  in.layers = 32, in.hidden = 4096, in.heads = 32, in.kv_heads = 0, in.ffn = 11008;
  EXPECT_NEAR(PlanJson(in)["params"].get<double>(), 6.738e9, 0.005e9);  // Llama-2-7B: 6,738,415,616
  in.ffn = 0;  // 8h/3 rounded up to 256: 11008 again
  EXPECT_NEAR(PlanJson(in)["params"].get<double>(), 6.738e9, 0.005e9);
}

// DeepSpeed's estimator on the inputs of its own documentation (t5-3b: 2851M parameters, largest
// layer 32.9M, one node of 8 GPUs) reproduces the figures it prints there, in GiB.
TEST(Plan, DeepSpeedsEstimatorFiguresForTheSameInputs) {
  PlanInput in;
  in.params = 2851598336;
  in.largest_layer = 32899072;
  in.gpus = 8;
  const auto ds = PlanJson(in)["deepspeed"];
  auto gib = [](const nlohmann::json& v) { return std::round(v.get<double>() / kGiB * 100) / 100; };
  EXPECT_EQ(gib(ds["zero2"][0]["gpu"]), 5.31);
  EXPECT_EQ(gib(ds["zero2"][0]["cpu"]), 127.48);
  EXPECT_EQ(gib(ds["zero2"][1]["gpu"]), 15.93);
  EXPECT_EQ(gib(ds["zero2"][1]["cpu"]), 127.48);
  const double z3[][2] = {{0.12, 71.71}, {0.12, 127.48}, {0.79, 63.74}, {0.79, 127.48}, {6.10, 1.47}, {6.10, 127.48}};
  ASSERT_EQ(ds["zero3"].size(), 6u);
  for (size_t r = 0; r < 6; ++r) {
    EXPECT_EQ(gib(ds["zero3"][r]["gpu"]), z3[r][0]) << "row " << r;
    EXPECT_EQ(gib(ds["zero3"][r]["cpu"]), z3[r][1]) << "row " << r;
  }
}

// Stage 3 with everything on NVMe still holds the gathered layers, their gradients and the buckets;
// parameters can go to the host; a plan from --params says it leaves activations out.
TEST(Plan, TheStage3WorkingSetIsCountedAndWhatIsLeftOutIsSaid) {
  PlanInput in;
  in.params = 7.5e9;
  in.largest_layer = 100e6;
  in.gpus = 8;
  in.stage = 3;
  in.offload = "nvme";
  in.offload_params = "nvme";
  const auto j = PlanJson(in);
  EXPECT_EQ(j["device"]["params"].get<double>(), 0);
  EXPECT_EQ(j["device"]["optimizer"].get<double>(), 0);
  // One layer in use and two prefetched (16-bit) + one layer's gradient.
  EXPECT_DOUBLE_EQ(j["device"]["working_set"].get<double>(), 3 * 2 * 100e6 + 2 * 100e6);
  EXPECT_GT(j["device"]["buckets"].get<double>(), 64e6);
  EXPECT_NEAR(j["nvme"].get<double>(), (12 + 2) * 7.5e9 / 8, 1);
  EXPECT_NE(j["left_out"].dump().find("activations"), std::string::npos);
  in.offload_params = "cpu";
  EXPECT_NEAR(PlanJson(in)["host"].get<double>(), (2 + 2) * 7.5e9 / 8, 1);  // parameters + the host's copy of the bf16 gradient shard
  in.fp32_grads = true;
  EXPECT_NEAR(PlanJson(in)["host"].get<double>(), (2 + 4) * 7.5e9 / 8, 1);  // ... an fp32 one
  in.fp32_grads = false;
  in.largest_layer = 0;
  EXPECT_NE(PlanJson(in)["left_out"].dump().find("--largest-layer"), std::string::npos);
}

// The recommendation: the cheapest configuration that fits, with the largest micro-batch up to the
// given one; none (exit 1) when nothing does.
TEST(Plan, RecommendsTheCheapestThatFitsOrSaysNothingDoes) {
  PlanInput in;  // GPT-2 XL-like on 8 x 16 GiB
  in.layers = 48, in.hidden = 1600, in.heads = 25, in.seq = 1024, in.vocab = 50257, in.batch = 16;
  in.gpus = 8;
  in.gpu_mem_gib = 16;
  auto r = PlanJson(in)["recommendation"];
  ASSERT_TRUE(r.is_object());
  EXPECT_GE(r["stage"].get<int>(), 1);  // 1.5B x 16 bytes does not fit unsharded
  EXPECT_LE(r["device_total"].get<double>(), 16 * kGiB);
  EXPECT_GE(r["micro_batch"].get<int>(), 1);
  // More memory: a cheaper configuration and a larger micro-batch never become worse.
  in.gpu_mem_gib = 80;
  auto big = PlanJson(in)["recommendation"];
  EXPECT_LE(big["stage"].get<int>(), r["stage"].get<int>());
  EXPECT_GE(big["micro_batch"].get<int>(), r["micro_batch"].get<int>());
  in.gpu_mem_gib = 0.01;
  auto none = PlanJson(in, StatusCode::kFailedPrecondition);
  EXPECT_TRUE(none["recommendation"].is_null());
  EXPECT_FALSE(none["fits"].get<bool>());
}

// A checkpoint holds the state as it is kept: 12 bytes per parameter of f32 state, two q8 moments
// and the 2-byte parameters without a master.
TEST(Plan, CheckpointBytesFollowTheStatePrecision) {
  PlanInput in;
  in.params = 8e9;
  in.gpus = 8;
  EXPECT_NEAR(PlanJson(in)["failures"]["checkpoint_bytes_per_device"].get<double>(), 12 * 1e9, 1);
  in.moments = "q8";
  in.master = false;
  EXPECT_NEAR(PlanJson(in)["failures"]["checkpoint_bytes_per_device"].get<double>(), (2 * (1 + 4.0 / 256) + 2) * 1e9, 1);
  in.moments = "bf16";
  in.master = true;
  EXPECT_NEAR(PlanJson(in)["failures"]["checkpoint_bytes_per_device"].get<double>(), 8 * 1e9, 1);
  // At stage 0 every device holds the whole state: its snapshot and restart move all of it; the save
  // is spread over the 8 replicas.
  in.stage = 0;
  const auto f = PlanJson(in)["failures"];
  EXPECT_NEAR(f["checkpoint_bytes_per_device"].get<double>(), 8 * 8e9, 1);
  EXPECT_NEAR(f["checkpoint_written_bytes_per_device"].get<double>(), 8 * 1e9, 1);
  EXPECT_EQ(f["replicas"], 8);
}

}  // namespace
}  // namespace zrt::tools
