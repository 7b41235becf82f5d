// safetensors reading, writing, import and in-place loading (the format: safetensors.h).
#include "zrt/checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
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
#include "zrt/checkpoint/import_full.h"
#include "zrt/checkpoint/state_fill.h"
#include "zrt/checkpoint/tensor_reader.h"
#include "zrt/checkpoint/verify.h"
#include "zrt/checkpoint/whole_group.h"
#include "zrt/core/logging.h"

namespace zrt::ckpt {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr int64_t kMaxHeaderBytes = int64_t{100} << 20;  // the format's own limit
constexpr const char* kZrtKey = "zrt";
constexpr const char* kOptimizerPrefix = "optimizer/";

// The format's dtype names and element sizes (every one it defines; zrt reads the floating ones).
int64_t SafetensorsDTypeSize(const std::string& d) {
  static const std::map<std::string, int64_t> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"U16", 2}, {"I16", 2}, {"F16", 2},
      {"BF16", 2}, {"U32", 4}, {"I32", 4}, {"F32", 4},     {"U64", 8},     {"I64", 8}, {"F64", 8}};
  auto it = sizes.find(d);
  return it == sizes.end() ? 0 : it->second;
}
Result<const char*> SafetensorsName(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kBF16: return "BF16";
    case DType::kF16: return "F16";
    default: return InvalidArgumentError("safetensors: no dtype for ", DTypeName(t));
  }
}

Status PreadAll(int fd, void* out, int64_t bytes, int64_t offset, const std::string& file) {
  char* p = static_cast<char*>(out);
  while (bytes > 0) {
    const ssize_t n = ::pread(fd, p, static_cast<size_t>(std::min<int64_t>(bytes, int64_t{1} << 30)), offset);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return IoError("reading ", file, ": ", std::strerror(errno));
    if (n == 0) return DataLossError(file, ": ends before byte ", offset + bytes, " (truncated)");
    p += n;
    bytes -= n;
    offset += n;
  }
  return Status();
}

// A plain file name (an index's weight_map value): one path component, not hidden, no '/'.
bool PlainName(const std::string& n) {
  return !n.empty() && n.size() < 256 && n[0] != '.' && n.find('/') == std::string::npos && n.find('\0') == std::string::npos;
}

