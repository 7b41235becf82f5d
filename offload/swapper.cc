#include "zrt/offload/swapper.h"
#include "zrt/core/base.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include <chrono>
#include <cstring>

#include "zrt/core/logging.h"
#include "zrt/core/private_dir.h"

namespace zrt {
namespace {

constexpr int64_t kAlign = static_cast<int64_t>(kIoAlignment);
constexpr int64_t kSubGroupQuantum = 4096;  // elements: every sub-group starts 4 KiB-aligned for any element size (x Per)



// Removes swap files a killed process left behind (scratch by definition).
Status ClearStale(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return ErrnoStatus(errno, "opening " + dir);
  Status s;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".swp") == 0) {
      const std::string path = dir + "/" + name;
      if (::unlink(path.c_str()) != 0 && errno != ENOENT && s.ok()) s = ErrnoStatus(errno, "removing stale swap file " + path);
    }
  }
  ::closedir(d);
  return s;
}

// Removes the swap directory of a rank the job no longer has, unless a live process holds its lock
// or it is not this user's.
void RemoveVanishedRank(const std::string& rank_dir) {
  if (!CheckPrivateDir(rank_dir, "offload").ok()) return;
  UniqueFd lock(::open((rank_dir + "/lock").c_str(), O_RDWR | O_CLOEXEC));
  if (lock.valid() && ::flock(lock.get(), LOCK_EX | LOCK_NB) != 0) return;  // in use: another job's
  if (!ClearStale(rank_dir).ok()) return;
  ::unlink((rank_dir + "/lock").c_str());
  if (::rmdir(rank_dir.c_str()) == 0) ZRT_LOG(kInfo) << "offload: removed " << rank_dir << " (a rank this job no longer has)";
}

void RemoveVanishedRanks(const std::string& dir, int world_size) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return;
  std::vector<std::string> stale;
  constexpr std::string_view kPrefix = "zrt-swap.rank";
  while (const dirent* e = ::readdir(d)) {
    const std::string_view name = e->d_name;
    if (!name.starts_with(kPrefix) || name.size() == kPrefix.size() || name.size() > kPrefix.size() + 7) continue;
    const std::string digits(name.substr(kPrefix.size()));
    if (digits.find_first_not_of("0123456789") != std::string::npos) continue;
    if (std::stoi(digits) >= world_size) stale.push_back(dir + "/" + std::string(name));
  }
  ::closedir(d);
  for (const std::string& s : stale) RemoveVanishedRank(s);
}

}  // namespace

// Streams and regions checked; per stream the most bytes per region element over the regions,
// rounded up (what sizes the sub-group; the buffers are sized exactly); *largest: the largest region,
// rounded up to the quantum (4096 elements x the largest Per: sub-groups then start 4 KiB-aligned in
// every file).
Result<std::vector<int64_t>> StateSwapper::Widest(int64_t* largest) {
  for (const SwapStream& st : streams_) {
    if (st.element_bytes == 0 || kAlign % static_cast<int64_t>(st.element_bytes) != 0) {
      return InvalidArgumentError("swapper: stream '", st.name, "' has element size ", st.element_bytes);
    }
  }
  quantum_ = kSubGroupQuantum;
  std::vector<int64_t> widest(streams_.size(), 0);
  for (size_t r = 0; r < regions_.size(); ++r) {
    const SwapRegion& reg = regions_[r];
    if (reg.elements < 0) return InvalidArgumentError("swapper: region '", reg.name, "' has ", reg.elements, " elements");
    for (const size_t given : {reg.element_bytes.size(), reg.elements_per.size()}) {
      if (given != 0 && given != streams_.size()) {
        return InvalidArgumentError("swapper: region '", reg.name, "' gives ", given, " element sizes for ", streams_.size(), " streams");
      }
    }
    for (size_t k = 0; k < streams_.size(); ++k) {
      const int64_t es = Es(r, k), per = Per(r, k);
      if (es == 0) continue;  // absent
      if (es < 0 || kAlign % es != 0) return InvalidArgumentError("swapper: region '", reg.name, "' has element size ", es);
      if (per < 1 || per > kSubGroupQuantum || (per & (per - 1)) != 0 || reg.elements % per != 0) {
        return InvalidArgumentError("swapper: region '", reg.name, "' stores one element per ", per, " of its ", reg.elements);
      }
      widest[k] = std::max(widest[k], (es + per - 1) / per);
      quantum_ = std::max(quantum_, kSubGroupQuantum * per);
    }
  }
  *largest = quantum_;
  for (const SwapRegion& reg : regions_) *largest = std::max(*largest, AlignUp(reg.elements, quantum_));
  for (size_t k = 0; k < streams_.size(); ++k) {
    if (widest[k] == 0) widest[k] = static_cast<int64_t>(streams_[k].element_bytes);  // no regions
  }
  return widest;
}

