// zrt plan: what a model needs, before launching.
//
// Model states (bytes per device), P = param bytes per element (2 for bf16/f16), Psi parameters,
// N devices, K = optimizer bytes per parameter (12 with mixed precision: fp32 master + Adam moments;
// 8 for fp32 models: the moments only) — Rajbhandari et al., "ZeRO", SC'20, section 5:
//   stage 0: (2P + K) Psi     stage 1: 2P Psi + K Psi/N     stage 2: P Psi + (P + K) Psi/N
//   stage 3: (2P + K) Psi / N
// Offload (ZeRO-Offload / ZeRO-Infinity): optimizer state (and the gradient shard) move to host
// memory (cpu) or NVMe (nvme); at stage 3 with nvme the parameter shards go to NVMe too.
// Activations, per layer, 16-bit, no tensor/sequence parallelism — Korthikanti et al., "Reducing
// Activation Recomputation in Large Transformer Models", MLSys'23, eq. 2: s*b*h*(34 + 5*a*s/h) bytes;
// with full recomputation only the layer input is kept: 2*s*b*h bytes.
// Communication per step per device (ring collectives): stages 0-2 2 Psi P (N-1)/N, stage 3
// 3 Psi P (N-1)/N. Time: 8 Psi T / (N X) with recomputation, 6 Psi T / (N X) without.
#include <cmath>
#include <iomanip>

#include <nlohmann/json.hpp>

#include "zrt/core/device.h"
#include "tools/lib/plan.h"

