#include "zrt/runtime/config_json.h"
#include "zrt/core/json_reader.h"

#include <gtest/gtest.h>

namespace zrt {
namespace {

TEST(EngineConfigJson, StatePrecision) {
  auto j = ParseJson(R"({"state": {"exp_avg": "q8", "exp_avg_sq": "bf16", "master": false, "q8_block": 128}})", "test");
  ASSERT_TRUE(j.ok());
  auto c = EngineConfigFromJson(*j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->state, (StatePrecision{Precision::kQ8, Precision::kBf16, false, 128}));
  auto q4 = EngineConfigFromJson(*ParseJson(R"({"state": {"exp_avg": "q4", "exp_avg_sq": "q4", "master": false}})", "test"));
  ASSERT_TRUE(q4.ok()) << q4.status();
  EXPECT_EQ(q4->state, (StatePrecision{Precision::kQ4, Precision::kQ4, false, 256}));
  for (const char* bad : {R"({"state": {"exp_avg": "int8"}})", R"({"state": {"exp_avg_sq": "q2"}})", R"({"state": {"q8_block": 100}})", R"({"state": {"masters": true}})",
                          R"({"adam": {"amsgrad": true}, "state": {"exp_avg": "bf16"}})"}) {
    auto b = EngineConfigFromJson(*ParseJson(bad, "test"));
    EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(b.status().message().find("state"), std::string::npos) << b.status();
  }
}

TEST(EngineConfigJson, EveryFieldIsRead) {
  auto j = ParseJson(R"({
    "stage": 3, "shard_group_size": 8, "reduce_dtype": "bf16", "bucket_bytes": 1048576, "alignment": 128,
    "max_live_gathered_bytes": 2147483648, "prefetch_depth": 3, "max_grad_norm": 1.0, "grad_accum_steps": 4,
    "quantized_weights": true, "quantized_gradients": true, "quantized_gradient_bits": 4, "quantization_block": 512,
    "fp32_grads": true, "optimizer_threads": 6,
    "adam": {"lr": 3e-4, "beta1": 0.8, "beta2": 0.95, "eps": 1e-6, "weight_decay": 0.1, "mode": "adam",
             "amsgrad": true, "bias_correction": false},
    "lr_schedule": {"kind": "cosine", "warmup_steps": 100, "total_steps": 1000, "min_lr_ratio": 0.1},
    "loss_scale": {"mode": "dynamic", "init_scale": 1024, "growth": 4, "backoff": 0.25, "growth_interval": 100,
                   "hysteresis": 2, "min_scale": 2},
    "offload": {"optimizer": "nvme", "params": "nvme", "nvme_dir": "/mnt/nvme", "host_budget_bytes": 4294967296,
                "sub_group_elements": 1000000, "io": {"backend": "threads", "queue_depth": 8, "block_bytes": 65536, "threads": 2}},
    "metrics": {"tokens_per_step": 4096, "flops_per_step": 1e12, "peak_flops": 9.9e14, "jsonl_path": "/tmp/m-{rank}.jsonl"}
  })", "test");
  ASSERT_TRUE(j.ok()) << j.status();
  auto c = EngineConfigFromJson(*j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->stage, 3);
  EXPECT_EQ(c->shard_group_size, 8);
  EXPECT_EQ(c->reduce_dtype, DType::kBF16);
  EXPECT_EQ(c->bucket_bytes, 1048576);
  EXPECT_EQ(c->alignment, 128);
  EXPECT_EQ(c->max_live_gathered_bytes, 2147483648);
  EXPECT_EQ(c->prefetch_depth, 3);
  EXPECT_TRUE(c->quantized_weights);
  EXPECT_TRUE(c->quantized_gradients);
  EXPECT_EQ(c->quantized_gradient_bits, 4);
  EXPECT_EQ(c->quantization_block, 512);
  EXPECT_EQ(c->max_grad_norm, 1.0);
  EXPECT_EQ(c->grad_accum_steps, 4);
  EXPECT_TRUE(c->fp32_grads);
  EXPECT_EQ(c->optimizer_threads, 6);
  EXPECT_EQ(c->adam.lr, 3e-4);
  EXPECT_EQ(c->adam.beta1, 0.8);
  EXPECT_EQ(c->adam.beta2, 0.95);
  EXPECT_EQ(c->adam.eps, 1e-6);
  EXPECT_EQ(c->adam.weight_decay, 0.1);
  EXPECT_EQ(c->adam.mode, kernels::AdamMode::kAdamL2);
  EXPECT_TRUE(c->adam.amsgrad);
  EXPECT_FALSE(c->adam.bias_correction);
  EXPECT_EQ(c->lr_schedule, LrSchedule::Cosine(100, 1000, 0.1));
  EXPECT_EQ(c->loss_scale.mode, LossScaleMode::kDynamic);
  EXPECT_EQ(c->loss_scale.init_scale, 1024);
  EXPECT_EQ(c->loss_scale.growth, 4);
  EXPECT_EQ(c->loss_scale.backoff, 0.25);
  EXPECT_EQ(c->loss_scale.growth_interval, 100);
  EXPECT_EQ(c->loss_scale.hysteresis, 2);
  EXPECT_EQ(c->loss_scale.min_scale, 2);
  EXPECT_EQ(c->offload.optimizer, OffloadTarget::kNvme);
  EXPECT_EQ(c->offload.params, OffloadTarget::kNvme);
  EXPECT_EQ(c->offload.nvme_dir, "/mnt/nvme");
  EXPECT_EQ(c->offload.host_budget_bytes, 4294967296);
  EXPECT_EQ(c->offload.sub_group_elements, 1000000);
  EXPECT_EQ(c->offload.io.backend, IoOptions::Backend::kThreads);
  EXPECT_EQ(c->offload.io.queue_depth, 8);
  EXPECT_EQ(c->offload.io.block_bytes, 65536);
  EXPECT_EQ(c->offload.io.threads, 2);
  EXPECT_EQ(c->metrics.tokens_per_step, 4096);
  EXPECT_EQ(c->metrics.flops_per_step, 1e12);
  EXPECT_EQ(c->metrics.peak_flops, 9.9e14);
  EXPECT_EQ(c->metrics.jsonl_path, "/tmp/m-{rank}.jsonl");
}

TEST(EngineConfigJson, AbsentKeysKeepTheDefaults) {
  EngineConfig defaults;
  defaults.stage = 1;
  defaults.adam.lr = 0.5;
  auto c = EngineConfigFromJson(nlohmann::json::object(), defaults);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->stage, 1);
  EXPECT_EQ(c->adam.lr, 0.5);
  EXPECT_EQ(c->bucket_bytes, EngineConfig{}.bucket_bytes);
}

