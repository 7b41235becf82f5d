// safetensors export, import and in-place loading (the format: safetensors.h; reading: safetensors_reader.cc).
#include "zrt/checkpoint/interchange/safetensors.h"
#include "zrt/core/base.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "zrt/checkpoint/files.h"
#include "zrt/checkpoint/fs_util.h"
#include "zrt/checkpoint/interchange/import_full.h"
#include "zrt/checkpoint/load_plan.h"
#include "zrt/checkpoint/state_fill.h"
#include "zrt/checkpoint/tensor_reader.h"
#include "zrt/checkpoint/catalog.h"
#include "zrt/core/logging.h"

namespace zrt::ckpt {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kZrtKey = "zrt";
constexpr const char* kOptimizerPrefix = "optimizer/";

Result<const char*> SafetensorsName(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kBF16: return "BF16";
    case DType::kF16: return "F16";
    default: return InvalidArgumentError("safetensors: no dtype for ", DTypeName(t));
  }
}

// Streams bytes to a file through aligned buffers, durably at Finish: each full buffer is written
// asynchronously through the IoEngine (O_DIRECT where the filesystem takes it: no copy into the page
// cache) while the next one fills, kBuffers - 1 writes in flight at most; the tail is padded to the
// block and the file truncated to its length.
class FileWriter {
 public:
  static Result<FileWriter> Create(IoEngine& io, const std::string& path) {
    FileWriter w;
    w.io_ = &io;
    ASSIGN_OR_RETURN(w.file_, IoFile::Open(path, IoFile::Mode::kCreate));
    for (Slot& b : w.slots_) {
      b.data.reset(static_cast<char*>(std::aligned_alloc(kAlign, kBuffer)));
      if (!b.data) return OutOfMemoryError("export: no memory for a write buffer");
    }
    return w;
  }
  FileWriter(FileWriter&&) = default;
  FileWriter& operator=(FileWriter&&) = default;
  ~FileWriter() {
    for (Slot& b : slots_) (void)b.write.Wait();  // nothing is freed while the engine still reads it
  }
  Status Write(const void* p, size_t n) {
    const char* c = static_cast<const char*>(p);
    while (n > 0) {
      const size_t k = std::min(n, kBuffer - used_);
      std::memcpy(slots_[cur_].data.get() + used_, c, k);
      used_ += k, c += k, n -= k;
      if (used_ == kBuffer) RETURN_IF_ERROR(Flush());
    }
    return Status();
  }
  Status Finish() {
    const int64_t length = offset_ + static_cast<int64_t>(used_);
    if (used_ > 0) {
      const size_t padded = static_cast<size_t>(AlignUp(static_cast<int64_t>(used_), static_cast<int64_t>(kAlign)));
      std::memset(slots_[cur_].data.get() + used_, 0, padded - used_);
      used_ = padded;
      RETURN_IF_ERROR(Flush());
    }
    for (Slot& b : slots_) RETURN_IF_ERROR(b.write.Wait(), "writing ", file_.path());
    RETURN_IF_ERROR(file_.Truncate(length));
    RETURN_IF_ERROR(io_->Sync(file_));
    return std::move(file_).Close();
  }

 private:
  FileWriter() = default;
  static constexpr size_t kBuffer = size_t{8} << 20, kAlign = 4096, kBuffers = 5;
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  struct Slot {
    std::unique_ptr<char, Free> data;
    IoHandle write;  // the write of its last contents
  };
  // The current buffer goes out; the next one is reused once its previous write finished.
  Status Flush() {
    ASSIGN_OR_RETURN(slots_[cur_].write, io_->Write(file_, slots_[cur_].data.get(), used_, offset_), "writing ", file_.path());
    offset_ += static_cast<int64_t>(used_);
    used_ = 0;
    cur_ = (cur_ + 1) % kBuffers;
    return slots_[cur_].write.Wait().WithContext("writing " + file_.path());
  }
  IoEngine* io_ = nullptr;
  IoFile file_;
  std::array<Slot, kBuffers> slots_;
  size_t cur_ = 0, used_ = 0;
  int64_t offset_ = 0;
};

