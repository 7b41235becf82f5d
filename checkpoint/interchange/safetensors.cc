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
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "zrt/checkpoint/files.h"
#include "zrt/checkpoint/fs_util.h"
#include "zrt/checkpoint/interchange/import_full.h"
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
}  // namespace

// ---- export -------------------------------------------------------------------------------------

Status ExportSafetensors(const std::string& dir, const std::string& out_path, const SafetensorsExportOptions& o,
                         const ProgressFn& progress) {
  const DType param_dtype_default = o.all_states ? DType::kF32 : DType::kBytes;  // kBytes: the model's
  const DType forced = o.dtype.value_or(param_dtype_default);
  if (forced != DType::kBytes) RETURN_IF_ERROR(SafetensorsName(forced).status(), "export");
  if (o.max_shard_bytes < 1) return InvalidArgumentError("export: the shard size limit must be positive");
  ASSIGN_OR_RETURN(Manifest m, ReadManifest(dir), "export");
  std::vector<std::string> problems;
  RETURN_IF_ERROR(CheckComplete(dir, VerifyLevel::kMetadata, &problems));
  if (!problems.empty()) return DataLossError("export: ", dir, " is not complete: ", problems.front());
  ASSIGN_OR_RETURN(std::unique_ptr<IoEngine> io, IoEngine::Create(IoOptions{}), "export");  // before the writers that use it

  // Every entry in write order: group by group, each kind's tensors together (one group in memory).
  struct Entry {
    std::string key;
    int group;
    size_t tensor, kind;  // kind: index into the group's exported kinds
    DType dtype;
    int64_t bytes;
  };
  std::vector<Entry> entries;
  std::vector<std::vector<std::string>> kinds(m.groups.size());
  json zgroups = json::array();
  std::set<std::string> keys;
  for (size_t g = 0; g < m.groups.size(); ++g) {
    const GroupEntry& ge = m.groups[g];
    kinds[g] = {"master"};
    if (o.all_states) {
      for (const std::string& k : ge.kinds) {
        if (k != "master") kinds[g].push_back(k);
      }
    }
    json zt = json::array();
    std::vector<std::optional<std::string>> mapped;
    for (const TensorEntry& te : ge.tensors) {
      mapped.push_back(o.names.Apply(te.name));
      if (mapped.back()) zt.push_back({{"name", *mapped.back()}, {"model_dtype", DTypeName(te.dtype)}});
    }
    for (size_t k = 0; k < kinds[g].size(); ++k) {
      for (size_t t = 0; t < ge.tensors.size(); ++t) {
        if (!mapped[t]) continue;
        const TensorEntry& te = ge.tensors[t];
        const DType dt = k > 0 ? DType::kF32 : forced == DType::kBytes ? te.dtype : forced;
        if (k == 0 && dt != DType::kF32 && dt != DType::kBF16 && dt != DType::kF16) {
          return InvalidArgumentError("export: tensor '", te.name, "' is ", DTypeName(dt), " (safetensors export writes f32, bf16 or f16)");
        }
        std::string key = k == 0 ? *mapped[t] : kOptimizerPrefix + kinds[g][k] + "/" + *mapped[t];
        if (key == "__metadata__" || key.empty()) return InvalidArgumentError("export: a tensor cannot be named '", key, "' in safetensors (rename it)");
        if (!keys.insert(key).second) return InvalidArgumentError("export: two tensors would be named '", key, "' (check the name map)");
        entries.push_back({std::move(key), static_cast<int>(g), t, k, dt, te.numel * static_cast<int64_t>(DTypeSize(dt))});
      }
    }
    zgroups.push_back({{"name", ge.name}, {"lr", ge.lr}, {"weight_decay", ge.weight_decay}, {"alignment", ge.alignment},
                       {"kinds", kinds[g]}, {"tensors", zt}});
  }
  if (entries.empty()) return InvalidArgumentError("export: the name map drops every tensor");
  const json zrt = {{"version", 1}, {"step", m.step}, {"world_size", m.world_size}, {"stage", m.stage}, {"loss_scale", m.loss_scale},
                    {"scaler_good_steps", m.scaler_good_steps}, {"scaler_hysteresis_left", m.scaler_hysteresis_left},
                    {"trainer_state", m.trainer_state}, {"engine_state", m.engine_state}, {"groups", zgroups}};
  // Files: greedy by write order under the limit (a tensor larger than the limit gets a file of its own).
  std::vector<std::pair<size_t, size_t>> files;  // [first, last) entries
  int64_t total = 0;
  for (size_t i = 0, bytes = 0; i < entries.size(); ++i) {
    if (files.empty() || (bytes > 0 && static_cast<int64_t>(bytes) + entries[i].bytes > o.max_shard_bytes)) {
      files.push_back({i, i});
      bytes = 0;
    }
    files.back().second = i + 1;
    bytes += static_cast<size_t>(entries[i].bytes);
    total += entries[i].bytes;
  }
  const std::string stem = SafetensorsStem(out_path);
  const bool sharded = files.size() > 1;
  auto file_name = [&](size_t f) {
    if (!sharded) return out_path;
    char suffix[64];
    std::snprintf(suffix, sizeof(suffix), "-%05zu-of-%05zu.safetensors", f + 1, files.size());
    return stem + suffix;
  };
  const std::string parent = fs::path(out_path).has_parent_path() ? fs::path(out_path).parent_path().string() : ".";
  std::vector<std::string> tmps;
  auto cleanup = [&] {
    for (const std::string& t : tmps) ::unlink(t.c_str());
  };

  // Open every file's writer lazily; write each header first (offsets known from the sizes).
  int64_t done = 0;
  size_t current = SIZE_MAX;
  std::optional<FileWriter> w;
  auto begin_file = [&](size_t f) -> Status {
    json h = json::object();
    int64_t at = 0;
    for (size_t i = files[f].first; i < files[f].second; ++i) {
      const Entry& e = entries[i];
      const TensorEntry& te = m.groups[static_cast<size_t>(e.group)].tensors[e.tensor];
      ASSIGN_OR_RETURN(const char* dn, SafetensorsName(e.dtype));
      h[e.key] = {{"dtype", dn}, {"shape", te.shape}, {"data_offsets", {at, at + e.bytes}}};
      at += e.bytes;
    }
    h["__metadata__"] = {{"format", "pt"}};
    if (!sharded) h["__metadata__"][kZrtKey] = zrt.dump();
    std::string text = h.dump();
    text.append((8 - (8 + text.size()) % 8) % 8, ' ');  // the buffer starts 8-byte aligned
    tmps.push_back(file_name(f) + ".tmp");
    ASSIGN_OR_RETURN(FileWriter fw, FileWriter::Create(*io, tmps.back()), "export");
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
    RETURN_IF_ERROR(fw.Write(len, 8));
    RETURN_IF_ERROR(fw.Write(text.data(), text.size()));
    w.emplace(std::move(fw));
    current = f;
    return Status();
  };
  // Reading (chunks checked and decoded) runs on one thread ahead of the writer, in the writer's order,
  // into kSlots window buffers; the reader's chunks are read asynchronously ahead of it (every read is
  // planned). One reader: readers taking alternate windows each read the chunks their windows share.
  // Memory is the windows, the read-ahead and the reader's chunk cache, whatever the checkpoint's size.
  constexpr int64_t kWindow = int64_t{1} << 20;  // elements (one chunk of a default checkpoint)
  constexpr size_t kSlots = 2;
  constexpr int64_t kReadAheadBytes = int64_t{16} << 20;
  struct Window {
    size_t entry;
    int64_t offset, count;
    int slot = -1;  // set when read
  };
  std::vector<Window> windows;
  for (size_t i = 0; i < entries.size(); ++i) {
    const int64_t numel = m.groups[static_cast<size_t>(entries[i].group)].tensors[entries[i].tensor].numel;
    int64_t off = 0;
    do {
      windows.push_back({i, off, std::min(kWindow, numel - off)});
      off += kWindow;
    } while (off < numel);
  }
  auto what = [&](const Window& win) -> std::pair<const std::string&, const std::string&> {
    const Entry& e = entries[win.entry];
    return {m.groups[static_cast<size_t>(e.group)].tensors[e.tensor].name, kinds[static_cast<size_t>(e.group)][e.kind]};
  };
  ASSIGN_OR_RETURN(std::unique_ptr<TensorReader> reader, TensorReader::Open(dir), "export");
  for (const Window& win : windows) {
    if (win.count > 0) RETURN_IF_ERROR(reader->Plan(what(win).first, what(win).second, win.offset, win.count), "export");
  }
  reader->StartReadAhead(kReadAheadBytes);
  std::vector<std::vector<float>> slots(kSlots);
  std::vector<bool> slot_free(slots.size(), true);
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  Status read_status;
  std::thread reading([&] {
    for (Window& win : windows) {
      size_t slot = 0;
      {
        std::unique_lock lock(mu);
        cv.wait(lock, [&] { return stop || std::find(slot_free.begin(), slot_free.end(), true) != slot_free.end(); });
        if (stop) return;
        slot = static_cast<size_t>(std::find(slot_free.begin(), slot_free.end(), true) - slot_free.begin());
        slot_free[slot] = false;
      }
      std::vector<float>& buf = slots[slot];
      buf.resize(static_cast<size_t>(win.count));
      Status st = win.count > 0 ? reader->Read(what(win).first, what(win).second, win.offset, win.count, buf.data()) : Status();
      std::lock_guard lock(mu);
      if (!st.ok()) {
        if (read_status.ok()) read_status = st;
        stop = true;
      }
      win.slot = static_cast<int>(slot);
      cv.notify_all();
      if (!st.ok()) return;
    }
  });
  auto consume = [&]() -> Status {
    std::vector<uint16_t> half;
    for (const Window& win : windows) {
      {
        std::unique_lock lock(mu);
        cv.wait(lock, [&] { return win.slot >= 0 || !read_status.ok(); });
        if (!read_status.ok()) return read_status;
      }
      const size_t f = static_cast<size_t>(std::upper_bound(files.begin(), files.end(), win.entry,
                                                            [](size_t v, const auto& r) { return v < r.first; }) - files.begin()) - 1;
      if (f != current) {
        if (w) RETURN_IF_ERROR(w->Finish());
        RETURN_IF_ERROR(begin_file(f));
      }
      const Entry& e = entries[win.entry];
      const float* src = slots[static_cast<size_t>(win.slot)].data();
      if (e.dtype == DType::kF32) {
        RETURN_IF_ERROR(w->Write(src, static_cast<size_t>(win.count) * 4));
      } else {
        half.resize(static_cast<size_t>(win.count));
        if (e.dtype == DType::kBF16) {
          for (size_t i = 0; i < half.size(); ++i) half[i] = FloatToBf16(src[i]);
        } else {
          for (size_t i = 0; i < half.size(); ++i) half[i] = FloatToF16(src[i]);
        }
        RETURN_IF_ERROR(w->Write(half.data(), half.size() * 2));
      }
      if (progress) progress(done += win.count * static_cast<int64_t>(DTypeSize(e.dtype)), total);
      std::lock_guard lock(mu);
      slot_free[static_cast<size_t>(win.slot)] = true;
      cv.notify_all();
    }
    return Status();
  };
  auto run = [&]() -> Status {
    Status consumed = consume();
    {
      std::lock_guard lock(mu);
      stop = true;
      cv.notify_all();
    }
    reading.join();
    RETURN_IF_ERROR(consumed);
    if (w) RETURN_IF_ERROR(w->Finish());
    RETURN_IF_ERROR(FsyncDir(parent));
    for (size_t f = 0; f < files.size(); ++f) RETURN_IF_ERROR(RenamePath(tmps[f], file_name(f)));
    tmps.clear();
    if (sharded) {
      json index = {{"metadata", {{"total_size", total}, {kZrtKey, zrt.dump()}}}, {"weight_map", json::object()}};
      for (size_t f = 0; f < files.size(); ++f) {
        for (size_t i = files[f].first; i < files[f].second; ++i) index["weight_map"][entries[i].key] = fs::path(file_name(f)).filename().string();
      }
      const std::string index_path = stem + ".safetensors.index.json";
      ASSIGN_OR_RETURN(FileWriter iw, FileWriter::Create(*io, index_path + ".tmp"), "export");
      const std::string text = index.dump(2) + "\n";
      RETURN_IF_ERROR(iw.Write(text.data(), text.size()));
      RETURN_IF_ERROR(iw.Finish());
      RETURN_IF_ERROR(RenamePath(index_path + ".tmp", index_path));
    }
    return FsyncDir(parent);
  };
  Status s = run();
  if (!s.ok()) cleanup();
  return s;
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

Result<FileState> Describe(const SafetensorsReader& r, const NameMap& names) {
  FileState s;
  const std::string& where = r.path();
  std::set<std::string> seen;
  auto add = [&](const SafetensorsReader::Tensor& t, const std::string& file_name, FullTensor ft) -> Status {
    std::optional<std::string> to = names.Apply(file_name);
    if (!to) {
      s.dropped.push_back(file_name);
      return Status();
    }
    if (!t.floating()) {
      return InvalidArgumentError(where, ": tensor '", t.name, "' is ", t.dtype, ", not floating point (a name map entry to null drops it)");
    }
    if (!seen.insert(*to).second) return InvalidArgumentError(where, ": two tensors map to '", *to, "' (check the name map)");
    ft.name = *to;
    ft.shape = t.shape;
    s.tensors.push_back(std::move(ft));
    s.params.push_back(&t);
    s.state.emplace_back();
    return Status();
  };
  auto meta = r.metadata().find(kZrtKey);
  if (meta == r.metadata().end()) {
    for (const SafetensorsReader::Tensor& t : r.tensors()) {
      FullTensor ft;
      ft.model_dtype = t.dtype == "BF16" ? DType::kBF16 : t.dtype == "F16" ? DType::kF16 : DType::kF32;
      RETURN_IF_ERROR(add(t, t.name, std::move(ft)));
    }
    if (s.tensors.empty()) return InvalidArgumentError(where, ": no tensors to import");
    return s;
  }
  // zrt's own export: groups, settings, kinds and counters, each checked (the file is untrusted).
  s.from_zrt = true;
  json z = json::parse(meta->second, nullptr, false);
  auto bad = [&](const std::string& what) { return DataLossError(where, ": metadata \"zrt\": ", what); };
  if (!z.is_object() || !z.contains("groups") || !z["groups"].is_array()) return bad("not an object with \"groups\"");
  auto num = [&](const char* key, double lo) -> Result<double> {
    if (!z.contains(key)) return lo;
    if (!z[key].is_number() || !std::isfinite(z[key].get<double>()) || z[key].get<double>() < lo) return bad(std::string(key) + " is not a number >= " + std::to_string(lo));
    return z[key].get<double>();
  };
  ASSIGN_OR_RETURN(double step, num("step", 0));
  ASSIGN_OR_RETURN(double scale, num("loss_scale", 0));
  ASSIGN_OR_RETURN(double good, num("scaler_good_steps", 0));
  ASSIGN_OR_RETURN(double hyst, num("scaler_hysteresis_left", 0));
  if (step > 9e15 || good > 9e15 || hyst > 1e9) return bad("a counter out of range");
  s.counters.step = static_cast<int64_t>(step);
  s.counters.loss_scale = scale > 0 ? scale : 1;
  s.counters.scaler_good_steps = static_cast<int64_t>(good);
  s.counters.scaler_hysteresis_left = static_cast<int>(hyst);
  if (z.contains("trainer_state")) s.counters.trainer_state = z["trainer_state"];
  if (z.contains("engine_state")) {
    if (!z["engine_state"].is_object()) return bad("engine_state is not an object");
    s.counters.engine_state = z["engine_state"];
  }
  for (const json& g : z["groups"]) {
    if (!g.is_object() || !g.contains("name") || !g["name"].is_string() || !g.contains("tensors") || !g["tensors"].is_array() ||
        !g.contains("kinds") || !g["kinds"].is_array()) {
      return bad("a group without name, tensors and kinds");
    }
    std::vector<std::string> gk;
    for (const json& k : g["kinds"]) {
      if (!k.is_string()) return bad("a kind that is not a string");
      gk.push_back(k.get<std::string>());
    }
    if (gk.empty() || gk[0] != "master") return bad("group '" + g["name"].get<std::string>() + "': kinds must start with master");
    for (size_t k = 1; k < gk.size(); ++k) {  // the optimizer's kinds, each once
      if ((gk[k] != "exp_avg" && gk[k] != "exp_avg_sq" && gk[k] != "max_exp_avg_sq") ||
          std::find(gk.begin(), gk.begin() + static_cast<std::ptrdiff_t>(k), gk[k]) != gk.begin() + static_cast<std::ptrdiff_t>(k)) {
        return bad("group '" + g["name"].get<std::string>() + "': state kind '" + gk[k] + "' unknown or repeated");
      }
    }
    if (!s.kinds.emplace(g["name"].get<std::string>(), gk).second) return bad("group '" + g["name"].get<std::string>() + "' listed twice");
    const double lr = g.contains("lr") && g["lr"].is_number() ? g["lr"].get<double>() : 0;
    const double wd = g.contains("weight_decay") && g["weight_decay"].is_number() ? g["weight_decay"].get<double>() : 0;
    for (const json& t : g["tensors"]) {
      if (!t.is_object() || !t.contains("name") || !t["name"].is_string()) return bad("a tensor without a name");
      const std::string fname = t["name"].get<std::string>();
      const SafetensorsReader::Tensor* ft = r.Find(fname);
      if (!ft) return bad("tensor '" + fname + "' is listed but not in the file");
      FullTensor full;
      full.group = g["name"].get<std::string>();
      full.lr = lr;
      full.weight_decay = wd;
      if (t.contains("model_dtype")) {
        if (!t["model_dtype"].is_string()) return bad("tensor '" + fname + "': model_dtype is not a string");
        ASSIGN_OR_RETURN(full.model_dtype, ParseDType(t["model_dtype"].get<std::string>()), where, ": tensor '", fname, "'");
      }
      const size_t before = s.tensors.size();
      RETURN_IF_ERROR(add(*ft, fname, std::move(full)));
      if (s.tensors.size() == before) continue;  // dropped
      for (size_t k = 1; k < gk.size(); ++k) {
        const SafetensorsReader::Tensor* st = r.Find(kOptimizerPrefix + gk[k] + "/" + fname);
        if (!st) return bad("tensor '" + fname + "' has no " + gk[k]);
        if (st->shape != ft->shape || !st->floating()) return bad("tensor '" + fname + "': its " + gk[k] + " does not match it");
        s.state.back()[gk[k]] = st;
      }
    }
  }
  if (s.tensors.empty()) return InvalidArgumentError(where, ": no tensors to import");
  return s;
}

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

Result<LoadResult> LoadLocal(const std::string& path, const StateView& target, const SafetensorsLoadOptions& o) {
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
    if (in_target.contains(name)) continue;
    if (o.strict) return InvalidArgumentError(path, " has tensor '", name, "', which the model does not (strict = false ignores it; a name map drops it)");
    res.unexpected.push_back("tensor '" + name + "'");
  }
  for (const StateGroup& g : target.groups) {
    const int rank = g.layout.world_size() == 1 ? 0 : target.rank;
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
  Result<LoadResult> local = LoadLocal(path, target, o);
  Status agreed = AgreeOnStatus(comm, local.status());
  if (!agreed.ok()) return agreed.WithContext("initialising from " + path);
  RETURN_IF_ERROR(target.Restore(local->counters), "initialising from ", path);
  return local;
}

}  // namespace zrt::ckpt