namespace {

// The sub-group size: asked for (rounded up to the quantum), or the largest the budget allows.
Result<int64_t> SubGroupSize(const SwapperOptions& o, const HostMemory& host, int64_t bytes_per_element, int64_t largest, int64_t quantum) {
  const int64_t per_sub_group_element = bytes_per_element * o.buffer_sets;
  int64_t sg = 0;
  if (o.sub_group_elements > 0) {
    sg = std::min(AlignUp(o.sub_group_elements, quantum), largest);
  } else {
    sg = std::min(std::max(SwapperOptions::kMaxAutoSubGroup, quantum), largest);
    if (host.budget() > 0) sg = std::min(sg, (host.budget() - host.used()) / per_sub_group_element / quantum * quantum);
  }
  if (sg < quantum || !host.Fits(sg * per_sub_group_element)) {
    const int64_t shown = std::max(sg, quantum);
    return InvalidArgumentError(host.setting(), " = ", FormatBytes(host.budget()), " (", FormatBytes(host.used()),
                                " already used) cannot hold ", o.buffer_sets, " buffer sets of one sub-group: ",
                                "offload.sub_group_elements = ", shown, " x ", bytes_per_element, " bytes per element x ",
                                o.buffer_sets, " = ", FormatBytes(shown * per_sub_group_element),
                                "; raise the budget or lower the sub-group size (at least ", quantum, " elements)");
  }
  return sg;
}

Status CheckDir(const SwapperOptions& o) {
  struct stat st {};
  if (o.dir.empty()) return InvalidArgumentError("offload.nvme_dir is empty: NVMe offload needs a directory for its swap files");
  if (::stat(o.dir.c_str(), &st) != 0) return NotFoundError("offload.nvme_dir '", o.dir, "': ", std::strerror(errno), " (the directory must exist)");
  if (!S_ISDIR(st.st_mode)) return InvalidArgumentError("offload.nvme_dir '", o.dir, "' is not a directory");
  return Status();
}

}  // namespace

// The rank's directory: created, locked (one live process per directory), cleared of a dead
// process's files and of ranks the job no longer has.
Status StateSwapper::OpenRankDir(const SwapperOptions& o) {
  rank_dir_ = o.dir + "/zrt-swap.rank" + std::to_string(o.rank);
  RETURN_IF_ERROR(MakePrivateDirs(o.dir, rank_dir_, "offload.nvme_dir"));  // no other user reads or plants the state
  const std::string lock_path = rank_dir_ + "/lock";
  lock_ = UniqueFd(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, kPrivateFileMode));
  if (!lock_.valid()) return ErrnoStatus(errno, "offload: opening " + lock_path);
  (void)::fchmod(lock_.get(), kPrivateFileMode);  // one an older version made
  if (::flock(lock_.get(), LOCK_EX | LOCK_NB) != 0) {
    return FailedPreconditionError("offload: swap directory ", rank_dir_, " is in use by another live process (", lock_path,
                                   " is locked); give each job its own offload.nvme_dir");
  }
  RETURN_IF_ERROR(ClearStale(rank_dir_), "offload");
  if (o.world_size > 0) RemoveVanishedRanks(o.dir, o.world_size);
  return Status();
}

// The swap files, preallocated: space checked first, for an error that says how much is missing
// (fallocate catches races).
Result<int64_t> StateSwapper::CreateFiles() {
  int64_t need = 0;
  for (size_t r = 0; r < regions_.size(); ++r) {
    for (size_t k = 0; k < streams_.size(); ++k) need += static_cast<int64_t>(RegionBytes(static_cast<int>(r), static_cast<int>(k)));
  }
  struct statvfs vfs {};
  if (::statvfs(rank_dir_.c_str(), &vfs) == 0) {
    const auto avail = static_cast<int64_t>(vfs.f_bavail) * static_cast<int64_t>(vfs.f_frsize);
    if (need > avail) {
      return IoError("offload: no space for the swap files in ", rank_dir_, ": they need ", FormatBytes(need), ", the filesystem has ",
                     FormatBytes(avail), " free");
    }
  }
  for (size_t r = 0; r < regions_.size(); ++r) {
    for (size_t k = 0; k < streams_.size(); ++k) {
      const std::string path = rank_dir_ + "/" + std::to_string(r) + "." + streams_[k].name + ".swp";
      ASSIGN_OR_RETURN(IoFile f, IoFile::Open(path, IoFile::Mode::kCreate, /*direct=*/true, kPrivateFileMode), "offload: swap file for ", regions_[r].name);
      const auto size = static_cast<off_t>(RegionBytes(static_cast<int>(r), static_cast<int>(k)));
      RETURN_IF_ERROR(f.Reserve(size), "offload: swap file");
      RETURN_IF_ERROR(f.Truncate(size), "offload: sizing ", path);  // where the filesystem has no fallocate
      files_.push_back(std::move(f));
    }
  }
  return need;
}