// ---- export -------------------------------------------------------------------------------------

// What an export writes, in write order: group by group, each kind's tensors together (one group in memory).
struct ExportEntry {
  std::string key;
  const TensorEntry* tensor;
  const std::string* kind;
  DType dtype;
  int64_t bytes;
};

struct ExportPlan {
  std::vector<ExportEntry> entries;
  std::vector<std::vector<std::string>> kinds;  // per group: the exported kinds, master first
  nlohmann::json zrt;                           // what import needs to restore groups, settings and counters
  std::vector<std::pair<size_t, size_t>> files;  // per file: [first, last) entries
  int64_t total = 0;                            // bytes of tensor data
};

// One group's entries and its part of the metadata. `forced` is the parameters' dtype (kBytes: the model's).
Status PlanGroup(const GroupEntry& ge, const SafetensorsExportOptions& o, DType forced, std::set<std::string>& keys, ExportPlan& p) {
  std::vector<std::string>& kinds = p.kinds.emplace_back(1, "master");
  if (o.all_states) {
    for (const std::string& k : ge.kinds) {
      if (k != "master") kinds.push_back(k);
    }
  }
  json zt = json::array();
  std::vector<std::optional<std::string>> mapped;
  for (const TensorEntry& te : ge.tensors) {
    mapped.push_back(o.names.Apply(te.name));
    if (mapped.back()) zt.push_back({{"name", *mapped.back()}, {"model_dtype", DTypeName(te.dtype)}});
  }
  for (size_t k = 0; k < kinds.size(); ++k) {
    for (size_t t = 0; t < ge.tensors.size(); ++t) {
      if (!mapped[t]) continue;
      const TensorEntry& te = ge.tensors[t];
      const DType dt = k > 0 ? DType::kF32 : forced == DType::kBytes ? te.dtype : forced;
      if (k == 0 && dt != DType::kF32 && dt != DType::kBF16 && dt != DType::kF16) {
        return InvalidArgumentError("export: tensor '", te.name, "' is ", DTypeName(dt), " (safetensors export writes f32, bf16 or f16)");
      }
      std::string key = k == 0 ? *mapped[t] : kOptimizerPrefix + kinds[k] + "/" + *mapped[t];
      if (key == "__metadata__" || key.empty()) return InvalidArgumentError("export: a tensor cannot be named '", key, "' in safetensors (rename it)");
      if (!keys.insert(key).second) return InvalidArgumentError("export: two tensors would be named '", key, "' (check the name map)");
      p.entries.push_back({std::move(key), &te, &kinds[k], dt, te.numel * static_cast<int64_t>(DTypeSize(dt))});
    }
  }
  p.zrt["groups"].push_back({{"name", ge.name}, {"lr", ge.lr}, {"weight_decay", ge.weight_decay}, {"alignment", ge.alignment},
                             {"kinds", kinds}, {"tensors", zt}});
  return Status();
}

Result<ExportPlan> PlanExport(const Manifest& m, const SafetensorsExportOptions& o) {
  const DType forced = o.dtype.value_or(o.all_states ? DType::kF32 : DType::kBytes);
  if (forced != DType::kBytes) RETURN_IF_ERROR(SafetensorsName(forced).status(), "export");
  if (o.max_shard_bytes < 1) return InvalidArgumentError("export: the shard size limit must be positive");
  ExportPlan p;
  p.kinds.reserve(m.groups.size());  // entries point into it
  p.zrt = {{"version", 1}, {"step", m.step}, {"world_size", m.world_size}, {"stage", m.stage}, {"loss_scale", m.loss_scale},
           {"scaler_good_steps", m.scaler_good_steps}, {"scaler_hysteresis_left", m.scaler_hysteresis_left},
           {"trainer_state", m.trainer_state}, {"engine_state", m.engine_state}, {"groups", json::array()}};
  std::set<std::string> keys;
  for (const GroupEntry& ge : m.groups) RETURN_IF_ERROR(PlanGroup(ge, o, forced, keys, p));
  if (p.entries.empty()) return InvalidArgumentError("export: the name map drops every tensor");
  // Files: greedy by write order under the limit (a tensor larger than the limit gets a file of its own).
  int64_t bytes = 0;
  for (size_t i = 0; i < p.entries.size(); ++i) {
    if (p.files.empty() || (bytes > 0 && bytes + p.entries[i].bytes > o.max_shard_bytes)) {
      p.files.push_back({i, i});
      bytes = 0;
    }
    p.files.back().second = i + 1;
    bytes += p.entries[i].bytes;
    p.total += p.entries[i].bytes;
  }
  return p;
}

