#include "zrt/checkpoint/interchange/import_full.h"

#include <algorithm>
#include <ctime>
#include <filesystem>
#include <map>

#include "zrt/checkpoint/commit.h"
#include "zrt/checkpoint/shard_writer.h"

namespace zrt::ckpt {

namespace {

// A shard whose buffers are pulled from elsewhere piece by piece: WriteShard reads it a chunk at a
// time through the view. Nothing else of an owner is asked of it.
class PulledShard final : public StateOwner {
 public:
  PulledShard(const std::vector<ShardLayout>& layouts, int shard, const PieceRead& read) : layouts_(layouts), shard_(shard), read_(read) {}
  Status Read(int group, int buffer, int64_t offset, int64_t n, float* out) override {
    std::fill_n(out, n, 0.0f);  // padding between tensors reads as zero
    for (const ShardPiece& p : layouts_[static_cast<size_t>(group)].RankPieces(shard_)) {
      const int64_t lo = std::max(offset, p.shard_offset), hi = std::min(offset + n, p.shard_offset + p.count);
      if (lo >= hi) continue;
      RETURN_IF_ERROR(read_(static_cast<size_t>(group), static_cast<size_t>(buffer), p.tensor, p.tensor_offset + (lo - p.shard_offset), hi - lo,
                            out + (lo - offset)));
    }
    return Status();
  }
  Status Capture(std::shared_ptr<StateSink>) override { return FailedPreconditionError("a pulled shard is read, not captured"); }
  Status Settle() override { return Status(); }
  Status Write(int, int, int64_t, int64_t, const float*) override { return FailedPreconditionError("a pulled shard is read only"); }
  Status Restore(const StateCounters&) override { return Status(); }

 private:
  const std::vector<ShardLayout>& layouts_;
  const int shard_;
  const PieceRead& read_;
};

}  // namespace

Status WritePulledShard(IoEngine& io, const std::string& dir, const Manifest& m, const std::vector<ShardLayout>& layouts, int shard,
                        const PieceRead& read) {
  PulledShard owner(layouts, shard, read);
  StateView view;
  view.owner = &owner;
  for (size_t g = 0; g < m.groups.size(); ++g) {
    StateGroup& sg = view.groups.emplace_back();
    sg.name = m.groups[g].name;
    for (const std::string& kind : m.groups[g].kinds) sg.buffers.push_back({kind, DType::kF32, nullptr, layouts[g].shard_size()});
  }
  return WriteShard(io, dir, m, shard, view);
}

Status WriteCheckpointFromFull(const std::string& out_root, const std::vector<FullTensor>& tensors,
                               const std::map<std::string, std::vector<std::string>>& kinds, Manifest m, const FullTensorRead& read,
                               const ImportOptions& o, const ProgressFn& progress) {
  if (o.world_size < 1) return InvalidArgumentError("import: --world-size must be >= 1");
  if (o.stage < 0 || o.stage > 3) return InvalidArgumentError("import: --stage must be 0..3");
  if (tensors.empty()) return InvalidArgumentError("import: no tensors");
  m.nonce = NewNonce();
  m.world_size = o.world_size;
  m.shards = o.stage == 0 ? 1 : o.world_size;
  m.stage = o.stage;
  if (m.zrt_version.empty()) m.zrt_version = "import";
  m.created_unix = static_cast<int64_t>(std::time(nullptr));
  m.groups.clear();
  std::map<std::string, int> gindex;
  std::vector<std::vector<size_t>> members;  // per group: indices into `tensors`
  for (size_t i = 0; i < tensors.size(); ++i) {
    const FullTensor& t = tensors[i];
    auto [it, fresh] = gindex.try_emplace(t.group, static_cast<int>(m.groups.size()));
    if (fresh) {
      auto k = kinds.find(t.group);
      m.groups.push_back({t.group, t.lr, t.weight_decay, o.alignment, {}, k == kinds.end() ? std::vector<std::string>{"master"} : k->second});
      members.emplace_back();
    }
    TensorSpec spec{t.name, t.shape, t.model_dtype};
    RETURN_IF_ERROR(Validate(spec), "import");
    m.groups[static_cast<size_t>(it->second)].tensors.push_back({t.name, t.shape, t.model_dtype, 0, spec.numel()});
    members[static_cast<size_t>(it->second)].push_back(i);
  }
  std::vector<ShardLayout> layouts;
  int64_t total = 0;
  for (GroupEntry& ge : m.groups) {
    std::vector<int64_t> numels;
    for (const TensorEntry& te : ge.tensors) numels.push_back(te.numel);
    ASSIGN_OR_RETURN(ShardLayout l, ShardLayout::Create(numels, m.shards, ge.alignment), "import");
    for (size_t t = 0; t < ge.tensors.size(); ++t) ge.tensors[t].offset = l.tensor_offset(static_cast<int64_t>(t));
    for (const TensorEntry& te : ge.tensors) total += te.numel * 4 * static_cast<int64_t>(ge.kinds.size());
    layouts.push_back(std::move(l));
  }
  const SaveDir save = SaveDirFor(out_root, m.step, m.nonce);
  if (std::filesystem::exists(save.final)) return AlreadyExistsError("import: ", save.final, " exists");
  RETURN_IF_ERROR(BeginSave(save), "import");
  ASSIGN_OR_RETURN(auto io, IoEngine::Create(IoOptions{}), "import");
  int64_t done = 0;
  auto write_shards = [&]() -> Status {
    const PieceRead pull = [&](size_t g, size_t k, int64_t t, int64_t offset, int64_t count, float* out) -> Status {
      RETURN_IF_ERROR(read(members[g][static_cast<size_t>(t)], m.groups[g].kinds[k], offset, count, out));
      if (progress) progress(done += count * 4, total);
      return Status();
    };
    for (int r = 0; r < m.shards; ++r) RETURN_IF_ERROR(WritePulledShard(*io, save.tmp, m, layouts, r, pull));
    return PublishFile(*io, save.tmp, kManifestFile, EncodeManifest(m));
  };
  return Commit(nullptr, write_shards(), save, Retention{}, *io).WithContext("import");
}

}  // namespace zrt::ckpt
