// StateSwapper (ZeRO-Infinity): state that lives in files on NVMe and is streamed through a bounded
// set of host buffers.
//
// The state is a list of regions (the engine: one per parameter group, `elements` = this rank's shard)
// times a list of streams (master, exp_avg, exp_avg_sq, ... each with its element size). Each
// (region, stream) is one preallocated file under <dir>/zrt-swap.rank<r>/. Stream() walks every region
// in sub-groups of `sub_group_elements` and pipelines them over `buffer_sets` (3) host buffer sets:
// while the caller updates sub-group i, sub-group i+1 is being read and i-1 written. Host memory is
// buffer_sets * sub_group_elements * (sum of element sizes), whatever the model size, taken once from
// a budgeted HostMemory.
//
// Swap files are scratch: created (and preallocated, so "no space" shows at creation) by Create,
// removed by the destructor; a directory left by a killed process is cleared by the next Create for
// that rank, and those of ranks a resumed job no longer has by any rank's Create (world_size). The source of truth across crashes is the checkpoint. An flock on the rank's directory
// refuses two live processes sharing it.
//
// Errors name the file (or the setting): a missing directory, no space, a file removed underneath
// (checked at every Stream), a budget too small for the buffer sets of one sub-group. An I/O error in
// the middle of Stream leaves the regions partly updated: restore from a checkpoint.
//
// Thread-safety: one thread at a time; Stream's callback runs on the calling thread.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "zrt/offload/host_memory.h"
#include "zrt/offload/io_engine.h"
#include "zrt/offload/io_options.h"

namespace zrt {

struct SwapRegion {
  std::string name;  // for errors ("group 'layer0'")
  int64_t elements = 0;
  // Per stream, where it differs from the stream's (e.g. a bf16 group's params); 0: the stream has
  // nothing of this region (no file bytes, no transfers, a null window pointer).
  std::vector<size_t> element_bytes;
  // Per stream, where not 1: region elements per stored element (a q8 moment's scales: one per block
  // of `block` elements; a power of two <= 4096 dividing `elements`). Sub-groups, windows and the
  // random-access ranges of such a region are then whole multiples of it.
  std::vector<int64_t> elements_per;
};

struct SwapStream {
  std::string name;  // file suffix and errors: "master", "exp_avg", ...
  size_t element_bytes = 4;
};

struct SwapperOptions {
  std::string dir;                  // must exist
  int rank = 0;                     // names the rank's subdirectory
  // The job's ranks (0: unknown). Directories of ranks >= world_size that no live process holds (a
  // job resumed on fewer ranks) are removed.
  int world_size = 0;
  int64_t sub_group_elements = 0;   // 0: as large as the host budget allows, at most kMaxAutoSubGroup
  int buffer_sets = 3;              // >= 1; 3 overlaps read i+1, update i, write i-1
  static constexpr int64_t kMaxAutoSubGroup = int64_t{1} << 25;
};

// Per-stream access of one Stream() call.
enum class SwapAccess : uint8_t { kNone, kRead, kWrite, kReadWrite };

class StateSwapper {
 public:
  // `io` and `host` must outlive the swapper.
  static Result<std::unique_ptr<StateSwapper>> Create(const SwapperOptions& o, std::vector<SwapRegion> regions,
                                                      std::vector<SwapStream> streams, IoEngine* io, HostMemory* host);
  ~StateSwapper();  // removes the swap files

  // One sub-group handed to Stream's callback: data[s] holds `count` elements of stream s at element
  // `offset` of `region` (read from the file when the stream's access reads; unspecified when it only
  // writes; null for kNone). What the callback leaves there is written back for writing streams.
  struct Window {
    int region;
    int64_t offset;
    int64_t count;
    std::span<void* const> data;
  };
  using UpdateFn = std::function<Status(const Window&)>;
  // Visits every sub-group of every region in order. access.size() == number of streams.
  Status Stream(std::span<const SwapAccess> access, const UpdateFn& fn, SwapStats* stats = nullptr);

  // That every swap file is still there (Stream checks it first). Cheap: one fstat per file.
  Status CheckFiles() const;

  // Random access, synchronous (checkpoints, tests): `count` elements at element `offset`.
  Status Read(int region, int stream, int64_t offset, int64_t count, void* out);
  Status Write(int region, int stream, int64_t offset, int64_t count, const void* in);
  // A whole region of one stream into `out` (>= RegionBytes, 4 KiB-aligned for O_DIRECT), asynchronously.
  Result<IoHandle> ReadRegionAsync(int region, int stream, void* out);
  size_t RegionBytes(int region, int stream) const;  // rounded up to kIoAlignment

  int64_t sub_group_elements() const { return sub_group_; }
  int64_t host_bytes() const;      // the buffer sets
  int64_t file_bytes() const;      // all swap files
  const std::string& rank_dir() const { return rank_dir_; }
  const std::string& file_path(int region, int stream) const;

 private:
  class Pass;  // one Stream
  StateSwapper() = default;
  Result<std::vector<int64_t>> Widest(int64_t* largest);  // Create's steps (sets quantum_)
  Status OpenRankDir(const SwapperOptions& o);
  Result<int64_t> CreateFiles();
  Status CheckRange(int region, int stream, int64_t offset, int64_t count) const;  // and the stream present
  int64_t Es(size_t region, size_t stream) const;   // element size (0: absent)
  int64_t Per(size_t region, size_t stream) const;  // region elements per stored element
  // Bytes of `count` region elements of a stream (count a multiple of Per).
  int64_t Bytes(size_t region, size_t stream, int64_t count) const { return count / Per(region, stream) * Es(region, stream); }
  const IoFile& File(size_t region, size_t stream) const { return files_[region * streams_.size() + stream]; }

  IoEngine* io_ = nullptr;
  std::vector<SwapRegion> regions_;
  std::vector<SwapStream> streams_;
  int64_t sub_group_ = 0;
  int64_t quantum_ = 0;  // sub-groups are multiples of it: each starts 4 KiB-aligned in every file
  std::string rank_dir_;
  UniqueFd lock_;
  std::vector<IoFile> files_;  // region-major
  std::vector<std::vector<DeviceBuffer>> sets_;  // [set][stream]
};

}  // namespace zrt