// The export's files: each written under a temporary name, its header first (offsets known from the
// sizes), and renamed into place with the index of a sharded export once all are written; removed if
// the export fails.
class ExportFiles {
 public:
  ExportFiles(IoEngine& io, const std::string& out_path, const ExportPlan& p)
      : io_(io), out_path_(out_path), stem_(SafetensorsStem(out_path)), plan_(p), sharded_(p.files.size() > 1),
        parent_(fs::path(out_path).has_parent_path() ? fs::path(out_path).parent_path().string() : ".") {}
  ExportFiles(const ExportFiles&) = delete;
  ExportFiles& operator=(const ExportFiles&) = delete;
  ~ExportFiles() {
    writer_.reset();
    for (const std::string& t : tmps_) ::unlink(t.c_str());
  }

  // Appends to the file that holds entry `entry`, starting that file when the entry is its first.
  Status Write(size_t entry, const void* data, size_t n) {
    if (current_ == SIZE_MAX || entry >= plan_.files[current_].second) {
      if (writer_) RETURN_IF_ERROR(writer_->Finish());
      RETURN_IF_ERROR(Begin(current_ == SIZE_MAX ? 0 : current_ + 1));
    }
    return writer_->Write(data, n);
  }

  Status Commit() {
    if (writer_) RETURN_IF_ERROR(writer_->Finish());
    writer_.reset();
    RETURN_IF_ERROR(FsyncDir(parent_));
    for (size_t f = 0; f < plan_.files.size(); ++f) RETURN_IF_ERROR(RenamePath(tmps_[f], Name(f)));
    tmps_.clear();
    if (sharded_) {
      json index = {{"metadata", {{"total_size", plan_.total}, {kZrtKey, plan_.zrt.dump()}}}, {"weight_map", json::object()}};
      for (size_t f = 0; f < plan_.files.size(); ++f) {
        for (size_t i = plan_.files[f].first; i < plan_.files[f].second; ++i) {
          index["weight_map"][plan_.entries[i].key] = fs::path(Name(f)).filename().string();
        }
      }
      const std::string index_path = stem_ + ".safetensors.index.json";
      tmps_.push_back(index_path + ".tmp");
      ASSIGN_OR_RETURN(FileWriter iw, FileWriter::Create(io_, tmps_.back()), "export");
      const std::string text = index.dump(2) + "\n";
      RETURN_IF_ERROR(iw.Write(text.data(), text.size()));
      RETURN_IF_ERROR(iw.Finish());
      RETURN_IF_ERROR(RenamePath(tmps_.back(), index_path));
      tmps_.clear();
    }
    return FsyncDir(parent_);
  }

 private:
  std::string Name(size_t f) const {
    if (!sharded_) return out_path_;
    char suffix[64];
    std::snprintf(suffix, sizeof(suffix), "-%05zu-of-%05zu.safetensors", f + 1, plan_.files.size());
    return stem_ + suffix;
  }