Result<UniqueFd> OpenNoFollow(int dir_fd, const std::string& name, const std::string& shown) {
  UniqueFd fd(::openat(dir_fd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid()) {
    if (errno == ENOENT) return NotFoundError(shown, " does not exist");
    if (errno == ELOOP) return DataLossError(shown, " is a symbolic link (refused)");
    return IoError("opening ", shown, ": ", std::strerror(errno));
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) return DataLossError(shown, " is not a regular file");
  return fd;
}

// One file's header, checked against the format's rules.
Status ParseHeader(int fd, int file, const std::string& shown, std::vector<SafetensorsReader::Tensor>* out,
                   std::map<std::string, std::string>* metadata) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return IoError("stat ", shown, ": ", std::strerror(errno));
  const int64_t size = st.st_size;
  if (size < 8) return DataLossError(shown, ": ", size, " bytes, too short for a safetensors header");
  uint8_t len_bytes[8];
  RETURN_IF_ERROR(PreadAll(fd, len_bytes, 8, 0, shown));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
  if (n < 2 || n > static_cast<uint64_t>(kMaxHeaderBytes)) {
    return DataLossError(shown, ": header length ", n, " (the format allows 2 to ", kMaxHeaderBytes, " bytes)");
  }
  if (static_cast<int64_t>(n) > size - 8) return DataLossError(shown, ": header of ", n, " bytes, the file has ", size - 8, " after the length");
  std::string text(n, '\0');
  RETURN_IF_ERROR(PreadAll(fd, text.data(), static_cast<int64_t>(n), 8, shown));
  if (text[0] != '{') return DataLossError(shown, ": the header does not start with '{'");
  json h = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!h.is_object()) return DataLossError(shown, ": the header is not a JSON object");
  const int64_t data_begin = 8 + static_cast<int64_t>(n), data_bytes = size - data_begin;
  std::vector<SafetensorsReader::Tensor> local;
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) return DataLossError(shown, ": __metadata__ is not an object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) return DataLossError(shown, ": __metadata__[\"", m.key(), "\"] is not a string");
        if (metadata) (*metadata)[m.key()] = m->get<std::string>();
      }
      continue;
    }
    const std::string& name = it.key();
    const json& e = *it;
    if (name.empty()) return DataLossError(shown, ": a tensor with an empty name");
    if (!e.is_object() || !e.contains("dtype") || !e["dtype"].is_string() || !e.contains("shape") || !e["shape"].is_array() ||
        !e.contains("data_offsets") || !e["data_offsets"].is_array() || e["data_offsets"].size() != 2) {
      return DataLossError(shown, ": tensor '", name, "' needs dtype (string), shape (array) and data_offsets ([begin, end])");
    }
    SafetensorsReader::Tensor t;
    t.name = name;
    t.dtype = e["dtype"].get<std::string>();
    const int64_t esize = SafetensorsDTypeSize(t.dtype);
    if (esize == 0) return DataLossError(shown, ": tensor '", name, "' has unknown dtype \"", t.dtype, "\"");
    if (e["shape"].size() > 64) return DataLossError(shown, ": tensor '", name, "' has ", e["shape"].size(), " dimensions");
    for (const json& d : e["shape"]) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > static_cast<uint64_t>(kMaxNumel)) {
        return DataLossError(shown, ": tensor '", name, "' has a bad dimension ", d.dump());
      }
      const auto v = static_cast<int64_t>(d.get<uint64_t>());
      if (v != 0 && t.numel > kMaxNumel / v) return DataLossError(shown, ": tensor '", name, "' has more than 2^48 elements");
      t.shape.push_back(v);
      t.numel *= v;
    }
    const json& off = e["data_offsets"];
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      return DataLossError(shown, ": tensor '", name, "' data_offsets are not unsigned integers");
    }
    const uint64_t b = off[0].get<uint64_t>(), en = off[1].get<uint64_t>();
    if (b > en || en > static_cast<uint64_t>(data_bytes)) {
      return DataLossError(shown, ": tensor '", name, "' data_offsets [", b, ", ", en, "] outside the ", data_bytes, "-byte buffer");
    }
    t.bytes = static_cast<int64_t>(en - b);
    if (t.bytes != t.numel * esize) {
      return DataLossError(shown, ": tensor '", name, "' spans ", t.bytes, " bytes, its shape and ", t.dtype, " need ", t.numel * esize);
    }
    t.offset = data_begin + static_cast<int64_t>(b);
    t.file = file;
    local.push_back(std::move(t));
  }
  // The tensors tile the buffer exactly (the format forbids holes: no data hidden between tensors).
  std::sort(local.begin(), local.end(), [](const auto& a, const auto& b) { return a.offset != b.offset ? a.offset < b.offset : a.bytes < b.bytes; });
  int64_t at = data_begin;
  for (const auto& t : local) {
    if (t.offset != at) {
      return DataLossError(shown, ": tensor '", t.name, "' starts at byte ", t.offset - data_begin, " of the buffer, ",
                           t.offset < at ? "overlapping the previous tensor" : "leaving a hole after the previous one", " (expected ",
                           at - data_begin, ")");
    }
    at += t.bytes;
  }
  if (at != size) return DataLossError(shown, ": ", size - at, " bytes after the last tensor (the buffer must be exactly the tensors)");
  for (auto& t : local) out->push_back(std::move(t));
  return Status();
}

