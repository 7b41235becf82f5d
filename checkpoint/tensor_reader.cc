// TensorReader (tensor_reader.h): one tensor's range, through the chunk pipeline.
#include "zrt/checkpoint/tensor_reader.h"

#include <algorithm>
#include <map>

#include "zrt/checkpoint/chunk_source.h"

namespace zrt::ckpt {

using internal::ShardSource;

struct TensorReader::Impl {
  CheckpointDir cd;
  Manifest m;
  std::unique_ptr<IoEngine> io;
  std::unique_ptr<ShardSource> src;
  std::map<std::string, std::pair<int, int>> where;  // name -> (group, tensor)
};

TensorReader::TensorReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TensorReader::~TensorReader() = default;
const Manifest& TensorReader::manifest() const { return impl_->m; }
const std::string& TensorReader::dir() const { return impl_->cd.path(); }
const ShardLayout& TensorReader::layout(int group) const { return impl_->src->layout(group); }

Result<TensorReader::Stored> TensorReader::StoredBytes() {
  const Manifest& m = impl_->m;
  ASSIGN_OR_RETURN(const std::vector<ShardLayout> layouts, SavedLayouts(m));
  Stored out;
  for (int r = 0; r < m.shards; ++r) {
    ASSIGN_OR_RETURN(std::vector<RankIndex> parts, ReadShardIndexes(impl_->cd, m, layouts, r));
    for (const RankIndex& idx : parts) {
      out.chunks += static_cast<int64_t>(idx.chunks.size());
      for (const ChunkEntry& c : idx.chunks) {
        const GroupEntry& ge = m.groups[static_cast<size_t>(c.group)];
        const Precision as = ge.stored_as(static_cast<size_t>(c.kind));
        std::string key = ge.kinds[static_cast<size_t>(c.kind)];
        if (as != Precision::kF32) key += " (" + std::string(PrecisionName(as)) + ")";
        auto& [raw, stored] = out.bytes[key];
        raw += ge.format(static_cast<size_t>(c.kind)).Bytes(c.elements);
        stored += c.stored_bytes;
      }
    }
  }
  return out;
}

Result<std::unique_ptr<TensorReader>> TensorReader::Open(const std::string& dir) {
  auto impl = std::make_unique<Impl>();
  ASSIGN_OR_RETURN(impl->cd, CheckpointDir::Open(dir), "reading checkpoint");
  ASSIGN_OR_RETURN(impl->m, ReadManifest(impl->cd), "reading checkpoint");
  ASSIGN_OR_RETURN(std::vector<ShardLayout> saved, SavedLayouts(impl->m), "reading checkpoint");
  ASSIGN_OR_RETURN(impl->io, IoEngine::Create(IoOptions{}), "reading checkpoint");
  impl->src = std::make_unique<ShardSource>(impl->cd, impl->m, std::move(saved), *impl->io);
  for (int g = 0; g < static_cast<int>(impl->m.groups.size()); ++g) {
    for (int t = 0; t < static_cast<int>(impl->m.groups[static_cast<size_t>(g)].tensors.size()); ++t) {
      impl->where[impl->m.groups[static_cast<size_t>(g)].tensors[static_cast<size_t>(t)].name] = {g, t};
    }
  }
  return std::unique_ptr<TensorReader>(new TensorReader(std::move(impl)));
}

Result<std::pair<const GroupEntry*, const TensorEntry*>> TensorReader::Find(const std::string& name) const {
  auto w = impl_->where.find(name);
  if (w == impl_->where.end()) return NotFoundError("no tensor '", name, "' in ", impl_->cd.path());
  const GroupEntry& ge = impl_->m.groups[static_cast<size_t>(w->second.first)];
  return std::pair<const GroupEntry*, const TensorEntry*>{&ge, &ge.tensors[static_cast<size_t>(w->second.second)]};
}

Status TensorReader::ForEachPiece(const std::string& name, const std::string& kind, int64_t offset, int64_t count,
                                  const std::function<Status(int group, int kind, const ShardPiece&)>& fn) {
  ASSIGN_OR_RETURN(auto found, Find(name));
  const auto [g, t] = impl_->where.at(name);
  const GroupEntry& ge = *found.first;
  const auto k = std::find(ge.kinds.begin(), ge.kinds.end(), kind);
  if (k == ge.kinds.end()) return NotFoundError("tensor '", name, "' has no ", kind, " in ", impl_->cd.path());
  if (offset < 0 || count < 0 || offset > found.second->numel - count) {
    return InvalidArgumentError("tensor '", name, "': elements [", offset, ", ", offset + count, ") outside its ", found.second->numel);
  }
  for (const ShardPiece& op : impl_->src->layout(g).Locate(t, offset, offset + count)) {
    RETURN_IF_ERROR(fn(g, static_cast<int>(k - ge.kinds.begin()), op), "reading tensor '", name, "' (", kind, ") from ", impl_->cd.path());
  }
  return Status();
}

Status TensorReader::Read(const std::string& name, const std::string& kind, int64_t offset, int64_t count, float* out) {
  return ForEachPiece(name, kind, offset, count, [&](int g, int k, const ShardPiece& op) {
    return impl_->src->Read(op.rank, g, k, op.shard_offset, op.count, out + (op.tensor_offset - offset));
  });
}

Status TensorReader::Plan(const std::string& name, const std::string& kind, int64_t offset, int64_t count) {
  return ForEachPiece(name, kind, offset, count,
                      [&](int g, int k, const ShardPiece& op) { return impl_->src->Plan(op.rank, g, k, op.shard_offset, op.count); });
}

void TensorReader::StartReadAhead(int64_t window_bytes) { impl_->src->Start(window_bytes); }

}  // namespace zrt::ckpt