  Status Begin(size_t f) {
    json h = json::object();
    int64_t at = 0;
    for (size_t i = plan_.files[f].first; i < plan_.files[f].second; ++i) {
      const ExportEntry& e = plan_.entries[i];
      ASSIGN_OR_RETURN(const char* dn, SafetensorsName(e.dtype));
      h[e.key] = {{"dtype", dn}, {"shape", e.tensor->shape}, {"data_offsets", {at, at + e.bytes}}};
      at += e.bytes;
    }
    h["__metadata__"] = {{"format", "pt"}};
    if (!sharded_) h["__metadata__"][kZrtKey] = plan_.zrt.dump();
    std::string text = h.dump();
    text.append((8 - (8 + text.size()) % 8) % 8, ' ');  // the buffer starts 8-byte aligned
    tmps_.push_back(Name(f) + ".tmp");
    ASSIGN_OR_RETURN(FileWriter fw, FileWriter::Create(io_, tmps_.back()), "export");
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
    RETURN_IF_ERROR(fw.Write(len, 8));
    RETURN_IF_ERROR(fw.Write(text.data(), text.size()));
    writer_.emplace(std::move(fw));
    current_ = f;
    return Status();
  }

  IoEngine& io_;
  const std::string out_path_, stem_;
  const ExportPlan& plan_;
  const bool sharded_;
  const std::string parent_;
  std::vector<std::string> tmps_;  // written, not yet renamed
  std::optional<FileWriter> writer_;
  size_t current_ = SIZE_MAX;
};

// Reading (chunks checked and decoded) runs on one thread ahead of the writer, in the writer's order,
// into kSlots window buffers; the reader's chunks are read asynchronously ahead of it (every read is
// planned). One reader: readers taking alternate windows each read the chunks their windows share.
// Memory is the windows, the read-ahead and the reader's chunk cache, whatever the checkpoint's size.
class WindowsAhead {
 public:
  struct Window {
    size_t entry;
    int64_t offset, count;
    int slot = -1;  // set when read
  };

  WindowsAhead(TensorReader& reader, const ExportPlan& p) : reader_(reader), plan_(p) {
    for (size_t i = 0; i < p.entries.size(); ++i) {
      const int64_t numel = p.entries[i].tensor->numel;
      int64_t off = 0;
      do {
        windows_.push_back({i, off, std::min(kWindow, numel - off)});
        off += kWindow;
      } while (off < numel);
    }
  }
  WindowsAhead(const WindowsAhead&) = delete;
  WindowsAhead& operator=(const WindowsAhead&) = delete;
  ~WindowsAhead() { Stop(); }

  Status Start() {
    for (const Window& win : windows_) {
      const ExportEntry& e = plan_.entries[win.entry];
      if (win.count > 0) RETURN_IF_ERROR(reader_.Plan(e.tensor->name, *e.kind, win.offset, win.count), "export");
    }
    reader_.StartReadAhead(kReadAheadBytes);
    thread_ = std::thread([this] { Run(); });
    return Status();
  }
  const std::vector<Window>& windows() const { return windows_; }

  // Window i's values, once read.
  Result<const float*> Wait(size_t i) {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return windows_[i].slot >= 0 || !status_.ok(); });
    RETURN_IF_ERROR(status_);
    return slots_[static_cast<size_t>(windows_[i].slot)].data();
  }
  void Release(size_t i) {
    std::lock_guard lock(mu_);
    free_[static_cast<size_t>(windows_[i].slot)] = true;
    cv_.notify_all();
  }
  void Stop() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
      cv_.notify_all();
    }
    if (thread_.joinable()) thread_.join();
  }

 private:
  static constexpr int64_t kWindow = int64_t{1} << 20;  // elements (one chunk of a default checkpoint)
  static constexpr size_t kSlots = 2;
  static constexpr int64_t kReadAheadBytes = int64_t{16} << 20;

  void Run() {
    for (Window& win : windows_) {
      size_t slot = 0;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return stop_ || std::find(free_.begin(), free_.end(), true) != free_.end(); });
        if (stop_) return;
        slot = static_cast<size_t>(std::find(free_.begin(), free_.end(), true) - free_.begin());
        free_[slot] = false;
      }
      std::vector<float>& buf = slots_[slot];
      buf.resize(static_cast<size_t>(win.count));
      const ExportEntry& e = plan_.entries[win.entry];
      Status st = win.count > 0 ? reader_.Read(e.tensor->name, *e.kind, win.offset, win.count, buf.data()) : Status();
      std::lock_guard lock(mu_);
      if (!st.ok()) {
        status_ = std::move(st);
        cv_.notify_all();
        return;
      }
      win.slot = static_cast<int>(slot);
      cv_.notify_all();
    }
  }

  TensorReader& reader_;
  const ExportPlan& plan_;
  std::vector<Window> windows_;
  std::array<std::vector<float>, kSlots> slots_;
  std::array<bool, kSlots> free_{true, true};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  Status status_;  // the first read that failed
  std::thread thread_;
};

}  // namespace