TEST(EngineConfigJson, UnknownKeysAndBadValuesAreRefusedWithTheirPath) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"stgae": 2})", "engine.stgae"},
      {R"({"offload": {"optimizr": "host"}})", "engine.offload.optimizr"},
      {R"({"offload": {"io": {"depth": 4}}})", "engine.offload.io.depth"},
      {R"({"stage": 4})", "engine.stage: must be 0, 1, 2 or 3"},
      {R"({"shard_group_size": -2})", "engine.shard_group_size: must be >= -1"},
      {R"({"stage": "3"})", "engine.stage: expected an integer"},
      {R"({"reduce_dtype": "int8"})", "engine.reduce_dtype"},
      {R"({"reduce_dtype": "bytes"})", "engine.reduce_dtype: must be a floating type"},
      {R"({"grad_accum_steps": 0})", "engine.grad_accum_steps"},
      {R"({"max_grad_norm": -1})", "engine.max_grad_norm"},
      {R"({"adam": {"lr": -1}})", "engine.adam"},
      {R"({"adam": {"mode": "sgd"}})", "engine.adam.mode"},
      {R"({"lr_schedule": {"kind": "cosine", "total_steps": 0}})", "engine.lr_schedule"},
      {R"({"lr_schedule": {"kind": "exponential"}})", "engine.lr_schedule.kind"},
      {R"({"loss_scale": {"mode": "dynamic", "backoff": 2}})", "engine.loss_scale"},
      {R"({"offload": {"optimizer": "disk"}})", "engine.offload.optimizer"},
      {R"({"offload": {"io": {"backend": "aio"}}})", "engine.offload.io.backend"},
      {R"({"offload": {"io": {"queue_depth": 0}}})", "engine.offload.io.queue_depth"},
      {R"({"fp32_grads": 1})", "engine.fp32_grads: expected true or false"},
      {R"({"stage": 2, "quantized_weights": true})", "engine.quantized_weights: needs stage 3"},
      {R"({"stage": 0, "quantized_gradients": true})", "engine.quantized_gradients: needs stage 1-3"},
      {R"({"stage": 3, "quantized_weights": true, "quantization_block": -1})", "engine.quantization_block: must be >= 0"},
      {R"({"quantized_gradient_bits": 2})", "engine.quantized_gradient_bits: must be 8 or 4, got 2"},
      {R"({"quantized_gradients": true, "quantized_gradient_bits": 4, "quantization_block": 33})",
       "engine.quantization_block: must be even with quantized_gradient_bits 4"},
      {R"([1, 2])", "engine: expected an object"},
      {R"({"metrics": {"peak_flops": -1}})", "engine.metrics.peak_flops: must be >= 0"},
      {R"({"metrics": {"jsonl": "x"}})", "engine.metrics.jsonl"},
  };
  for (const auto& [text, want] : cases) {
    auto j = ParseJson(text, "test");
    ASSERT_TRUE(j.ok()) << text;
    auto c = EngineConfigFromJson(*j);
    ASSERT_FALSE(c.ok()) << text;
    EXPECT_NE(c.status().message().find(want), std::string_view::npos) << text << " -> " << c.status();
  }
}

}  // namespace
}  // namespace zrt