// Streams bytes to a file through an aligned buffer, durably at Finish. O_DIRECT where the filesystem
// takes it (no copy into the page cache: the copy was half the export's time), written a whole
// buffer at a time at aligned offsets; the tail is padded to the block and the file truncated to its
// length. Buffered writes elsewhere (tmpfs).
class FileWriter {
 public:
  static Result<FileWriter> Create(const std::string& path) {
    FileWriter w;
    w.path_ = path;
    w.fd_ = UniqueFd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_DIRECT, 0644));
    w.direct_ = w.fd_.valid();
    if (!w.direct_) w.fd_ = UniqueFd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (!w.fd_.valid()) return IoError("creating ", path, ": ", std::strerror(errno));
    w.buf_.reset(static_cast<char*>(std::aligned_alloc(kAlign, kBuffer)));
    if (!w.buf_) return OutOfMemoryError("export: no memory for a write buffer");
    return w;
  }
  Status Write(const void* p, size_t n) {
    const char* c = static_cast<const char*>(p);
    while (n > 0) {
      const size_t k = std::min(n, kBuffer - used_);
      std::memcpy(buf_.get() + used_, c, k);
      used_ += k, c += k, n -= k;
      if (used_ == kBuffer) RETURN_IF_ERROR(Flush());
    }
    return Status();
  }
  Status Finish() {
    const int64_t length = offset_ + static_cast<int64_t>(used_);
    if (used_ > 0) {
      const size_t padded = direct_ ? (used_ + kAlign - 1) / kAlign * kAlign : used_;
      std::memset(buf_.get() + used_, 0, padded - used_);
      used_ = padded;
      RETURN_IF_ERROR(Flush());
    }
    if (::ftruncate(fd_.get(), length) != 0) return IoError("truncating ", path_, ": ", std::strerror(errno));
    if (::fsync(fd_.get()) != 0) return IoError("fsync ", path_, ": ", std::strerror(errno));
    fd_.Reset();
    return Status();
  }

 private:
  static constexpr size_t kBuffer = size_t{8} << 20, kAlign = 4096;
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  Status Flush() {
    for (size_t at = 0; at < used_;) {
      const ssize_t w = ::pwrite(fd_.get(), buf_.get() + at, used_ - at, offset_ + static_cast<int64_t>(at));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return IoError("writing ", path_, ": ", w < 0 ? std::strerror(errno) : "no progress");
      at += static_cast<size_t>(w);
    }
    offset_ += static_cast<int64_t>(used_);
    used_ = 0;
    return Status();
  }
  std::string path_;
  UniqueFd fd_;
  bool direct_ = false;
  std::unique_ptr<char, Free> buf_;
  size_t used_ = 0;
  int64_t offset_ = 0;
};

// "<stem>.safetensors" -> stem (the path without the extension).
std::string Stem(const std::string& path) {
  const std::string ext = ".safetensors";
  return path.size() > ext.size() && path.compare(path.size() - ext.size(), ext.size(), ext) == 0 ? path.substr(0, path.size() - ext.size()) : path;
}

}  // namespace

// ---- NameMap ------------------------------------------------------------------------------------

std::optional<std::string> NameMap::Apply(const std::string& name) const {
  if (auto it = exact.find(name); it != exact.end()) {
    if (it->second.empty()) return std::nullopt;
    return it->second;
  }
  for (const auto& [from, to] : prefixes) {
    if (name.compare(0, from.size(), from) == 0) return to + name.substr(from.size());
  }
  return name;
}

Status NameMap::AddRule(const std::string& rule) {
  const size_t eq = rule.find('=');
  if (eq == std::string::npos) return InvalidArgumentError("--rename '", rule, "': expected FROM=TO (a name prefix and its replacement)");
  prefixes.emplace_back(rule.substr(0, eq), rule.substr(eq + 1));
  return Status();
}