Status ExportSafetensors(const std::string& dir, const std::string& out_path, const SafetensorsExportOptions& o,
                         const ProgressFn& progress) {
  ASSIGN_OR_RETURN(Manifest m, ReadManifest(dir), "export");
  ASSIGN_OR_RETURN(ExportPlan plan, PlanExport(m, o));
  std::vector<std::string> problems;
  RETURN_IF_ERROR(CheckComplete(dir, VerifyLevel::kMetadata, &problems));
  if (!problems.empty()) return DataLossError("export: ", dir, " is not complete: ", problems.front());
  ASSIGN_OR_RETURN(std::unique_ptr<IoEngine> io, IoEngine::Create(IoOptions{}), "export");  // outlives the files that use it
  ASSIGN_OR_RETURN(std::unique_ptr<TensorReader> reader, TensorReader::Open(dir), "export");
  ExportFiles files(*io, out_path, plan);
  WindowsAhead ahead(*reader, plan);
  RETURN_IF_ERROR(ahead.Start());
  std::vector<uint16_t> half;
  int64_t done = 0;
  for (size_t i = 0; i < ahead.windows().size(); ++i) {
    const WindowsAhead::Window& win = ahead.windows()[i];
    const ExportEntry& e = plan.entries[win.entry];
    ASSIGN_OR_RETURN(const float* src, ahead.Wait(i));
    if (e.dtype == DType::kF32) {
      RETURN_IF_ERROR(files.Write(win.entry, src, static_cast<size_t>(win.count) * 4));
    } else {
      half.resize(static_cast<size_t>(win.count));
      if (e.dtype == DType::kBF16) {
        for (size_t k = 0; k < half.size(); ++k) half[k] = FloatToBf16(src[k]);
      } else {
        for (size_t k = 0; k < half.size(); ++k) half[k] = FloatToF16(src[k]);
      }
      RETURN_IF_ERROR(files.Write(win.entry, half.data(), half.size() * 2));
    }
    ahead.Release(i);
    if (progress) progress(done += win.count * static_cast<int64_t>(DTypeSize(e.dtype)), plan.total);
  }
  ahead.Stop();
  return files.Commit();
}

// ---- import -------------------------------------------------------------------------------------

namespace {

// What a file says about the state it holds: zrt's metadata, or inferred (every float tensor a
// parameter of group "default" in file order).
struct FileState {
  std::vector<FullTensor> tensors;            // checkpoint names
  std::vector<const SafetensorsReader::Tensor*> params;   // per tensor: its parameter in the file
  std::map<std::string, std::vector<std::string>> kinds;  // group -> state kinds (master first)
  std::vector<std::map<std::string, const SafetensorsReader::Tensor*>> state;  // per tensor: kind -> tensor
  Manifest counters;  // step, loss scale, scaler, trainer/engine state
  bool from_zrt = false;
  std::vector<std::string> dropped;  // by the name map
};

// Reads a file's description once; the metadata is untrusted, so every field is checked.
class Describer {
 public:
  Describer(const SafetensorsReader& r, const NameMap& names) : r_(r), names_(names) {}

  Result<FileState> Run() && {
    auto meta = r_.metadata().find(kZrtKey);
    if (meta == r_.metadata().end()) {
      for (const SafetensorsReader::Tensor& t : r_.tensors()) {
        FullTensor ft;
        ft.model_dtype = t.dtype == "BF16" ? DType::kBF16 : t.dtype == "F16" ? DType::kF16 : DType::kF32;
        RETURN_IF_ERROR(Add(t, t.name, std::move(ft)));
      }
    } else {  // zrt's own export: groups, settings, kinds and counters
      s_.from_zrt = true;
      json z = json::parse(meta->second, nullptr, false);
      if (!z.is_object() || !z.contains("groups") || !z["groups"].is_array()) return Bad("not an object with \"groups\"");
      RETURN_IF_ERROR(Counters(z));
      for (const json& g : z["groups"]) RETURN_IF_ERROR(Group(g));
    }
    if (s_.tensors.empty()) return InvalidArgumentError(r_.path(), ": no tensors to import");
    return std::move(s_);
  }

