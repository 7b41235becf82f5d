#include "zrt/checkpoint/interchange/interchange.h"

#include <algorithm>
#include <mutex>
#include <ctime>
#include <filesystem>

#include "zrt/checkpoint/commit.h"
#include "zrt/checkpoint/interchange/import_full.h"
#include "zrt/checkpoint/tensor_reader.h"
#include "zrt/checkpoint/files.h"
#include "zrt/checkpoint/load.h"
#include "zrt/checkpoint/shard_writer.h"
#include "zrt/checkpoint/catalog.h"
#include "zrt/checkpoint/whole_group.h"
#include "zrt/core/device.h"
#include "zrt/core/thread_pool.h"

namespace zrt::ckpt {

Status PlanReshard(const Manifest& m, int new_shards, const std::function<void(const ReshardRead&)>& visit) {
  if (new_shards < 1) return InvalidArgumentError("reshard plan: new shard count must be >= 1, got ", new_shards);
  for (int g = 0; g < static_cast<int>(m.groups.size()); ++g) {
    ASSIGN_OR_RETURN(ShardLayout old_l, SavedLayout(m, g));
    std::vector<int64_t> numels;
    for (const TensorEntry& t : m.groups[static_cast<size_t>(g)].tensors) numels.push_back(t.numel);
    ASSIGN_OR_RETURN(ShardLayout new_l, ShardLayout::Create(numels, new_shards, old_l.alignment()));
    // Only real elements need reading: [0, end of the last tensor) in flat coordinates.
    const int64_t end = numels.empty() ? 0 : new_l.tensor_offset(new_l.num_tensors() - 1) + numels.back();
    int old_r = 0;
    for (int r = 0; r < new_shards; ++r) {
      const int64_t b = new_l.shard_begin(r), e = std::min(new_l.shard_end(r), end);
      if (b >= e) break;
      while (old_l.shard_end(old_r) <= b) ++old_r;
      for (int o = old_r; o < old_l.world_size() && old_l.shard_begin(o) < e; ++o) {
        const int64_t lo = std::max(b, old_l.shard_begin(o)), hi = std::min(e, old_l.shard_end(o));
        visit(ReshardRead{r, o, g, lo - b, lo - old_l.shard_begin(o), hi - lo});
      }
    }
  }
  return Status();
}

Result<std::string> Reshard(const std::string& dir, const std::string& out_root, const ReshardOptions& o) {
  if (o.world_size < 1) return InvalidArgumentError("reshard: world size must be >= 1, got ", o.world_size);
  if (o.stage > 3) return InvalidArgumentError("reshard: stage must be 0..3, got ", o.stage);
  if (o.threads < 1) return InvalidArgumentError("reshard: threads must be >= 1, got ", o.threads);
  ASSIGN_OR_RETURN(Manifest m, ReadManifest(dir), "reshard");
  std::vector<std::string> problems;
  RETURN_IF_ERROR(CheckComplete(dir, VerifyLevel::kMetadata, &problems));
  if (!problems.empty()) return DataLossError("reshard: ", dir, " is not complete: ", problems.front());
  Manifest nm = m;
  nm.nonce = NewNonce();
  nm.world_size = o.world_size;
  if (o.stage >= 0) nm.stage = o.stage;
  nm.shards = nm.stage == 0 ? 1 : o.world_size;
  nm.parts = 1;
  // Groups saved over meshes of their own (experts) come out over the new mesh like the others: a
  // resume finds every tensor by name, whichever mesh its model puts it on.
  for (GroupEntry& ge : nm.groups) ge.files.clear();
  nm.created_unix = static_cast<int64_t>(std::time(nullptr));
  const SaveDir save = SaveDirFor(out_root, m.step, nm.nonce);
  if (std::filesystem::exists(save.final)) return AlreadyExistsError("reshard: ", save.final, " exists");
  RETURN_IF_ERROR(BeginSave(save), "reshard");
  ASSIGN_OR_RETURN(auto io, IoEngine::Create(IoOptions{}), "reshard");
  // Each new shard streamed chunk by chunk: each chunk's pieces pulled from the old shards that hold
  // them (only the overlapping chunks are read, each checked). Memory: a few chunks per thread.
  std::vector<ShardLayout> layouts;
  for (int g = 0; g < static_cast<int>(m.groups.size()); ++g) {
    ASSIGN_OR_RETURN(StateGroup sg, GroupForShards(m, g, nm.shards));
    layouts.push_back(std::move(sg.layout));
  }
  // Progress in bytes written, from every thread (one caller at a time).
  int64_t total = 0, done = 0;
  for (const GroupEntry& ge : m.groups) {
    for (const TensorEntry& te : ge.tensors) total += te.numel * 4 * static_cast<int64_t>(ge.kinds.size());
  }
  std::mutex progress_mu;
  auto one_shard = [&](int r) -> Status {
    ASSIGN_OR_RETURN(std::unique_ptr<TensorReader> reader, TensorReader::Open(dir));
    const PieceRead pull = [&](size_t g, size_t k, int64_t t, int64_t offset, int64_t count, float* out) -> Status {
      const GroupEntry& ge = m.groups[g];
      RETURN_IF_ERROR(reader->Read(ge.tensors[static_cast<size_t>(t)].name, ge.kinds[k], offset, count, out));
      if (o.progress) {  // padding is not pulled: the total counts real elements only
        std::lock_guard lock(progress_mu);
        o.progress(done += count * 4, total);
      }
      return Status();
    };
    return WritePulledShard(*io, save.tmp, nm, layouts, r, pull);
  };
  std::vector<Status> results(static_cast<size_t>(nm.shards));
  {
    ThreadPool pool(std::min(o.threads, nm.shards) - 1, "zrt-reshard");
    pool.ParallelFor(nm.shards, [&](int64_t r) { results[static_cast<size_t>(r)] = one_shard(static_cast<int>(r)); });
  }
  Status local;
  for (const Status& s : results) {
    if (!s.ok()) {
      local = s;
      break;
    }
  }
  if (local.ok()) local = PublishFile(*io, save.tmp, kManifestFile, EncodeManifest(nm));
  RETURN_IF_ERROR(Commit(nullptr, local, save, Retention{}, *io), "reshard");
  return save.final;
}

}  // namespace zrt::ckpt
