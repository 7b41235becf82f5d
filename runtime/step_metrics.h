// Internal: the engine's step clock (StepTimes) and JSON-lines sink. Not installed.
//
// The clock keeps one interval per step: it opens when the previous Step returns (or at Finalize),
// phases are closed by the next Mark or by Step, and every span of engine time (and checkpoint stall)
// is charged to its category and subtracted from the phase it fell in.
#pragma once

#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "zrt/core/status.h"
#include "zrt/runtime/stats.h"

namespace zrt::internal {

class StepClock {
 public:
  using Clock = std::chrono::steady_clock;
  void Begin() { Begin(Clock::now()); }
  // Closes the open phase (if any) and opens `next` (nullopt: none).
  void Mark(std::optional<Phase> next);
  // Charges `seconds` of engine (or checkpoint) time to a category.
  void Charge(double StepTimes::*field, double seconds);
  // Ends the step: total and other filled in; the next interval opens now.
  StepTimes Finish();

  // Charges the scope's duration to `field`.
  class Scope {
   public:
    Scope(StepClock* c, double StepTimes::*field) : c_(c), field_(field), t0_(Clock::now()) {}
    ~Scope() { c_->Charge(field_, std::chrono::duration<double>(Clock::now() - t0_).count()); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    StepClock* c_;
    double StepTimes::*field_;
    Clock::time_point t0_;
  };

 private:
  void Begin(Clock::time_point now);
  Clock::time_point start_{}, mark_{};
  std::optional<Phase> phase_;
  double charged_since_mark_ = 0;
  StepTimes acc_;
};

// Appends one JSON object per line to a file, flushed per line.
class JsonlSink {
 public:
  // "{rank}" in the path is replaced by the rank; without it only rank 0 writes (others: null sink).
  static Result<std::unique_ptr<JsonlSink>> Open(const std::string& path, int rank);
  ~JsonlSink();
  Status Write(const nlohmann::json& line);

 private:
  JsonlSink(std::FILE* f, std::string path) : f_(f), path_(std::move(path)) {}
  std::FILE* f_;
  std::string path_;
};

}  // namespace zrt::internal