 private:
  Status Bad(const std::string& what) const { return DataLossError(r_.path(), ": metadata \"zrt\": ", what); }

  // A parameter under its mapped name (nothing if the map drops it).
  Status Add(const SafetensorsReader::Tensor& t, const std::string& file_name, FullTensor ft) {
    std::optional<std::string> to = names_.Apply(file_name);
    if (!to) {
      s_.dropped.push_back(file_name);
      return Status();
    }
    if (!t.floating()) {
      return InvalidArgumentError(r_.path(), ": tensor '", t.name, "' is ", t.dtype, ", not floating point (a name map entry to null drops it)");
    }
    if (!seen_.insert(*to).second) return InvalidArgumentError(r_.path(), ": two tensors map to '", *to, "' (check the name map)");
    ft.name = *to;
    ft.shape = t.shape;
    s_.tensors.push_back(std::move(ft));
    s_.params.push_back(&t);
    s_.state.emplace_back();
    return Status();
  }

  Status Counters(const json& z) {
    auto num = [&](const char* key, double lo) -> Result<double> {
      if (!z.contains(key)) return lo;
      if (!z[key].is_number() || !std::isfinite(z[key].get<double>()) || z[key].get<double>() < lo) {
        return Bad(std::string(key) + " is not a number >= " + std::to_string(lo));
      }
      return z[key].get<double>();
    };
    ASSIGN_OR_RETURN(double step, num("step", 0));
    ASSIGN_OR_RETURN(double scale, num("loss_scale", 0));
    ASSIGN_OR_RETURN(double good, num("scaler_good_steps", 0));
    ASSIGN_OR_RETURN(double hyst, num("scaler_hysteresis_left", 0));
    if (step > 9e15 || good > 9e15 || hyst > 1e9) return Bad("a counter out of range");
    s_.counters.step = static_cast<int64_t>(step);
    s_.counters.loss_scale = scale > 0 ? scale : 1;
    s_.counters.scaler_good_steps = static_cast<int64_t>(good);
    s_.counters.scaler_hysteresis_left = static_cast<int>(hyst);
    if (z.contains("trainer_state")) s_.counters.trainer_state = z["trainer_state"];
    if (z.contains("engine_state")) {
      if (!z["engine_state"].is_object()) return Bad("engine_state is not an object");
      s_.counters.engine_state = z["engine_state"];
    }
    return Status();
  }

  // A group's kinds: master, then the optimizer's kinds, each once.
  Result<std::vector<std::string>> Kinds(const json& g) const {
    std::vector<std::string> gk;
    for (const json& k : g["kinds"]) {
      if (!k.is_string()) return Bad("a kind that is not a string");
      gk.push_back(k.get<std::string>());
    }
    const std::string& name = g["name"].get_ref<const std::string&>();
    if (gk.empty() || gk[0] != "master") return Bad("group '" + name + "': kinds must start with master");
    for (size_t k = 1; k < gk.size(); ++k) {
      if ((gk[k] != "exp_avg" && gk[k] != "exp_avg_sq" && gk[k] != "max_exp_avg_sq") ||
          std::find(gk.begin(), gk.begin() + static_cast<std::ptrdiff_t>(k), gk[k]) != gk.begin() + static_cast<std::ptrdiff_t>(k)) {
        return Bad("group '" + name + "': state kind '" + gk[k] + "' unknown or repeated");
      }
    }
    return gk;
  }

