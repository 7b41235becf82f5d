// CheckComplete: the rules of docs/checkpoint-format.md ("Rules"), each problem named. Metadata level:
// the manifest and every index decoded and checked against each other (files.h), the data files'
// sizes. Full level: every chunk read back, checksummed and decoded, and the padding between chunks
// zero. Every loop is bounded by what is in the directory, not by what a file claims.
#include "zrt/checkpoint/catalog.h"

#include <filesystem>
#include <functional>

#include <algorithm>
#include <memory>
#include <map>
#include <set>

#include "zrt/checkpoint/files.h"

namespace zrt::ckpt {

namespace {

// An index file's name: rank-NNNNN.index.json (part -1) or rank-NNNNN.part-PPP.index.json.
struct IndexName {
  int rank = 0, part = -1;
  auto operator<=>(const IndexName&) const = default;
};

// The index files present, by the shard and part their names give.
std::set<IndexName> IndexFilesPresent(const std::vector<std::string>& names) {
  std::set<IndexName> out;
  constexpr std::string_view kPrefix = "rank-", kSuffix = ".index.json", kPart = ".part-";
  auto number = [](std::string_view digits) {
    return digits.empty() || digits.size() > 7 || digits.find_first_not_of("0123456789") != std::string_view::npos
               ? -1 : std::stoi(std::string(digits));
  };
  for (const std::string& n : names) {
    if (!n.starts_with(kPrefix) || !n.ends_with(kSuffix)) continue;
    std::string_view mid = std::string_view(n).substr(kPrefix.size(), n.size() - kPrefix.size() - kSuffix.size());
    const size_t dot = mid.find(kPart);
    const int r = number(mid.substr(0, dot));
    const int p = dot == std::string_view::npos ? -1 : number(mid.substr(dot + kPart.size()));
    if (r < 0 || (dot != std::string_view::npos && p < 0)) continue;
    if (n == (p < 0 ? IndexFileName(r) : IndexFileName(r, p, kMaxParts))) out.insert({r, p});
  }
  return out;
}

// Full level for one shard: padding zero, every chunk's checksum and decoding.
void CheckChunks(IoEngine& io, const IoFile& f, const Manifest& m, const std::vector<ShardLayout>& layouts, const RankIndex& idx,
                 std::vector<std::string>* problems, const std::function<void(int64_t)>& checked) {
  std::vector<std::pair<int64_t, int64_t>> spans;
  for (const ChunkEntry& c : idx.chunks) spans.push_back({c.file_offset, c.file_offset + c.stored_bytes});
  std::sort(spans.begin(), spans.end());
  int64_t at = 0;
  std::vector<char> gap;
  auto check_gap = [&](int64_t b, int64_t e) {
    if (b >= e) return;
    gap.assign(static_cast<size_t>(std::min<int64_t>(e - b, int64_t{1} << 20)), 0);
    for (int64_t p = b; p < e; p += static_cast<int64_t>(gap.size())) {
      const auto n = static_cast<size_t>(std::min<int64_t>(e - p, static_cast<int64_t>(gap.size())));
      Status rs = io.ReadSync(f, gap.data(), n, p);
      if (!rs.ok() || std::any_of(gap.begin(), gap.begin() + static_cast<std::ptrdiff_t>(n), [](char c) { return c != 0; })) {
        problems->push_back(::zrt::internal::StrCat(idx.data_file, ": padding bytes ", b, "..", e, " between chunks are not zero (corrupt)"));
        return;
      }
    }
  };
  for (const auto& [b, e] : spans) {
    check_gap(at, b);
    at = std::max(at, e);
  }
  check_gap(at, idx.data_bytes);
  std::vector<float> chunk;
  std::vector<char> scratch;
  int64_t bytes = 0;
  for (size_t k = 0; k < idx.chunks.size(); ++k) {
    Status s = ReadChunk(io, f, m, layouts[static_cast<size_t>(idx.chunks[k].group)], idx, k, &chunk, &scratch, &bytes);
    if (!s.ok()) problems->push_back(std::string(s.message()));
    checked(idx.chunks[k].stored_bytes);
  }
}

}  // namespace

Status CheckComplete(const std::string& dir_path, VerifyLevel level, std::vector<std::string>* problems, const ProgressFn& progress) {
  auto opened = CheckpointDir::Open(dir_path);
  if (!opened.ok()) {
    if (opened.status().code() == StatusCode::kNotFound) return NotFoundError(dir_path, ": not a directory");
    problems->push_back(std::string(opened.status().message()));
    return Status();
  }
  const CheckpointDir& dir = *opened;
  auto m = ReadManifest(dir);
  if (!m.ok()) {
    problems->push_back(std::string(m.status().message()));
    return Status();
  }
  ASSIGN_OR_RETURN(const std::vector<std::string> names, dir.List());
  ASSIGN_OR_RETURN(const std::vector<ShardLayout> layouts, SavedLayouts(*m));
  // Only full verification reads data: the engine (a ring and a thread) is made for that alone, and
  // a failure to make it is an error, not a silently skipped check.
  std::unique_ptr<IoEngine> io;
  if (level == VerifyLevel::kFull) {
    ASSIGN_OR_RETURN(io, IoEngine::Create(IoOptions{}), "verifying ", dir_path);
  }
  // Bounded by the files present: a manifest claiming a billion shards costs one listing.
  const std::set<IndexName> present = IndexFilesPresent(names);
  const bool spread = m->parts > 1;
  std::map<int, int> parts_present;  // shard -> its part indexes present
  for (const IndexName& f : present) {
    const std::string name = f.part < 0 ? IndexFileName(f.rank) : IndexFileName(f.rank, f.part, kMaxParts);
    if (f.rank >= m->shards) {
      problems->push_back(name + ": shard " + std::to_string(f.rank) + " is not in the manifest (" + std::to_string(m->shards) + " shards)");
    } else if ((f.part >= 0) != spread || f.part >= m->parts) {
      problems->push_back(name + ": not a part of the manifest's shards (" + std::to_string(m->parts) + " part(s) each)");
    } else {
      ++parts_present[f.rank];
    }
  }
  // Progress by bytes: the data files' sizes are the total (a listing, no reads).
  int64_t total = 0, done = 0;
  if (progress && io) {
    for (const auto& [r, n] : parts_present) {
      for (int p = 0; p < m->parts; ++p) {
        std::error_code ec;
        const auto bytes = std::filesystem::file_size(dir.PathOf(DataFileName(r, p, m->parts)), ec);
        if (!ec) total += static_cast<int64_t>(bytes);
      }
    }
  }
  auto checked = [&](int64_t bytes) {
    if (progress && total > 0) progress(std::min(done += bytes, total), total);
  };
  int missing = 0;
  for (int r = 0; r < m->shards; ++r) {
    const auto have = parts_present.find(r);
    if (have == parts_present.end() || have->second != m->parts) {
      for (int p = 0; p < m->parts; ++p) {
        const std::string name = IndexFileName(r, p, m->parts);
        if (!present.contains({r, spread ? p : -1}) && ++missing <= 3) {
          problems->push_back(name + ": missing (shard " + std::to_string(r) + (spread ? " part " + std::to_string(p) : "") + " did not finish)");
        }
      }
      if (missing > static_cast<int>(present.size()) + 3) break;  // the rest are missing too: not worth a loop
      continue;
    }
    auto parts = ReadShardIndexes(dir, *m, layouts, r);
    if (!parts.ok()) {
      problems->push_back(std::string(parts.status().message()));
      continue;
    }
    for (const RankIndex& idx : *parts) {
      auto f = dir.OpenData(idx.data_file, idx.data_bytes);
      if (!f.ok()) {
        problems->push_back(std::string(f.status().message()));
        continue;
      }
      if (io) CheckChunks(*io, *f, *m, layouts, idx, problems, checked);
    }
  }
  if (missing > 3) problems->push_back(std::to_string(missing - 3) + " more index files missing");
  if (progress && total > 0 && done < total) progress(total, total);  // chunks missing or unreadable: the bar ends
  return Status();
}

}  // namespace zrt::ckpt
