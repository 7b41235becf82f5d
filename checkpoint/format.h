// The checkpoint format, version 1 (docs/checkpoint-format.md is the normative description).
//
//   ROOT/step-00001200/             a complete checkpoint (the directory is renamed here only after
//     manifest.json                 every rank's files are durable; writing happens in
//     rank-00000.data, ...          ROOT/step-00001200.tmp-<nonce>/)
//     rank-00000.index.json, ...
//   ROOT/latest                     advisory: the name of the newest committed checkpoint
//
// The manifest and each index are JSON objects with a "checksum" member: xxh3-64 of the object's
// compact serialization without that member (keys sorted). Every data chunk has its own xxh3-64.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "zrt/checkpoint/options.h"
#include "zrt/core/dtype.h"
#include "zrt/core/shard_layout.h"
#include "zrt/core/state_view.h"

namespace zrt::ckpt {

// The newest version this zrt reads and writes. A manifest is written as version 2 only when a group
// lists its files (GroupEntry::files), which a reader of version 1 would read over the wrong files;
// every other manifest, and every index, as version 1, as before.
inline constexpr int kFormatVersion = 2;
inline constexpr std::string_view kFormatName = "zrt-checkpoint";

// Bounds every reader enforces (docs/checkpoint-format.md, "Rules"): a file beyond them is refused as
// corrupt before anything is allocated or looped over.
inline constexpr int kMaxShards = 1 << 20;
inline constexpr int kMaxParts = 256;  // writers of one shard (a save spread over its replicas)
inline constexpr int64_t kMaxChunkElements = int64_t{1} << 27;  // 512 MiB of fp32 decoded per chunk
inline constexpr int64_t kMaxAlignment = int64_t{1} << 20;
inline constexpr int64_t kMaxNumel = int64_t{1} << 48;          // per tensor
inline constexpr int64_t kMaxJsonBytes = int64_t{1} << 30;      // a manifest or an index
// The state kinds a checkpoint may hold, in the order the engine saves them.
inline constexpr std::string_view kStateKinds[] = {"master", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"};

struct TensorEntry {
  std::string name;
  std::vector<int64_t> shape;
  DType dtype = DType::kF32;  // the model's dtype (state is fp32)
  int64_t offset = 0;         // in the group's flat buffer
  int64_t numel = 0;
};

struct GroupEntry {
  std::string name;
  double lr = 0, weight_decay = 0;
  int64_t alignment = 1;
  std::vector<TensorEntry> tensors;
  std::vector<std::string> kinds;  // state kinds saved: "master", "exp_avg", "exp_avg_sq", ...
  // How each kind's chunks store it (kinds' order; "stored" in the file, all f32 when absent) and,
  // with a q8 kind, its elements per block.
  std::vector<Precision> stored;
  int64_t block = 0;
  // The files holding the group's shards, in shard order ("files"; docs/checkpoint-format.md "Groups
  // over a mesh of their own"): shard s is in rank-<files[s]>.*. Empty: the manifest's mesh, shard s
  // in file s, m.shards of them. A group over a data-parallel group of its own (the experts of a
  // mixture-of-experts model) lists its members' files; each file then holds the shards of the groups
  // that name it.
  std::vector<int> files;
  Precision stored_as(size_t kind) const { return kind < stored.size() ? stored[kind] : Precision::kF32; }
  // How kind `kind`'s chunks are stored (a chunk of n elements: format(kind).Bytes(n) bytes before
  // compression; q8: whole blocks' codes, then their f32 scales; docs/checkpoint-format.md "Stored state").
  StateFormat format(size_t kind) const { return StateFormat::Of(stored_as(kind), kind < kinds.size() ? kinds[kind] : "", block); }
};

struct Manifest {
  std::string nonce;  // shared by the manifest and every index of one save
  int64_t step = 0;
  int world_size = 1;  // ranks of the job that saved
  // Distinct shards, one file each: world_size (or a divisor of it: hybrid sharding), or 1 for stage 0;
  // world_size when a group lists its files (every rank writes its file).
  int shards = 1;
  // Files per shard: a save spread over the ranks that hold the same shard (its replicas) has each
  // write a part of it, rank-r.part-p.{data,index.json} (1: rank-r.{data,index.json}).
  int parts = 1;
  int stage = 0;
  std::string zrt_version;
  int64_t created_unix = 0;
  int64_t chunk_elements = 1 << 20;
  double loss_scale = 1;
  int64_t scaler_good_steps = 0;
  int scaler_hysteresis_left = 1;
  nlohmann::json engine_state = nlohmann::json::object();   // StateCounters::engine_state
  nlohmann::json trainer_state = nlohmann::json::object();
  std::vector<GroupEntry> groups;
};

// Shards of group `g` (its layout's world size), the file holding its shard `shard`, and the shard of
// it file `file` holds (-1: none).
int GroupShards(const Manifest& m, int g);
int FileOf(const Manifest& m, int g, int shard);
int ShardIn(const Manifest& m, int g, int file);

struct ChunkEntry {
  int group = 0;
  int kind = 0;             // index into the group's kinds
  int64_t elem_offset = 0;  // first element, within the rank's shard
  int64_t elements = 0;
  int64_t file_offset = 0;
  int64_t stored_bytes = 0;
  Codec codec = Codec::kRaw;
  uint64_t xxh3 = 0;
};

// One index file: shard `rank`'s chunks in part `part` of it (the only part unless the save was spread).
struct RankIndex {
  std::string nonce;
  int64_t step = 0;
  int rank = 0;
  int shards = 1;
  int part = 0, parts = 1;
  std::string data_file;
  int64_t data_bytes = 0;
  std::vector<ChunkEntry> chunks;
  // With groups that list their files (version 2): the shard of each such group this file holds,
  // {group, shard}, in group order ("holds"; I5: what the manifest's lists say, so an edit of the lists
  // alone cannot make a reader take one shard for another).
  std::vector<std::pair<int, int>> holds;
};

// The index of part `part` of shard `rank` of the checkpoint `m` describes, before its chunks: nonce,
// step, rank, shards, part, data file name.
RankIndex IndexOf(const Manifest& m, int rank, int part = 0);

// Which part of file `file` writes each chunk when a save is spread over m.parts writers (every file
// alike): the file's chunks in order (group, kind, element) cut into m.parts runs of about the same
// bytes before compression (the chunks of a group the file does not hold: no part's). What a reader
// needs is only that the parts' chunks tile the file's shards.
class PartPlan {
 public:
  PartPlan(const Manifest& m, std::span<const ShardLayout> layouts, int file = 0);
  int part(int group, int kind, int64_t chunk) const {  // -1: the file holds no shard of the group
    return parts_[static_cast<size_t>(group)][static_cast<size_t>(kind)][static_cast<size_t>(chunk)];
  }
  // [group][kind][chunk]: 1 where the chunk is part `part`'s.
  std::vector<std::vector<std::vector<char>>> Mask(int part) const;
  // Part `part`'s bytes before compression, and what its data file takes at most: its chunks stored
  // raw, each 4 KiB-aligned.
  int64_t raw_bytes(int part) const { return raw_[static_cast<size_t>(part)]; }
  int64_t max_file_bytes(int part) const { return file_[static_cast<size_t>(part)]; }

 private:
  std::vector<std::vector<std::vector<int>>> parts_;  // [group][kind][chunk]
  std::vector<int64_t> raw_, file_;
};

std::string StepDirName(int64_t step);           // "step-00001200"
Result<int64_t> ParseStepDirName(std::string_view name);  // NotFound unless exactly step-<digits>
std::string DataFileName(int rank, int part = 0, int parts = 1);   // "rank-00003.data", "rank-00003.part-001.data"
std::string IndexFileName(int rank, int part = 0, int parts = 1);  // "rank-00003.index.json", "rank-00003.part-001.index.json"
inline constexpr std::string_view kManifestFile = "manifest.json";
inline constexpr std::string_view kLatestFile = "latest";

// The manifest of the checkpoint in `dir`, read beneath it (files.h) and checked (DecodeManifest);
// when the directory is named step-N, N must be the manifest's step.
Result<Manifest> ReadManifest(const std::string& dir);
// The manifest as the JSON object its file holds, without the checksum (what EncodeManifest seals;
// `zrt ckpt inspect --json` starts from it).
nlohmann::json ManifestJson(const Manifest& m);
std::string EncodeManifest(const Manifest& m);
// Parses and checks a manifest against every rule that needs no other file (sizes and their
// products, bounds, unique names, known state kinds, offsets as the layout gives them). `where`
// names the file in errors.
Result<Manifest> DecodeManifest(std::string_view text, const std::string& where);
std::string EncodeIndex(const RankIndex& r);
// Parses an index (its own fields only; ValidateIndex checks it against the manifest).
Result<RankIndex> DecodeIndex(std::string_view text, const std::string& where);
// The rules an index file of part `part` of file `rank` must meet against its manifest on its own
// (I1, I2, I4, I5): the same save, the data file's name, the shards it holds, every chunk of a group
// the file holds and inside its shard and its file, raw chunks exactly their elements, disjoint file
// ranges. `layouts` are SavedLayouts(m).
Status ValidateIndexFile(const Manifest& m, std::span<const ShardLayout> layouts, const RankIndex& r, int rank, int part,
                         const std::string& where);
// I3: the chunks of a file's parts (all m.parts of them) cover every (group, kind) of the groups it
// holds exactly once.
Status ValidateCover(const Manifest& m, std::span<const ShardLayout> layouts, std::span<const RankIndex> parts,
                     const std::string& where);
// Both, for a checkpoint of one part per shard.
Status ValidateIndex(const Manifest& m, std::span<const ShardLayout> layouts, const RankIndex& r, int rank,
                     const std::string& where);

namespace internal {
// Adds the "checksum" member to a JSON object and serialises it (what Encode* do); for tools and fuzzers.
std::string Seal(nlohmann::json j);
}  // namespace internal

// The layout a group had when saved (GroupShards ranks, the saved alignment); every group's.
Result<ShardLayout> SavedLayout(const Manifest& m, int group);
Result<std::vector<ShardLayout>> SavedLayouts(const Manifest& m);

}  // namespace zrt::ckpt