  Status Group(const json& g) {
    if (!g.is_object() || !g.contains("name") || !g["name"].is_string() || !g.contains("tensors") || !g["tensors"].is_array() ||
        !g.contains("kinds") || !g["kinds"].is_array()) {
      return Bad("a group without name, tensors and kinds");
    }
    ASSIGN_OR_RETURN(std::vector<std::string> gk, Kinds(g));
    const std::string name = g["name"].get<std::string>();
    if (!s_.kinds.emplace(name, gk).second) return Bad("group '" + name + "' listed twice");
    const double lr = g.contains("lr") && g["lr"].is_number() ? g["lr"].get<double>() : 0;
    const double wd = g.contains("weight_decay") && g["weight_decay"].is_number() ? g["weight_decay"].get<double>() : 0;
    for (const json& t : g["tensors"]) {
      if (!t.is_object() || !t.contains("name") || !t["name"].is_string()) return Bad("a tensor without a name");
      const std::string fname = t["name"].get<std::string>();
      const SafetensorsReader::Tensor* ft = r_.Find(fname);
      if (!ft) return Bad("tensor '" + fname + "' is listed but not in the file");
      FullTensor full;
      full.group = name;
      full.lr = lr;
      full.weight_decay = wd;
      if (t.contains("model_dtype")) {
        if (!t["model_dtype"].is_string()) return Bad("tensor '" + fname + "': model_dtype is not a string");
        ASSIGN_OR_RETURN(full.model_dtype, ParseDType(t["model_dtype"].get<std::string>()), r_.path(), ": tensor '", fname, "'");
      }
      const size_t before = s_.tensors.size();
      RETURN_IF_ERROR(Add(*ft, fname, std::move(full)));
      if (s_.tensors.size() == before) continue;  // dropped
      for (size_t k = 1; k < gk.size(); ++k) {
        const SafetensorsReader::Tensor* st = r_.Find(kOptimizerPrefix + gk[k] + "/" + fname);
        if (!st) return Bad("tensor '" + fname + "' has no " + gk[k]);
        if (st->shape != ft->shape || !st->floating()) return Bad("tensor '" + fname + "': its " + gk[k] + " does not match it");
        s_.state.back()[gk[k]] = st;
      }
    }
    return Status();
  }

  const SafetensorsReader& r_;
  const NameMap& names_;
  FileState s_;
  std::set<std::string> seen_;
};

Result<FileState> Describe(const SafetensorsReader& r, const NameMap& names) { return Describer(r, names).Run(); }

}  // namespace

Status ImportSafetensors(const std::string& in_path, const std::string& out_root, const ImportOptions& o, const NameMap& names,
                         const ProgressFn& progress) {
  ASSIGN_OR_RETURN(SafetensorsReader r, SafetensorsReader::Open(in_path), "import");
  ASSIGN_OR_RETURN(FileState s, Describe(r, names), "import");
  auto read = [&](size_t t, const std::string& kind, int64_t offset, int64_t count, float* out) -> Status {
    const SafetensorsReader::Tensor* src = kind == "master" ? s.params[t] : s.state[t].at(kind);
    return r.ReadFloat(*src, offset, count, out);
  };
  s.counters.zrt_version = "import";
  return WriteCheckpointFromFull(out_root, s.tensors, s.kinds, std::move(s.counters), read, o, progress);
}

// ---- in-place load ------------------------------------------------------------------------------

