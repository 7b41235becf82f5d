// The checkpoint component's settings in one place: chunk compression, the memory tier, the
// Checkpointer's options (and their JSON form), and the memory tier's figures. docs/configuration.md
// describes every field with its cost.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "zrt/core/status.h"
#include "zrt/offload/io_options.h"

namespace zrt::ckpt {

// Chunk compression (CheckpointOptions::compression): optional byte-grouping (each element's bytes
// split into planes, so exponents sit together) then zstd. Off by default: on machines like ours the
// disk outruns zstd on model state (../shared/DESIGN.md "Checkpoints" 9).
enum class Codec : uint8_t { kRaw = 0, kZstd = 1, kByteGroupZstd = 2 };
std::string_view CodecName(Codec c);  // "raw", "zstd", "bg+zstd"
Result<Codec> ParseCodec(std::string_view name);

struct CompressOptions {
  Codec codec = Codec::kRaw;
  int level = 1;  // zstd level
};


// The memory tier (docs/resume.md "Tiers"): every K steps each rank snapshots its state into
// node-local memory that outlives the process, with a replica on a peer rank on another node.
struct MemoryTierOptions {
  // Node-local storage that outlives the process (tmpfs). The tier's files go under
  // <dir>/zrt-tier-<hash of the checkpoint root>/.
  std::string dir = "/dev/shm";
  // A replica of each rank's snapshot on its peer (above); false: own copies only (survive a process
  // kill, not the loss of the node's memory).
  bool replicate = true;
  // Ranks per node, for placement. 0: the launcher's (OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS,
  // SLURM_NTASKS_PER_NODE), else 1. On one machine a smaller value emulates nodes.
  int ranks_per_node = 0;
  // The most bytes this rank's tier files may hold: two generations (the committed one while the next
  // is written) of its own snapshot and of the replica it keeps. 0: the free space of `dir` at start-up.
  // Checked at the first save: ResourceExhausted on every rank, naming the sizes.
  int64_t budget_bytes = 0;
};

struct MemoryTierStats {
  int64_t step = -1;             // the newest generation held (committed, or left by the previous run; -1: none)
  double stall_seconds = 0;      // what training waited for the last committed snapshot (Save, the owner's
                                 // hold for a background copy, a commit that came before the copy ended)
  double write_seconds = 0;      // background: checksums, index, rename of the own copy
  double replica_seconds = 0;    // from the save to the replica being whole on its holder
  int64_t snapshot_bytes = 0;    // one generation of this rank's own copy
  int64_t bytes_held = 0;        // this rank's tier files now (own + replica, every generation)
  int64_t budget_bytes = 0;      // the budget in force
};

struct CheckpointOptions {
  std::string root;
  CompressOptions compression;
  int64_t chunk_elements = 1 << 20;  // elements per chunk (the unit of checksums and partial reads)
  int keep_last = 0;                 // retention: keep the newest K complete checkpoints (0: keep all)
  int64_t keep_every = 0;            // ... and also every step that is a multiple of this (0: none)
  IoOptions io;
  // Added to the nice value of the background writer thread (Linux per-thread priority): 10 lets
  // training's threads run first when cores are short, at the cost of a longer write. 0: unchanged.
  int writer_nice = 0;
  // Threads per rank that encode (compress) and checksum chunks: 1, the writer thread itself; N > 1, N
  // encoder threads beside it (the writer then only issues the I/O). More than 1 pays with
  // compression on (zstd runs at a few hundred MB/s per core); the files are the same either way.
  int writer_threads = 1;
  // The most bytes of host memory a disk save stages this rank's state in (chunk buffers, reused from
  // save to save; at least a few chunks). 0: no bound (the whole state when the writer lags: the
  // owner's next step never waits for the disk). A budget trades memory for that wait.
  int64_t staging_budget_bytes = 0;
  // The memory tier (memory_tier.h): when set, SaveToMemory snapshots into node-local memory with a
  // replica on a peer, and Resume looks there first.
  std::optional<MemoryTierOptions> memory;
};

// CheckpointOptions from JSON (the "checkpoint" object of a trainer's configuration file;
// docs/configuration.md lists the keys). Unknown keys and bad values are refused with their path.
Result<CheckpointOptions> CheckpointOptionsFromJson(const nlohmann::json& j, const CheckpointOptions& defaults = {},
                                                    const std::string& path = "checkpoint");

}  // namespace zrt::ckpt