namespace zrt::tools {

Status Plan(const PlanInput& in, bool as_json, std::ostream& out) {
  const bool shape = in.layers > 0 || in.hidden > 0;
  if (shape && (in.layers <= 0 || in.hidden <= 0 || in.heads <= 0 || in.seq <= 0 || in.vocab <= 0 || in.batch <= 0)) {
    return InvalidArgumentError("plan: a transformer shape needs --layers, --hidden, --heads, --seq, --vocab > 0 and --batch >= 1");
  }
  if (shape && in.hidden % in.heads != 0) return InvalidArgumentError("plan: --hidden must be a multiple of --heads");
  const double psi = shape ? 12.0 * in.layers * double(in.hidden) * in.hidden + double(in.vocab + in.seq) * in.hidden : in.params;
  if (!(psi > 0) || !std::isfinite(psi)) return InvalidArgumentError("plan: give --params > 0 or a transformer shape");
  if (in.gpus < 1) return InvalidArgumentError("plan: --gpus must be >= 1, got ", in.gpus);
  if (in.stage < 0 || in.stage > 3) return InvalidArgumentError("plan: --stage must be 0..3, got ", in.stage);
  if (in.offload != "none" && in.offload != "cpu" && in.offload != "nvme") {
    return InvalidArgumentError("plan: --offload must be none, cpu or nvme, got '", in.offload, "'");
  }
  if (in.offload != "none" && in.stage < 2) return InvalidArgumentError("plan: offload needs --stage 2 or 3 (as in ZeRO-Offload)");
  if (in.param_bytes != 2 && in.param_bytes != 4) return InvalidArgumentError("plan: parameter dtype must be 2 or 4 bytes");
  if (in.gpu_mem_gib <= 0 || in.tokens < 0 || in.tflops < 0 || in.power_watts < 0 || in.step_seconds < 0) {
    return InvalidArgumentError("plan: --gpu-mem must be > 0; --tokens, --tflops, --power, --step-time >= 0");
  }
  const double n = in.gpus, p = in.param_bytes, k = in.param_bytes == 2 ? 12.0 : 8.0;
  double params = 0, grads = 0, optim = 0;  // on the device
  switch (in.stage) {
    case 0: params = p * psi, grads = p * psi, optim = k * psi; break;
    case 1: params = p * psi, grads = p * psi, optim = k * psi / n; break;
    case 2: params = p * psi, grads = p * psi / n, optim = k * psi / n; break;
    default: params = p * psi / n, grads = p * psi / n, optim = k * psi / n; break;
  }
  double host = 0, nvme = 0;
  if (in.offload == "cpu") {
    host = optim + grads, optim = 0, grads = 0;
  } else if (in.offload == "nvme") {
    nvme = optim, optim = 0, host = grads, grads = 0;
    if (in.stage == 3) nvme += params, params = 0;  // parameter shards on NVMe, fetched per layer
  }
  const double states = params + grads + optim;
  double act = 0, act_recompute = 0;
  if (shape) {
    const double s = double(in.seq), b = double(in.batch), h = in.hidden, a = in.heads;
    act = in.layers * s * b * h * (34.0 + 5.0 * a * s / h);
    act_recompute = in.layers * 2.0 * s * b * h;
  }
  const double cap = in.gpu_mem_gib * double(1ull << 30);
  const double comm = (in.stage == 3 ? 3.0 : 2.0) * psi * p * (n - 1) / n;
  const double flops = in.tflops * 1e12;
  const double t_recompute = flops > 0 ? 8.0 * psi * in.tokens / (n * flops) : 0, t_plain = flops > 0 ? 6.0 * psi * in.tokens / (n * flops) : 0;
  nlohmann::json j = {
      {"units", "bytes (GB = 1e9 bytes, GiB = 2^30 bytes); seconds"},
      {"params", psi}, {"gpus", in.gpus}, {"stage", in.stage}, {"offload", in.offload},
      {"device", {{"params", params}, {"grads", grads}, {"optimizer", optim}, {"model_states", states},
                  {"activations", act}, {"activations_recompute", act_recompute}, {"capacity", cap}}},
      {"host", host}, {"nvme", nvme},
      {"fits", states + act <= cap}, {"fits_with_recompute", states + act_recompute <= cap},
      {"comm_bytes_per_step", comm},
  };
  if (in.step_seconds > 0) j["bandwidth_to_hide_comm"] = comm / in.step_seconds;
  if (flops > 0 && in.tokens > 0) {
    j["train_seconds"] = {{"with_recompute", t_recompute}, {"without_recompute", t_plain}};
    if (in.power_watts > 0) j["energy_kwh"] = {{"with_recompute", t_recompute * n * in.power_watts / 3.6e6},
                                                {"without_recompute", t_plain * n * in.power_watts / 3.6e6}};
  }
  if (as_json) {
    out << j.dump(1) << "\n";
    return Status();
  }
  auto gib = [](double b) { return FormatBytes(static_cast<int64_t>(b)); };
  out << std::fixed << std::setprecision(3);
  out << "model: " << psi / 1e9 << " B parameters (" << (in.param_bytes == 2 ? "16-bit" : "fp32") << " + Adam), " << in.gpus
      << " device(s), ZeRO stage " << in.stage << ", offload " << in.offload << "\n";
  out << "per device:  params " << gib(params) << "   grads " << gib(grads) << "   optimizer " << gib(optim)
      << "   model states " << gib(states) << "\n";
  if (shape) {
    out << "activations (Korthikanti et al. 2022, eq. 2; seq " << in.seq << ", micro-batch " << in.batch << "): "
        << gib(act) << "; with full recomputation " << gib(act_recompute) << "\n";
  }
  if (host > 0) out << "host memory per device: " << gib(host) << "\n";
  if (nvme > 0) out << "NVMe per device: " << gib(nvme) << "\n";
  out << "fits in " << in.gpu_mem_gib << " GiB: " << (states + act <= cap ? "yes" : "no")
      << (shape ? std::string(", with recomputation: ") + (states + act_recompute <= cap ? "yes" : "no") : "") << "\n";
  out << "communication per step per device: " << comm / 1e9 << " GB";
  if (in.step_seconds > 0) out << "; to hide it in a " << in.step_seconds << " s step: " << comm / in.step_seconds / 1e9 << " GB/s";
  out << "\n";
  if (flops > 0 && in.tokens > 0) {
    out << "training " << in.tokens / 1e9 << " B tokens at " << in.tflops << " TFLOP/s per device: " << t_recompute / 86400
        << " days with recomputation (8PT/NX), " << t_plain / 86400 << " days without (6PT/NX)\n";
    if (in.power_watts > 0) {
      out << "energy at " << in.power_watts << " W per device: " << t_recompute * n * in.power_watts / 3.6e6 << " kWh ("
          << t_plain * n * in.power_watts / 3.6e6 << " without recomputation)\n";
    }
  }
  return Status();
}

}  // namespace zrt::tools
