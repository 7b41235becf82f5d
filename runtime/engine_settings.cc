// The engine's optimizer settings: per-tensor lr scales and decays grouped into runs of each
// group's shard, the peak lr and its schedule, and the part of a checkpoint that carries them
// (StateCounters::engine_state). The step itself is engine.cc.
#include <cmath>
#include <iomanip>
#include <sstream>

#include <nlohmann/json.hpp>

#include "zrt/core/json_reader.h"
#include "zrt/core/logging.h"
#include "zrt/runtime/engine_core.h"
#include "zrt/runtime/engine_internal.h"

namespace zrt {

using internal::CheckRate;

void EngineCore::BuildSettingRuns() {
  for (auto& gp : groups_) {
    Group& g = *gp;
    const int rank = LayoutRank(g);
    g.runs.clear();
    g.classes.clear();
    if (g.frozen) continue;
    auto class_of = [&](const Settings& st) {
      for (size_t c = 0; c < g.classes.size(); ++c) {
        if (g.classes[c] == st) return static_cast<int>(c);
      }
      g.classes.push_back(st);
      return static_cast<int>(g.classes.size() - 1);
    };
    for (const ShardPiece& p : g.layout.RankPieces(rank)) {
      const int c = class_of(settings_[static_cast<size_t>(g.params[static_cast<size_t>(p.tensor)])]);
      if (!g.runs.empty() && g.runs.back().cls == c) {
        g.runs.back().end = p.shard_offset + p.count;
      } else {
        if (!g.runs.empty()) g.runs.back().end = p.shard_offset;
        g.runs.push_back({g.runs.empty() ? 0 : p.shard_offset, p.shard_offset + p.count, c});
      }
    }
    if (g.runs.empty()) g.runs.push_back({0, 0, class_of(settings_[static_cast<size_t>(g.params[0])])});  // padding only
    g.runs.back().end = g.layout.shard_size();
  }
}

Status EngineCore::SetLr(double lr) {
  if (!(lr >= 0) || !std::isfinite(lr)) return InvalidArgumentError("set_lr: lr must be finite and >= 0, got ", lr);
  lr_ = lr;
  if (trainer_settings_) trainer_settings_->lr = lr;  // the trainer's choice, from now on
  return Status();
}

Status EngineCore::SetLrSchedule(const LrSchedule& schedule) {
  RETURN_IF_ERROR(schedule.Validate(), "set_lr_schedule");
  schedule_ = schedule;
  if (trainer_settings_) trainer_settings_->schedule = schedule;
  return Status();
}

double EngineCore::lr() const { return lr_ * schedule_.Factor(steps_); }

// The engine's part of a checkpoint (StateCounters::engine_state):
//   {"lr": peak, "lr_schedule": {"kind", "warmup_steps", "total_steps", "min_lr_ratio"},
//    "weight_decay": the default, "tensors": {name: {"lr_scale", "weight_decay"}} for those that differ}
std::string EngineCore::EngineState() const {
  nlohmann::json j;
  j["lr"] = lr_;
  j["lr_schedule"] = {{"kind", LrScheduleKindName(schedule_.kind)}, {"warmup_steps", schedule_.warmup_steps},
                      {"total_steps", schedule_.total_steps}, {"min_lr_ratio", schedule_.min_lr_ratio}};
  j["weight_decay"] = config_.adam.weight_decay;
  nlohmann::json tensors = nlohmann::json::object();
  const Settings fallback{1, config_.adam.weight_decay};
  for (size_t i = 0; i < params_.size(); ++i) {
    if (settings_[i] != fallback) tensors[params_[i].name] = {{"lr_scale", settings_[i].lr_scale}, {"weight_decay", settings_[i].weight_decay}};
  }
  j["tensors"] = std::move(tensors);
  return j.dump();  // the state's precision is the manifest's, per kind (its groups' "stored")
}

Status EngineCore::ApplyEngineState(const std::string& text) {
  ASSIGN_OR_RETURN(nlohmann::json j, ParseJson(text, "engine state"));
  if (j.is_object() && j.empty()) return Status();  // saved by an engine that kept none
  // Everything is read and checked before anything changes.
  ASSIGN_OR_RETURN(JsonReader r, JsonReader::Object(j, "engine.state"));
  double lr = lr_, wd = config_.adam.weight_decay;
  LrSchedule sched;
  RETURN_IF_ERROR(r.Read("lr", &lr));
  RETURN_IF_ERROR(CheckRate("saved", "lr", lr));
  RETURN_IF_ERROR(r.Read("weight_decay", &wd));
  RETURN_IF_ERROR(CheckRate("saved", "weight_decay", wd));
  {
    ASSIGN_OR_RETURN(JsonReader sr, r.Child("lr_schedule"));
    RETURN_IF_ERROR(sr.Read<LrSchedule::Kind>("kind", &sched.kind, ParseLrScheduleKind));
    RETURN_IF_ERROR(sr.Read("warmup_steps", &sched.warmup_steps));
    RETURN_IF_ERROR(sr.Read("total_steps", &sched.total_steps));
    RETURN_IF_ERROR(sr.Read("min_lr_ratio", &sched.min_lr_ratio));
    RETURN_IF_ERROR(sr.Finish());
    RETURN_IF_ERROR(sched.Validate(), "engine.state.lr_schedule");
  }
  std::vector<Settings> settings(params_.size(), Settings{1, wd});
  const nlohmann::json& tensors = r.Raw("tensors");
  if (!tensors.is_null()) {
    ASSIGN_OR_RETURN(JsonReader tr, JsonReader::Object(tensors, "engine.state.tensors"));
    for (size_t i = 0; i < params_.size(); ++i) {
      if (!tr.has(params_[i].name)) continue;
      ASSIGN_OR_RETURN(JsonReader one, tr.Child(params_[i].name));
      RETURN_IF_ERROR(one.Read("lr_scale", &settings[i].lr_scale));
      RETURN_IF_ERROR(one.Read("weight_decay", &settings[i].weight_decay));
      RETURN_IF_ERROR(one.Finish());
      RETURN_IF_ERROR(CheckRate("saved lr_scale", params_[i].name, settings[i].lr_scale));
      RETURN_IF_ERROR(CheckRate("saved weight_decay", params_[i].name, settings[i].weight_decay));
    }
    // Tensors the engine does not have are the load's business (strict loads refuse them).
  }
  // Written by 0.2 before the manifest's "stored" became the one record of the state's precision
  // (the load reports a conversion): accepted, not used.
  const nlohmann::json& state = r.Raw("state");
  if (!state.is_null() && !state.is_object()) return InvalidArgumentError("engine.state.state: must be an object of group names");
  RETURN_IF_ERROR(r.Finish());
  ReportRestoredSettings(lr, sched, wd, settings);
  lr_ = lr;
  schedule_ = sched;
  config_.adam.weight_decay = wd;
  settings_ = std::move(settings);
  BuildSettingRuns();
  return Status();
}

namespace {
std::string Text(double v, int digits = 6) {
  std::ostringstream os;
  os << std::setprecision(digits) << v;
  return std::move(os).str();
}
}  // namespace

// Every setting the checkpoint brings that differs from the trainer's, kept (restored_settings) and
// logged once on rank 0; the trainer's are kept for UseTrainerSettings.
void EngineCore::ReportRestoredSettings(double lr, const LrSchedule& sched, double wd, const std::vector<Settings>& settings) {
  // The trainer's: what it set before its first resume (and SetLr/SetLrSchedule since).
  if (!trainer_settings_) trainer_settings_ = TrainerSettings{lr_, config_.adam.weight_decay, schedule_, settings_};
  const TrainerSettings& mine = *trainer_settings_;
  std::vector<SettingChange> changes;
  auto differs = [&](std::string name, double a, double b) {
    if (a == b) return;
    const bool close = Text(a) == Text(b);  // shown with every digit where 6 do not tell them apart
    changes.push_back({std::move(name), Text(a, close ? 17 : 6), Text(b, close ? 17 : 6)});
  };
  differs("lr", mine.lr, lr);
  if (mine.schedule.kind != sched.kind) {
    changes.push_back({"lr_schedule.kind", std::string(LrScheduleKindName(mine.schedule.kind)), std::string(LrScheduleKindName(sched.kind))});
  }
  differs("lr_schedule.warmup_steps", static_cast<double>(mine.schedule.warmup_steps), static_cast<double>(sched.warmup_steps));
  differs("lr_schedule.total_steps", static_cast<double>(mine.schedule.total_steps), static_cast<double>(sched.total_steps));
  differs("lr_schedule.min_lr_ratio", mine.schedule.min_lr_ratio, sched.min_lr_ratio);
  differs("weight_decay", mine.weight_decay, wd);
  for (size_t i = 0; i < params_.size(); ++i) {
    differs("tensor '" + params_[i].name + "' lr_scale", mine.settings[i].lr_scale, settings[i].lr_scale);
    differs("tensor '" + params_[i].name + "' weight_decay", mine.settings[i].weight_decay, settings[i].weight_decay);
  }
  restored_settings_ = std::move(changes);
  if (restored_settings_.empty() || comm_->rank() != 0) return;
  std::ostringstream os;
  os << "resume: the checkpoint's settings replace the trainer's (engine->UseTrainerSettings() puts the trainer's back):";
  for (const SettingChange& c : restored_settings_) os << "\n  " << c.name << ": " << c.trainer << " -> " << c.checkpoint;
  ZRT_LOG(kWarn) << std::move(os).str();
}

Status EngineCore::UseTrainerSettings() {
  if (!trainer_settings_) return Status();  // nothing was restored: the trainer's are in force
  lr_ = trainer_settings_->lr;
  schedule_ = trainer_settings_->schedule;
  config_.adam.weight_decay = trainer_settings_->weight_decay;
  settings_ = trainer_settings_->settings;
  BuildSettingRuns();
  if (comm_->rank() == 0 && !restored_settings_.empty()) ZRT_LOG(kInfo) << "resume: the trainer's settings are in force again";
  restored_settings_.clear();
  return Status();
}

}  // namespace zrt