Result<std::unique_ptr<StateSwapper>> StateSwapper::Create(const SwapperOptions& o, std::vector<SwapRegion> regions,
                                                           std::vector<SwapStream> streams, IoEngine* io, HostMemory* host) {
  if (io == nullptr || host == nullptr) return InvalidArgumentError("swapper: null I/O engine or host memory");
  if (streams.empty()) return InvalidArgumentError("swapper: no streams");
  if (o.buffer_sets < 1) return InvalidArgumentError("swapper: buffer_sets must be >= 1, got ", o.buffer_sets);
  if (o.sub_group_elements < 0) return InvalidArgumentError("offload.sub_group_elements must be >= 0, got ", o.sub_group_elements);
  RETURN_IF_ERROR(CheckDir(o));
  std::unique_ptr<StateSwapper> s(new StateSwapper());
  s->io_ = io;
  s->regions_ = std::move(regions);
  s->streams_ = std::move(streams);
  int64_t largest = 0;
  ASSIGN_OR_RETURN(const std::vector<int64_t> widest, s->Widest(&largest));
  int64_t bytes_per_element = 0;  // of one buffer set
  for (int64_t w : widest) bytes_per_element += w;
  ASSIGN_OR_RETURN(s->sub_group_, SubGroupSize(o, *host, bytes_per_element, largest, s->quantum_));
  RETURN_IF_ERROR(s->OpenRankDir(o));
  ASSIGN_OR_RETURN(const int64_t need, s->CreateFiles());
  // Buffer sets, zeroed (the rounded-up tails of the last sub-groups are written as they are).
  s->sets_.resize(static_cast<size_t>(o.buffer_sets));
  for (auto& set : s->sets_) {
    for (size_t k = 0; k < s->streams_.size(); ++k) {
      int64_t most = s->regions_.empty() ? s->sub_group_ * widest[k] : 0;  // a sub-group's bytes in the widest region
      for (size_t r = 0; r < s->regions_.size(); ++r) most = std::max(most, s->Bytes(r, k, s->sub_group_));
      const auto bytes = static_cast<size_t>(AlignUp(std::max<int64_t>(most, 1), kAlign));
      ASSIGN_OR_RETURN(DeviceBuffer b, host->Allocate(bytes, MemCategory::kStaging, kIoAlignment), "offload buffer sets");
      RETURN_IF_ERROR(host->Fill(b.data(), 0, bytes));
      set.push_back(std::move(b));
    }
  }
  ZRT_LOG(kInfo) << "offload: " << FormatBytes(need) << " of swap files in " << s->rank_dir_ << " (" << io->backend() << "), "
                 << o.buffer_sets << " buffer sets of " << s->sub_group_ << " elements = " << FormatBytes(s->host_bytes()) << " of "
                 << host->name() << " memory";
  return s;
}

StateSwapper::~StateSwapper() {
  for (IoFile& f : files_) {
    const std::string path = f.path();
    (void)std::move(f).Close();
    ::unlink(path.c_str());
  }
  if (lock_.valid()) {
    ::unlink((rank_dir_ + "/lock").c_str());
    lock_.Reset();
    ::rmdir(rank_dir_.c_str());  // only if empty
  }
}

int64_t StateSwapper::Es(size_t region, size_t stream) const {
  const SwapRegion& r = regions_[region];
  return static_cast<int64_t>(r.element_bytes.empty() ? streams_[stream].element_bytes : r.element_bytes[stream]);
}

int64_t StateSwapper::Per(size_t region, size_t stream) const {
  const SwapRegion& r = regions_[region];
  return r.elements_per.empty() ? 1 : r.elements_per[stream];
}

size_t StateSwapper::RegionBytes(int region, int stream) const {
  const auto r = static_cast<size_t>(region), k = static_cast<size_t>(stream);
  return static_cast<size_t>(AlignUp(Bytes(r, k, regions_[r].elements), kAlign));
}

