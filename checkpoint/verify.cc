#include "zrt/checkpoint/verify.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>

#include "zrt/checkpoint/files.h"

namespace zrt::ckpt {

namespace fs = std::filesystem;

Status CheckComplete(const std::string& dir, VerifyLevel level, std::vector<std::string>* problems) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return NotFoundError(dir, ": not a directory");
  auto m = ReadManifest(dir);
  if (!m.ok()) {
    problems->push_back(std::string(m.status().message()));
    return Status();
  }
  std::vector<ShardLayout> layouts;
  for (int g = 0; g < static_cast<int>(m->groups.size()); ++g) {
    auto l = SavedLayout(*m, g);
    if (!l.ok()) {
      problems->push_back(std::string(l.status().message()));
      return Status();
    }
    layouts.push_back(std::move(*l));
  }
  // Only full verification reads data: the engine (a ring and a thread) is made for that alone, and
  // a failure to make it is an error, not a silently skipped check.
  std::unique_ptr<IoEngine> io;
  if (level == VerifyLevel::kFull) {
    ASSIGN_OR_RETURN(io, IoEngine::Create(IoOptions{}), "verifying ", dir);
  }
  for (int r = 0; r < m->shards; ++r) {
    auto idx = ReadIndex(dir, r);
    if (!idx.ok()) {
      problems->push_back(idx.status().code() == StatusCode::kNotFound
                              ? IndexFileName(r) + ": missing (rank " + std::to_string(r) + " did not finish)"
                              : std::string(idx.status().message()));
      continue;
    }
    if (idx->nonce != m->nonce || idx->step != m->step || idx->shards != m->shards) {
      problems->push_back(IndexFileName(r) + ": belongs to another save (nonce/step/shards disagree with the manifest)");
      continue;
    }
    const std::string data = dir + "/" + idx->data_file;
    const auto size = fs::file_size(data, ec);
    if (ec) {
      problems->push_back(idx->data_file + ": missing");
      continue;
    }
    if (static_cast<int64_t>(size) != idx->data_bytes) {
      problems->push_back(::zrt::internal::StrCat(idx->data_file, ": ", size, " bytes, the index says ", idx->data_bytes, " (truncated?)"));
      continue;
    }
    // Every (group, kind) shard is covered exactly once by its chunks.
    std::map<std::pair<int, int>, std::vector<std::pair<int64_t, int64_t>>> cover;
    for (const ChunkEntry& c : idx->chunks) cover[{c.group, c.kind}].push_back({c.elem_offset, c.elements});
    for (int g = 0; g < static_cast<int>(m->groups.size()); ++g) {
      for (int k = 0; k < static_cast<int>(m->groups[static_cast<size_t>(g)].kinds.size()); ++k) {
        auto& v = cover[{g, k}];
        std::sort(v.begin(), v.end());
        int64_t at = 0;
        for (const auto& [off, n] : v) {
          if (off != at) break;
          at += n;
        }
        if (at != layouts[static_cast<size_t>(g)].shard_size()) {
          problems->push_back(::zrt::internal::StrCat(IndexFileName(r), ": group '", m->groups[static_cast<size_t>(g)].name, "' ",
                                               m->groups[static_cast<size_t>(g)].kinds[static_cast<size_t>(k)],
                                               " is not covered by its chunks"));
        }
      }
    }
    if (io) {
      auto f = IoFile::Open(data, IoFile::Mode::kRead);
      if (!f.ok()) {
        problems->push_back(std::string(f.status().message()));
        continue;
      }
      std::vector<float> chunk;
      std::vector<char> scratch;
      int64_t bytes = 0;
      // The alignment padding between chunks is covered too: it must read as zeros.
      std::vector<std::pair<int64_t, int64_t>> spans;
      for (const ChunkEntry& c : idx->chunks) spans.push_back({c.file_offset, c.file_offset + c.stored_bytes});
      std::sort(spans.begin(), spans.end());
      int64_t at = 0;
      for (const auto& [b, e] : spans) {
        if (b > at) {
          std::vector<char> gap(static_cast<size_t>(b - at));
          Status rs = io->ReadSync(*f, gap.data(), gap.size(), at);
          if (!rs.ok() || std::any_of(gap.begin(), gap.end(), [](char c) { return c != 0; })) {
            problems->push_back(::zrt::internal::StrCat(idx->data_file, ": padding bytes ", at, "..", b,
                                                 " between chunks are not zero (corrupt)"));
          }
        }
        at = std::max(at, e);
      }
      for (size_t k = 0; k < idx->chunks.size(); ++k) {
        const int g = idx->chunks[k].group;
        if (g < 0 || g >= static_cast<int>(layouts.size())) {
          problems->push_back(::zrt::internal::StrCat(idx->data_file, " chunk ", k, ": unknown group ", g));
          continue;
        }
        Status s = ReadChunk(*io, *f, *m, layouts[static_cast<size_t>(g)], *idx, k, &chunk, &scratch, &bytes);
        if (!s.ok()) problems->push_back(std::string(s.message()));
      }
    }
  }
  return Status();
}

}  // namespace zrt::ckpt