Result<NameMap> NameMap::FromJsonFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadWholeFile(path), "name map");
  json j = json::parse(text, nullptr, false);
  if (!j.is_object()) return InvalidArgumentError("name map ", path, ": not a JSON object");
  NameMap m;
  auto exact = [&](const json& o, const std::string& where) -> Status {
    for (auto it = o.begin(); it != o.end(); ++it) {
      if (it->is_null()) m.exact[it.key()] = "";
      else if (it->is_string() && !it->get<std::string>().empty()) m.exact[it.key()] = it->get<std::string>();
      else return InvalidArgumentError("name map ", path, ": ", where, "\"", it.key(), "\" must map to a name or null (drop it)");
    }
    return Status();
  };
  const bool structured = j.contains("exact") || j.contains("prefix");
  if (!structured) {
    RETURN_IF_ERROR(exact(j, ""));
    return m;
  }
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() != "exact" && it.key() != "prefix") return InvalidArgumentError("name map ", path, ": unknown key \"", it.key(), "\"");
    if (!it->is_object()) return InvalidArgumentError("name map ", path, ": \"", it.key(), "\" must be an object");
  }
  if (j.contains("exact")) RETURN_IF_ERROR(exact(j["exact"], "exact: "));
  if (j.contains("prefix")) {
    for (auto it = j["prefix"].begin(); it != j["prefix"].end(); ++it) {
      if (!it->is_string()) return InvalidArgumentError("name map ", path, ": prefix \"", it.key(), "\" must map to a string");
      m.prefixes.emplace_back(it.key(), it->get<std::string>());
    }
    // Longest prefix first, so that a more specific rule wins whatever the file's key order.
    std::stable_sort(m.prefixes.begin(), m.prefixes.end(), [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  }
  return m;
}

struct SafetensorsReader::Fds {
  std::vector<UniqueFd> fds;
};

// ---- reading ------------------------------------------------------------------------------------

bool SafetensorsReader::Tensor::floating() const { return dtype == "F16" || dtype == "BF16" || dtype == "F32" || dtype == "F64"; }

Result<SafetensorsReader> SafetensorsReader::Open(const std::string& path_in) {
  std::string path = path_in;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const std::string index = (fs::path(path) / "model.safetensors.index.json").string();
    path = fs::exists(fs::symlink_status(index, ec)) ? index : (fs::path(path) / "model.safetensors").string();
  } else if (!fs::exists(fs::symlink_status(path, ec)) && Stem(path) != path) {
    const std::string index = Stem(path) + ".safetensors.index.json";
    if (fs::exists(fs::symlink_status(index, ec))) path = index;
  }
  SafetensorsReader r;
  r.path_ = path;
  r.fds_ = std::make_shared<Fds>();
  const fs::path p(path);
  const std::string dir = p.has_parent_path() ? p.parent_path().string() : ".";
  UniqueFd dir_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir_fd.valid()) return NotFoundError(path_in, ": directory ", dir, " cannot be opened: ", std::strerror(errno));
  const std::string base = p.filename().string();
  const bool is_index = base.size() > 5 && base.compare(base.size() - 5, 5, ".json") == 0;
  std::map<std::string, std::string> weight_map;  // tensor -> file (an index)
  if (!is_index) {
    ASSIGN_OR_RETURN(UniqueFd fd, OpenNoFollow(dir_fd.get(), base, path));
    RETURN_IF_ERROR(ParseHeader(fd.get(), 0, path, &r.tensors_, &r.metadata_));
    r.files_.push_back(path);
    r.fds_->fds.push_back(std::move(fd));
  } else {
    ASSIGN_OR_RETURN(UniqueFd fd, OpenNoFollow(dir_fd.get(), base, path));
    struct stat st;
    if (::fstat(fd.get(), &st) != 0 || st.st_size > kMaxHeaderBytes) return DataLossError(path, ": an index over ", kMaxHeaderBytes, " bytes");
    std::string text(static_cast<size_t>(st.st_size), '\0');
    RETURN_IF_ERROR(PreadAll(fd.get(), text.data(), st.st_size, 0, path));
    json j = json::parse(text, nullptr, false);
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
      return DataLossError(path, ": not a safetensors index (a JSON object with \"weight_map\")");
    }
    if (j.contains("metadata")) {
      if (!j["metadata"].is_object()) return DataLossError(path, ": \"metadata\" is not an object");
      for (auto it = j["metadata"].begin(); it != j["metadata"].end(); ++it) {
        if (it->is_string()) r.metadata_[it.key()] = it->get<std::string>();
      }
    }
    std::map<std::string, int> file_index;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it->is_string() || !PlainName(it->get<std::string>())) {
        return DataLossError(path, ": weight_map[\"", it.key(), "\"] is not a plain file name in the index's directory");
      }
      weight_map[it.key()] = it->get<std::string>();
      if (file_index.try_emplace(it->get<std::string>(), static_cast<int>(file_index.size())).second) {
        r.files_.push_back((fs::path(dir) / it->get<std::string>()).string());
      }
    }
    if (weight_map.empty()) return DataLossError(path, ": the weight_map is empty");
    std::vector<std::string> names(file_index.size());
    for (const auto& [name, i] : file_index) names[static_cast<size_t>(i)] = name;
    for (size_t i = 0; i < names.size(); ++i) {
      ASSIGN_OR_RETURN(UniqueFd f, OpenNoFollow(dir_fd.get(), names[i], r.files_[i]));
      const size_t before = r.tensors_.size();
      RETURN_IF_ERROR(ParseHeader(f.get(), static_cast<int>(i), r.files_[i], &r.tensors_, nullptr));
      for (size_t t = before; t < r.tensors_.size(); ++t) {
        auto w = weight_map.find(r.tensors_[t].name);
        if (w == weight_map.end() || w->second != names[i]) {
          return DataLossError(path, ": ", names[i], " holds tensor '", r.tensors_[t].name, "', which the weight_map puts ",
                               w == weight_map.end() ? std::string("nowhere") : "in " + w->second);
        }
      }
      r.fds_->fds.push_back(std::move(f));
    }
  }
  for (size_t i = 0; i < r.tensors_.size(); ++i) {
    if (!r.by_name_.emplace(r.tensors_[i].name, i).second) {
      return DataLossError(path, ": tensor '", r.tensors_[i].name, "' appears in two files");
    }
  }
  for (const auto& [name, file] : weight_map) {  // every tensor the index names is in its file
    if (!r.by_name_.contains(name)) return DataLossError(path, ": tensor '", name, "' is not in ", file);
  }
  return r;
}