int64_t StateSwapper::host_bytes() const {
  int64_t b = 0;
  for (const auto& set : sets_) {
    for (const DeviceBuffer& d : set) b += static_cast<int64_t>(d.size());
  }
  return b;
}

int64_t StateSwapper::file_bytes() const {
  int64_t b = 0;
  for (size_t r = 0; r < regions_.size(); ++r) {
    for (size_t k = 0; k < streams_.size(); ++k) b += static_cast<int64_t>(RegionBytes(static_cast<int>(r), static_cast<int>(k)));
  }
  return b;
}

const std::string& StateSwapper::file_path(int region, int stream) const {
  return File(static_cast<size_t>(region), static_cast<size_t>(stream)).path();
}

Status StateSwapper::CheckFiles() const {
  for (const IoFile& f : files_) {
    struct stat st {};
    if (::fstat(f.fd(), &st) != 0) return ErrnoStatus(errno, "offload: swap file " + f.path());
    if (st.st_nlink == 0) {
      return FailedPreconditionError("offload: swap file ", f.path(), " was removed while in use (the directory ",
                                     rank_dir_, " must be left alone while training); restart from a checkpoint");
    }
  }
  return Status();
}

Status StateSwapper::CheckRange(int region, int stream, int64_t offset, int64_t count) const {
  if (region < 0 || region >= static_cast<int>(regions_.size())) return InvalidArgumentError("swapper: no region ", region);
  if (stream < 0 || stream >= static_cast<int>(streams_.size())) return InvalidArgumentError("swapper: no stream ", stream);
  const int64_t n = regions_[static_cast<size_t>(region)].elements, per = Per(static_cast<size_t>(region), static_cast<size_t>(stream));
  if (offset < 0 || count < 0 || offset > n || count > n - offset || offset % per != 0 || count % per != 0) {
    return InvalidArgumentError("swapper: elements [", offset, ", ", offset + count, ") outside region '",
                                regions_[static_cast<size_t>(region)].name, "' of ", n, " or not in whole units of ", per);
  }
  if (Es(static_cast<size_t>(region), static_cast<size_t>(stream)) == 0) {
    return InvalidArgumentError("swapper: region '", regions_[static_cast<size_t>(region)].name, "' has no ", streams_[static_cast<size_t>(stream)].name);
  }
  return Status();
}

Status StateSwapper::Read(int region, int stream, int64_t offset, int64_t count, void* out) {
  RETURN_IF_ERROR(CheckRange(region, stream, offset, count));
  const auto r = static_cast<size_t>(region), k = static_cast<size_t>(stream);
  return io_->ReadSync(File(r, k), out, static_cast<size_t>(Bytes(r, k, count)), Bytes(r, k, offset));
}

Status StateSwapper::Write(int region, int stream, int64_t offset, int64_t count, const void* in) {
  RETURN_IF_ERROR(CheckRange(region, stream, offset, count));
  const auto r = static_cast<size_t>(region), k = static_cast<size_t>(stream);
  return io_->WriteSync(File(r, k), in, static_cast<size_t>(Bytes(r, k, count)), Bytes(r, k, offset));
}

Result<IoHandle> StateSwapper::ReadRegionAsync(int region, int stream, void* out) {
  RETURN_IF_ERROR(CheckRange(region, stream, 0, 0));
  return io_->Read(File(static_cast<size_t>(region), static_cast<size_t>(stream)), out, RegionBytes(region, stream), 0);
}

// One pass of Stream over every sub-group of every region: sub-group i uses buffer set i % sets; the
// read of i+1 is issued before i is updated (its set's previous write done first), the write of i
// after; every buffer is idle again before the pass returns, error or not.
class StateSwapper::Pass {
 public:
  Pass(StateSwapper& s, std::span<const SwapAccess> access) : s_(s), access_(access), reads_(s.sets_.size()), writes_(s.sets_.size()) {
    for (size_t r = 0; r < s.regions_.size(); ++r) {
      for (int64_t off = 0; off < s.regions_[r].elements; off += s.sub_group_) {
        items_.push_back({static_cast<int>(r), off, std::min(s.sub_group_, s.regions_[r].elements - off)});
      }
    }
  }
  ~Pass() {
    for (size_t k = 0; k < reads_.size(); ++k) {
      (void)WaitAll(reads_[k]);
      (void)WaitAll(writes_[k]);
    }
  }
  Status Run(const UpdateFn& fn);
  SwapStats stats;

