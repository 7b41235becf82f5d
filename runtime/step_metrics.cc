#include "zrt/runtime/step_metrics.h"

#include <cerrno>

namespace zrt::internal {

void StepClock::Begin(Clock::time_point now) {
  start_ = mark_ = now;
  phase_.reset();
  charged_since_mark_ = 0;
  acc_ = StepTimes{};
}

void StepClock::Mark(std::optional<Phase> next) {
  const auto now = Clock::now();
  if (phase_) {
    const double span = std::chrono::duration<double>(now - mark_).count() - charged_since_mark_;
    (*phase_ == Phase::kForward ? acc_.forward : acc_.backward) += std::max(0.0, span);
  }
  phase_ = next;
  mark_ = now;
  charged_since_mark_ = 0;
}

void StepClock::Charge(double StepTimes::*field, double seconds) {
  acc_.*field += seconds;
  charged_since_mark_ += seconds;
}

StepTimes StepClock::Finish() {
  Mark(std::nullopt);
  const auto now = Clock::now();
  StepTimes t = acc_;
  t.total = std::chrono::duration<double>(now - start_).count();
  t.other = std::max(0.0, t.total - (t.forward + t.backward + t.comm_wait + t.optimizer + t.offload_io + t.checkpoint_stall));
  Begin(now);
  return t;
}

Result<std::unique_ptr<JsonlSink>> JsonlSink::Open(const std::string& path, int rank) {
  std::string p = path;
  const auto at = p.find("{rank}");
  if (at == std::string::npos && rank != 0) return std::unique_ptr<JsonlSink>();
  if (at != std::string::npos) p.replace(at, 6, std::to_string(rank));
  std::FILE* f = std::fopen(p.c_str(), "a");
  if (f == nullptr) return ErrnoStatus(errno, "metrics.jsonl_path: opening " + p);
  return std::unique_ptr<JsonlSink>(new JsonlSink(f, p));
}

JsonlSink::~JsonlSink() { std::fclose(f_); }

Status JsonlSink::Write(const nlohmann::json& line) {
  const std::string s = line.dump() + "\n";
  if (std::fwrite(s.data(), 1, s.size(), f_) != s.size() || std::fflush(f_) != 0) {
    return ErrnoStatus(errno, "metrics: writing " + path_);
  }
  return Status();
}

}  // namespace zrt::internal
