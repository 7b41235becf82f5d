#include "zrt/runtime/config_json.h"

#include "zrt/core/json_reader.h"
#include "zrt/runtime/loss_scaler.h"

#include "zrt/kernels/adam.h"

namespace zrt {

namespace {

Result<kernels::AdamMode> ParseAdamMode(std::string_view s) {
  if (s == "adamw") return kernels::AdamMode::kAdamW;
  if (s == "adam" || s == "adam_l2") return kernels::AdamMode::kAdamL2;
  return InvalidArgumentError("adam mode must be adamw or adam (L2 weight decay), got '", s, "'");
}


// The objects of an engine configuration, each read and checked under its key.
Status ReadAdam(JsonReader& r, EngineConfig& c) {
  ASSIGN_OR_RETURN(JsonReader a, r.Child("adam"));
  RETURN_IF_ERROR(a.Read("lr", &c.adam.lr));
  RETURN_IF_ERROR(a.Read("beta1", &c.adam.beta1));
  RETURN_IF_ERROR(a.Read("beta2", &c.adam.beta2));
  RETURN_IF_ERROR(a.Read("eps", &c.adam.eps));
  RETURN_IF_ERROR(a.Read("weight_decay", &c.adam.weight_decay));
  RETURN_IF_ERROR(a.Read<kernels::AdamMode>("mode", &c.adam.mode, ParseAdamMode));
  RETURN_IF_ERROR(a.Read("amsgrad", &c.adam.amsgrad));
  RETURN_IF_ERROR(a.Read("bias_correction", &c.adam.bias_correction));
  RETURN_IF_ERROR(a.Finish());
  return Status();
}

Status ReadLrSchedule(JsonReader& r, EngineConfig& c) {
  ASSIGN_OR_RETURN(JsonReader s, r.Child("lr_schedule"));
  RETURN_IF_ERROR(s.Read<LrSchedule::Kind>("kind", &c.lr_schedule.kind, ParseLrScheduleKind));
  RETURN_IF_ERROR(s.Read("warmup_steps", &c.lr_schedule.warmup_steps));
  RETURN_IF_ERROR(s.Read("total_steps", &c.lr_schedule.total_steps));
  RETURN_IF_ERROR(s.Read("min_lr_ratio", &c.lr_schedule.min_lr_ratio));
  RETURN_IF_ERROR(s.Finish());
  RETURN_IF_ERROR(c.lr_schedule.Validate(), s.path());
  return Status();
}

Status ReadLossScale(JsonReader& r, EngineConfig& c) {
  ASSIGN_OR_RETURN(JsonReader l, r.Child("loss_scale"));
  RETURN_IF_ERROR(l.Read<LossScaleMode>("mode", &c.loss_scale.mode, ParseLossScaleMode));
  RETURN_IF_ERROR(l.Read("init_scale", &c.loss_scale.init_scale));
  RETURN_IF_ERROR(l.Read("growth", &c.loss_scale.growth));
  RETURN_IF_ERROR(l.Read("backoff", &c.loss_scale.backoff));
  RETURN_IF_ERROR(l.Read("growth_interval", &c.loss_scale.growth_interval));
  RETURN_IF_ERROR(l.Read("hysteresis", &c.loss_scale.hysteresis));
  RETURN_IF_ERROR(l.Read("min_scale", &c.loss_scale.min_scale));
  RETURN_IF_ERROR(l.Finish());
  RETURN_IF_ERROR(LossScaler::Create(c.loss_scale).status(), l.path());
  return Status();
}

Status ReadOffload(JsonReader& r, EngineConfig& c) {
  ASSIGN_OR_RETURN(JsonReader o, r.Child("offload"));
  RETURN_IF_ERROR(o.Read<OffloadTarget>("optimizer", &c.offload.optimizer, ParseOffloadTarget));
  RETURN_IF_ERROR(o.Read<OffloadTarget>("params", &c.offload.params, ParseOffloadTarget));
  RETURN_IF_ERROR(o.Read("nvme_dir", &c.offload.nvme_dir));
  RETURN_IF_ERROR(o.Read("host_budget_bytes", &c.offload.host_budget_bytes));
  RETURN_IF_ERROR(o.Read("sub_group_elements", &c.offload.sub_group_elements));
  ASSIGN_OR_RETURN(JsonReader io, o.Child("io"));
  RETURN_IF_ERROR(ReadIoOptions(io, &c.offload.io));
  RETURN_IF_ERROR(o.Finish());
  return Status();
}

// "state": {"exp_avg": "q8", "exp_avg_sq": "q8", "master": false, "q8_block": 256}
Status ReadState(JsonReader& r, EngineConfig& c) {
  ASSIGN_OR_RETURN(JsonReader st, r.Child("state"));
  RETURN_IF_ERROR(st.Read<Precision>("exp_avg", &c.state.exp_avg, ParsePrecision));
  RETURN_IF_ERROR(st.Read<Precision>("exp_avg_sq", &c.state.exp_avg_sq, ParsePrecision));
  RETURN_IF_ERROR(st.Read("master", &c.state.master));
  RETURN_IF_ERROR(st.Read("q8_block", &c.state.q8_block));
  RETURN_IF_ERROR(st.Finish());
  RETURN_IF_ERROR(kernels::CheckCompactFormat({c.state.exp_avg, c.state.exp_avg_sq, c.state.master, c.state.q8_block, 0}), st.path());
  if (c.state.compact() && c.adam.amsgrad) return InvalidArgumentError(st.path(), ": amsgrad needs f32 moments and a master");
  return Status();
}

Status ReadMetrics(JsonReader& r, EngineConfig& c) {
  ASSIGN_OR_RETURN(JsonReader m, r.Child("metrics"));
  RETURN_IF_ERROR(m.Read("tokens_per_step", &c.metrics.tokens_per_step));
  RETURN_IF_ERROR(m.Read("flops_per_step", &c.metrics.flops_per_step));
  RETURN_IF_ERROR(m.Read("peak_flops", &c.metrics.peak_flops));
  RETURN_IF_ERROR(m.Read("jsonl_path", &c.metrics.jsonl_path));
  RETURN_IF_ERROR(m.Finish());
  for (const char* k : {"tokens_per_step", "flops_per_step", "peak_flops"}) {
    double v = 0;
    RETURN_IF_ERROR(m.Read(k, &v));
    if (v < 0) return InvalidArgumentError(m.Path(k), ": must be >= 0");
  }
  return Status();
}

}  // namespace

Result<EngineConfig> EngineConfigFromJson(const nlohmann::json& j, const EngineConfig& defaults, const std::string& path) {
  EngineConfig c = defaults;
  ASSIGN_OR_RETURN(JsonReader r, JsonReader::Object(j, path));
  RETURN_IF_ERROR(r.Read("stage", &c.stage));
  RETURN_IF_ERROR(r.Read("shard_group_size", &c.shard_group_size));
  RETURN_IF_ERROR(r.Read<DType>("reduce_dtype", &c.reduce_dtype, ParseDType));
  RETURN_IF_ERROR(r.Read("bucket_bytes", &c.bucket_bytes));
  RETURN_IF_ERROR(r.Read("alignment", &c.alignment));
  RETURN_IF_ERROR(r.Read("max_live_gathered_bytes", &c.max_live_gathered_bytes));
  RETURN_IF_ERROR(r.Read("prefetch_depth", &c.prefetch_depth));
  RETURN_IF_ERROR(r.Read("quantized_weights", &c.quantized_weights));
  RETURN_IF_ERROR(r.Read("quantized_gradients", &c.quantized_gradients));
  RETURN_IF_ERROR(r.Read("quantized_gradient_bits", &c.quantized_gradient_bits));
  RETURN_IF_ERROR(r.Read("quantization_block", &c.quantization_block));
  RETURN_IF_ERROR(r.Read("secondary_shard_group", &c.secondary_shard_group));
  RETURN_IF_ERROR(r.Read("max_grad_norm", &c.max_grad_norm));
  RETURN_IF_ERROR(r.Read("grad_accum_steps", &c.grad_accum_steps));
  RETURN_IF_ERROR(r.Read("fp32_grads", &c.fp32_grads));
  RETURN_IF_ERROR(r.Read("optimizer_threads", &c.optimizer_threads));
  RETURN_IF_ERROR(ReadAdam(r, c));
  RETURN_IF_ERROR(ReadLrSchedule(r, c));
  RETURN_IF_ERROR(ReadLossScale(r, c));
  RETURN_IF_ERROR(ReadOffload(r, c));
  RETURN_IF_ERROR(ReadState(r, c));
  RETURN_IF_ERROR(ReadMetrics(r, c));
  RETURN_IF_ERROR(r.Finish());
  // The rest of the checks are ZeroEngine::Create's; run them here so a bad file fails at parse time.
  if (c.stage < 0 || c.stage > 3) return InvalidArgumentError(r.Path("stage"), ": must be 0, 1, 2 or 3, got ", c.stage);
  if (c.shard_group_size < EngineConfig::kShardGroupNode) {
    return InvalidArgumentError(r.Path("shard_group_size"), ": must be >= -1 (0: the whole world, -1: a node)");
  }
  if (c.reduce_dtype == DType::kBytes) return InvalidArgumentError(r.Path("reduce_dtype"), ": must be a floating type");
  if (c.bucket_bytes < 1) return InvalidArgumentError(r.Path("bucket_bytes"), ": must be >= 1");
  if (c.alignment < 1) return InvalidArgumentError(r.Path("alignment"), ": must be >= 1");
  if (c.grad_accum_steps < 1) return InvalidArgumentError(r.Path("grad_accum_steps"), ": must be >= 1");
  if (!(c.max_grad_norm >= 0)) return InvalidArgumentError(r.Path("max_grad_norm"), ": must be >= 0 (0 = off)");
  if (c.prefetch_depth < 0) return InvalidArgumentError(r.Path("prefetch_depth"), ": must be >= 0");
  if (c.quantized_weights && c.stage != 3) return InvalidArgumentError(r.Path("quantized_weights"), ": needs stage 3");
  if (c.quantized_gradients && c.stage == 0) return InvalidArgumentError(r.Path("quantized_gradients"), ": needs stage 1-3");
  if (c.quantization_block < 0) return InvalidArgumentError(r.Path("quantization_block"), ": must be >= 0 (0: each width's own)");
  if (c.quantized_gradient_bits != 8 && c.quantized_gradient_bits != 4) {
    return InvalidArgumentError(r.Path("quantized_gradient_bits"), ": must be 8 or 4, got ", c.quantized_gradient_bits);
  }
  if (c.quantized_gradients && c.quantized_gradient_bits == 4 && c.quantization_block % 2 != 0) {  // (0 is even: 64)
    return InvalidArgumentError(r.Path("quantization_block"), ": must be even with quantized_gradient_bits 4 (two codes a byte), got ",
                                c.quantization_block);
  }
  if (c.secondary_shard_group != 0 && c.stage != 3) return InvalidArgumentError(r.Path("secondary_shard_group"), ": needs stage 3");
  if (c.secondary_shard_group < EngineConfig::kShardGroupNode || c.secondary_shard_group == 1) {
    return InvalidArgumentError(r.Path("secondary_shard_group"), ": must be 0 (off), -1 (a node) or >= 2");
  }
  RETURN_IF_ERROR(kernels::MakeAdamStepScalars(c.adam, 1).status(), r.Path("adam"));
  return c;
}

}  // namespace zrt