 private:
  struct Item {
    int region;
    int64_t offset, count;
  };
  static Status WaitAll(std::vector<IoHandle>& hs) {
    Status first;
    for (IoHandle& h : hs) {
      Status st = h.Wait();
      if (first.ok() && !st.ok()) first = std::move(st);
    }
    hs.clear();
    return first;
  }
  // The reads (or writes) of item i's streams that its access asks for: whole 4 KiB blocks (the files
  // are padded to them), so every transfer goes O_DIRECT.
  Status Issue(size_t i, bool write) {
    const Item& it = items_[i];
    const size_t set = i % s_.sets_.size();
    for (size_t k = 0; k < s_.streams_.size(); ++k) {
      const SwapAccess a = access_[k];
      const bool want = write ? (a == SwapAccess::kWrite || a == SwapAccess::kReadWrite) : (a == SwapAccess::kRead || a == SwapAccess::kReadWrite);
      const auto r = static_cast<size_t>(it.region);
      if (!want || s_.Es(r, k) == 0) continue;
      const IoFile& f = s_.File(r, k);
      const auto len = static_cast<size_t>(AlignUp(s_.Bytes(r, k, it.count), kAlign));
      void* buf = s_.sets_[set][k].data();
      auto h = write ? s_.io_->Write(f, buf, len, s_.Bytes(r, k, it.offset)) : s_.io_->Read(f, buf, len, s_.Bytes(r, k, it.offset));
      if (!h.ok()) return h.status().WithContext(std::string(write ? "offload: writing " : "offload: reading ") + f.path());
      (write ? writes_ : reads_)[set].push_back(std::move(*h));
      (write ? stats.bytes_written : stats.bytes_read) += static_cast<int64_t>(len);
    }
    return Status();
  }

  StateSwapper& s_;
  std::span<const SwapAccess> access_;
  std::vector<Item> items_;
  std::vector<std::vector<IoHandle>> reads_, writes_;  // per buffer set
};

Status StateSwapper::Pass::Run(const UpdateFn& fn) {
  const size_t nsets = s_.sets_.size();
  if (!items_.empty()) RETURN_IF_ERROR(Issue(0, false));
  std::vector<void*> data(s_.streams_.size());
  for (size_t i = 0; i < items_.size(); ++i) {
    const size_t set = i % nsets;
    const double tw = SteadySeconds();
    if (i + 1 < items_.size()) {
      // The next sub-group's set was last written by sub-group i+1-nsets: that write must be done.
      RETURN_IF_ERROR(WaitAll(writes_[(i + 1) % nsets]));
      if (nsets > 1) RETURN_IF_ERROR(Issue(i + 1, false));
    }
    RETURN_IF_ERROR(WaitAll(reads_[set]));
    RETURN_IF_ERROR(WaitAll(writes_[set]));  // one buffer set: its previous write
    const double tu = SteadySeconds();
    stats.wait_seconds += tu - tw;
    for (size_t k = 0; k < s_.streams_.size(); ++k) {
      data[k] = access_[k] == SwapAccess::kNone || s_.Es(static_cast<size_t>(items_[i].region), k) == 0 ? nullptr : s_.sets_[set][k].data();
    }
    RETURN_IF_ERROR(fn(Window{items_[i].region, items_[i].offset, items_[i].count, data}));
    stats.update_seconds += SteadySeconds() - tu;
    RETURN_IF_ERROR(Issue(i, true));
    if (nsets == 1 && i + 1 < items_.size()) {  // no overlap possible: write, then read the next
      RETURN_IF_ERROR(WaitAll(writes_[set]));
      RETURN_IF_ERROR(Issue(i + 1, false));
    }
  }
  const double tw = SteadySeconds();
  for (size_t k = 0; k < nsets; ++k) RETURN_IF_ERROR(WaitAll(writes_[k]));
  stats.wait_seconds += SteadySeconds() - tw;
  return Status();
}

Status StateSwapper::Stream(std::span<const SwapAccess> access, const UpdateFn& fn, SwapStats* stats) {
  if (access.size() != streams_.size()) return InvalidArgumentError("swapper: ", access.size(), " access modes for ", streams_.size(), " streams");
  RETURN_IF_ERROR(CheckFiles());
  const double t0 = SteadySeconds();
  Status s;
  SwapStats figures;
  {
    Pass pass(*this, access);
    s = pass.Run(fn);
    figures = pass.stats;
  }  // every buffer idle
  figures.seconds = SteadySeconds() - t0;
  if (stats) *stats = figures;
  return s;
}

}  // namespace zrt