const SafetensorsReader::Tensor* SafetensorsReader::Find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

int64_t SafetensorsReader::total_bytes() const {
  int64_t n = 0;
  for (const Tensor& t : tensors_) n += t.bytes;
  return n;
}

Status SafetensorsReader::ReadBytes(const Tensor& t, int64_t offset, int64_t bytes, void* out) const {
  if (offset < 0 || bytes < 0 || offset + bytes > t.bytes) return InvalidArgumentError("tensor '", t.name, "': bytes out of range");
  return PreadAll(fds_->fds[static_cast<size_t>(t.file)].get(), out, bytes, t.offset + offset, files_[static_cast<size_t>(t.file)]);
}

Status SafetensorsReader::ReadFloat(const Tensor& t, int64_t offset, int64_t count, float* out) const {
  if (!t.floating()) return InvalidArgumentError(files_[static_cast<size_t>(t.file)], ": tensor '", t.name, "' is ", t.dtype, ", not floating point");
  if (offset < 0 || count < 0 || offset + count > t.numel) return InvalidArgumentError("tensor '", t.name, "': elements out of range");
  const int64_t esize = SafetensorsDTypeSize(t.dtype);
  if (esize == 4) return ReadBytes(t, offset * 4, count * 4, out);
  constexpr int64_t kBlock = 1 << 20;  // elements converted per read
  std::vector<char> buf(static_cast<size_t>(std::min(count, kBlock) * esize));
  for (int64_t i = 0; i < count; i += kBlock) {
    const int64_t n = std::min(kBlock, count - i);
    RETURN_IF_ERROR(ReadBytes(t, (offset + i) * esize, n * esize, buf.data()));
    if (t.dtype == "F64") {
      const auto* d = reinterpret_cast<const double*>(buf.data());
      for (int64_t k = 0; k < n; ++k) out[i + k] = static_cast<float>(d[k]);
    } else {
      const auto* h = reinterpret_cast<const uint16_t*>(buf.data());
      if (t.dtype == "BF16") {
        for (int64_t k = 0; k < n; ++k) out[i + k] = Bf16ToFloat(h[k]);
      } else {
        for (int64_t k = 0; k < n; ++k) out[i + k] = F16ToFloat(h[k]);
      }
    }
  }
  return Status();
}

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
  const std::string stem = Stem(out_path);
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
    ASSIGN_OR_RETURN(FileWriter fw, FileWriter::Create(tmps.back()), "export");
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
    RETURN_IF_ERROR(fw.Write(len, 8));
    RETURN_IF_ERROR(fw.Write(text.data(), text.size()));
    w.emplace(std::move(fw));
    current = f;
    return Status();
  };
  // Reading (chunks checked and decoded) runs on two threads, each with its own reader and two window
  // buffers, taking alternate windows ahead of the writer: memory is those windows and the readers'
  // chunk caches, whatever the checkpoint's size.
  constexpr int64_t kWindow = int64_t{1} << 20;  // elements (one chunk of a default checkpoint)
  constexpr int kReaders = 2, kSlotsPerReader = 2;
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
  std::vector<std::unique_ptr<TensorReader>> readers;
  for (int k = 0; k < kReaders; ++k) {
    ASSIGN_OR_RETURN(std::unique_ptr<TensorReader> r, TensorReader::Open(dir), "export");
    readers.push_back(std::move(r));
  }
  std::vector<std::vector<float>> slots(kReaders * kSlotsPerReader);
  std::vector<bool> slot_free(slots.size(), true);
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  Status read_status;
  std::vector<std::thread> producers;
  for (int k = 0; k < kReaders; ++k) {
    producers.emplace_back([&, k] {
      for (size_t j = static_cast<size_t>(k); j < windows.size(); j += kReaders) {
        Window& win = windows[j];
        int slot = -1;
        {
          std::unique_lock lock(mu);
          cv.wait(lock, [&] { return stop || slot_free[static_cast<size_t>(k * kSlotsPerReader)] || slot_free[static_cast<size_t>(k * kSlotsPerReader + 1)]; });
          if (stop) return;
          slot = slot_free[static_cast<size_t>(k * kSlotsPerReader)] ? k * kSlotsPerReader : k * kSlotsPerReader + 1;
          slot_free[static_cast<size_t>(slot)] = false;
        }
        const Entry& e = entries[win.entry];
        const TensorEntry& te = m.groups[static_cast<size_t>(e.group)].tensors[e.tensor];
        std::vector<float>& buf = slots[static_cast<size_t>(slot)];
        buf.resize(static_cast<size_t>(win.count));
        Status st = win.count > 0 ? readers[static_cast<size_t>(k)]->Read(te.name, kinds[static_cast<size_t>(e.group)][e.kind], win.offset, win.count, buf.data())
                                  : Status();
        std::lock_guard lock(mu);
        if (!st.ok()) {
          if (read_status.ok()) read_status = st;
          stop = true;
        }
        win.slot = slot;
        cv.notify_all();
        if (!st.ok()) return;
      }
    });
  }
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
    for (std::thread& t : producers) t.join();
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
      ASSIGN_OR_RETURN(FileWriter iw, FileWriter::Create(index_path + ".tmp"), "export");
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
      RETURN_IF_ERROR(FillStateBuffer(b, g.name, fill));
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
  if (target.restore) RETURN_IF_ERROR(target.restore(local->counters), "initialising from ", path);
  return local;
}

}  // namespace zrt::ckpt
