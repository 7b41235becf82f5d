// safetensors reading, as untrusted input (the format and the checks: safetensors.h).
#include "zrt/checkpoint/interchange/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "zrt/checkpoint/format.h"
#include "zrt/checkpoint/fs_util.h"
#include "zrt/core/unique_fd.h"

namespace zrt::ckpt {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr int64_t kMaxHeaderBytes = int64_t{100} << 20;  // the format's own limit

// The format's dtype names and element sizes (every one it defines; zrt reads the floating ones).
int64_t SafetensorsDTypeSize(const std::string& d) {
  static const std::map<std::string, int64_t> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"U16", 2}, {"I16", 2}, {"F16", 2},
      {"BF16", 2}, {"U32", 4}, {"I32", 4}, {"F32", 4},     {"U64", 8},     {"I64", 8}, {"F64", 8}};
  auto it = sizes.find(d);
  return it == sizes.end() ? 0 : it->second;
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

// One tensor's entry; its offset is from the start of the data buffer (`data_bytes` long).
Result<SafetensorsReader::Tensor> ParseEntry(const std::string& name, const json& e, int64_t data_bytes, const std::string& shown) {
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
  t.offset = static_cast<int64_t>(b);
  return t;
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
    ASSIGN_OR_RETURN(SafetensorsReader::Tensor t, ParseEntry(it.key(), *it, data_bytes, shown));
    t.offset += data_begin;
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

}  // namespace

// "<stem>.safetensors" -> stem (the path without the extension).
std::string SafetensorsStem(const std::string& path) {
  const std::string ext = ".safetensors";
  return path.size() > ext.size() && path.compare(path.size() - ext.size(), ext.size(), ext) == 0 ? path.substr(0, path.size() - ext.size()) : path;
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
  } else if (!fs::exists(fs::symlink_status(path, ec)) && SafetensorsStem(path) != path) {
    const std::string index = SafetensorsStem(path) + ".safetensors.index.json";
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

}  // namespace zrt::ckpt
