// Whole groups of a checkpoint, for the tools (whole_group.h).
#include "zrt/checkpoint/whole_group.h"

#include "zrt/checkpoint/load.h"

namespace zrt::ckpt {

Result<StateGroup> GroupForShards(const Manifest& m, int group, int shards) {
  if (group < 0 || group >= static_cast<int>(m.groups.size())) return InvalidArgumentError("no group #", group);
  const GroupEntry& ge = m.groups[static_cast<size_t>(group)];
  StateGroup sg;
  sg.name = ge.name;
  sg.lr = ge.lr;
  sg.weight_decay = ge.weight_decay;
  std::vector<int64_t> numels;
  for (const TensorEntry& t : ge.tensors) {
    sg.tensors.push_back(TensorSpec{t.name, t.shape, t.dtype});
    numels.push_back(t.numel);
  }
  ASSIGN_OR_RETURN(sg.layout, ShardLayout::Create(numels, shards, ge.alignment), "group '", ge.name, "'");
  return sg;
}

Result<WholeGroup> LoadWholeGroup(const std::string& dir, const Manifest& m, int group, const std::vector<std::string>& kinds) {
  WholeGroup w;
  ASSIGN_OR_RETURN(StateGroup sg, GroupForShards(m, group, 1));
  w.data.resize(kinds.size());
  for (size_t k = 0; k < kinds.size(); ++k) {
    try {  // the size comes from the file: a hostile one may ask for more than the machine has
      w.data[k].resize(static_cast<size_t>(sg.layout.shard_size()));
    } catch (const std::exception&) {
      return OutOfMemoryError("group '", sg.name, "' of ", dir, ": no memory for ", sg.layout.shard_size(), " elements of ", kinds[k]);
    }
    sg.buffers.push_back({kinds[k], DType::kF32, w.data[k].data(), sg.layout.shard_size()});
  }
  w.view.groups.push_back(std::move(sg));
  LoadOptions o;
  o.strict = false;  // one group of the checkpoint: the others are expected to be "missing" from the view
  o.read_ahead_bytes = 0;  // the tools' memory bound: the whole group is already held
  RETURN_IF_ERROR(Load(dir, w.view, o).status());
  return w;
}

}  // namespace zrt::ckpt