namespace {

// `world`: every rank's tensor names, where a rank's view holds only some (groups over a
// data-parallel group of their own: its experts); the file's other tensors are judged against it.
Result<LoadResult> LoadLocal(const std::string& path, const StateView& target, const SafetensorsLoadOptions& o,
                             const std::set<std::string>* world) {
  RETURN_IF_ERROR(target.Settle(), "initialising from ", path);  // a capture still reading the buffers ends before they change
  ASSIGN_OR_RETURN(SafetensorsReader r, SafetensorsReader::Open(path));
  ASSIGN_OR_RETURN(FileState s, Describe(r, o.names));
  std::map<std::string, size_t> where;
  for (size_t i = 0; i < s.tensors.size(); ++i) where[s.tensors[i].name] = i;
  LoadResult res;
  std::set<std::string> in_target;
  for (const StateGroup& g : target.groups) {
    for (const TensorSpec& spec : g.tensors) {
      in_target.insert(spec.name);
      auto w = where.find(spec.name);
      if (w == where.end()) {
        if (o.strict) return NotFoundError("tensor '", spec.name, "' is not in ", path, " (strict = false starts it at zero; a name map renames)");
        res.missing.push_back("tensor '" + spec.name + "'");
        continue;
      }
      if (s.tensors[w->second].shape != spec.shape) {
        return InvalidArgumentError("tensor '", spec.name, "' has shape ", TensorSpec{spec.name, s.tensors[w->second].shape, DType::kF32}.ToString(),
                                    " in ", path, ", the model has ", spec.ToString());
      }
    }
  }
  for (const auto& [name, i] : where) {
    if (in_target.contains(name) || (world != nullptr && world->contains(name))) continue;
    if (o.strict) return InvalidArgumentError(path, " has tensor '", name, "', which the model does not (strict = false ignores it; a name map drops it)");
    res.unexpected.push_back("tensor '" + name + "'");
  }
  for (const StateGroup& g : target.groups) {
    const int rank = target.ShardOf(g);
    for (const StateBuffer& b : g.buffers) {
      if (b.dtype != DType::kF32) return InvalidArgumentError("state '", b.kind, "' must be f32");
      const bool wanted = b.kind == "master" || (!o.params_only && s.from_zrt);
      if (!wanted) continue;  // the moments stay as the engine has them (zero in a fresh engine)
      auto fill = [&](int64_t w0, int64_t w1, float* base) -> Status {
        for (const ShardPiece& p : g.layout.RankPieces(rank)) {
          const int64_t lo = std::max(w0, p.shard_offset), hi = std::min(w1, p.shard_offset + p.count);
          if (lo >= hi) continue;
          const TensorSpec& spec = g.tensors[static_cast<size_t>(p.tensor)];
          auto w = where.find(spec.name);
          if (w == where.end()) continue;
          const SafetensorsReader::Tensor* src = nullptr;
          if (b.kind == "master") {
            src = s.params[w->second];
          } else if (auto k = s.state[w->second].find(b.kind); k != s.state[w->second].end()) {
            src = k->second;
          } else if (o.strict) {
            return NotFoundError(path, " has no ", b.kind, " for tensor '", spec.name, "'");
          }
          if (src) {
            RETURN_IF_ERROR(r.ReadFloat(*src, p.tensor_offset + (lo - p.shard_offset), hi - lo, base + (lo - w0)), "loading tensor '",
                            spec.name, "'");
          }
        }
        return Status();
      };
      RETURN_IF_ERROR(FillStateBuffer(target, static_cast<int>(&g - target.groups.data()), static_cast<int>(&b - g.buffers.data()), fill));
      res.bytes_read += b.count * 4;
    }
  }
  res.counters = target.counters;
  if (s.from_zrt && !o.params_only) {
    res.counters = {s.counters.step, s.counters.loss_scale, s.counters.scaler_good_steps, s.counters.scaler_hysteresis_left,
                    s.counters.engine_state.dump()};
    res.trainer_state = s.counters.trainer_state;
  }
  for (const std::string& d : s.dropped) res.unexpected.push_back("tensor '" + d + "' (dropped by the name map)");
  return res;
}

}  // namespace

Result<LoadResult> LoadSafetensors(Communicator* comm, const std::string& path, const StateView& target, const SafetensorsLoadOptions& o) {
  std::optional<std::set<std::string>> world;
  if (target.has_own_groups()) {  // the same on every rank: a collective to know what the world's model has
    ASSIGN_OR_RETURN(world, internal::WorldTensorNames(comm, target), "initialising from ", path);
  }
  Result<LoadResult> local = LoadLocal(path, target, o, world ? &*world : nullptr);
  Status agreed = AgreeOnStatus(comm, local.status());
  if (!agreed.ok()) return agreed.WithContext("initialising from " + path);
  RETURN_IF_ERROR(target.Restore(local->counters), "initialising from ", path);
  return local;
}

}  // namespace zrt::ckpt
