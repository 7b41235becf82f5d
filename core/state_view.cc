// StateView's entry points: the owner's, or the resident buffers directly when there is none.
#include "zrt/core/state_view.h"

#include <algorithm>

#include <cstring>
#include <vector>

#include "zrt/core/dtype.h"

namespace zrt {

namespace {

// The resident buffer (group, buffer) and the range [offset, offset + n) checked against it.
Result<const StateBuffer*> Resident(const StateView& v, int group, int buffer, int64_t offset, int64_t n) {
  if (group < 0 || static_cast<size_t>(group) >= v.groups.size() || buffer < 0 ||
      static_cast<size_t>(buffer) >= v.groups[static_cast<size_t>(group)].buffers.size()) {
    return InvalidArgumentError("state view: no buffer ", buffer, " in group ", group);
  }
  const StateBuffer& b = v.groups[static_cast<size_t>(group)].buffers[static_cast<size_t>(buffer)];
  if (offset < 0 || n < 0 || offset > b.count - n) {
    return InvalidArgumentError("state view: elements [", offset, ", ", offset + n, ") of ", b.kind, " of group '",
                                v.groups[static_cast<size_t>(group)].name, "' outside its ", b.count);
  }
  if (!b.resident()) {
    return FailedPreconditionError("state view: ", b.kind, " of group '", v.groups[static_cast<size_t>(group)].name,
                                   "' is not resident and the view has no owner to reach it");
  }
  return &b;
}

}  // namespace

Status StateView::Capture(std::shared_ptr<StateSink> sink) const {
  if (sink == nullptr) return InvalidArgumentError("state view: capture into a null sink");
  if (owner != nullptr) return owner->Capture(std::move(sink));
  Status s;
  for (size_t g = 0; g < groups.size() && s.ok(); ++g) {
    for (size_t b = 0; b < groups[g].buffers.size() && s.ok(); ++b) {
      const StateBuffer& buf = groups[g].buffers[b];
      if (!buf.resident()) {
        s = FailedPreconditionError("state view: ", buf.kind, " of group '", groups[g].name, "' is not resident and the view has no owner");
      } else if (buf.count > 0) {
        s = sink->Put(static_cast<int>(g), static_cast<int>(b), 0, buf.count, static_cast<const float*>(buf.data));
      }
    }
  }
  sink->Close(s);
  return Status();  // the outcome is the sink's (Close), as with an owner
}

Status StateView::Settle() const { return owner != nullptr ? owner->Settle() : Status(); }

Status StateView::Read(int group, int buffer, int64_t offset, int64_t n, float* out) const {
  if (owner != nullptr) return owner->Read(group, buffer, offset, n, out);
  ASSIGN_OR_RETURN(const StateBuffer* b, Resident(*this, group, buffer, offset, n));
  if (n > 0) std::memcpy(out, static_cast<const float*>(b->data) + offset, static_cast<size_t>(n) * 4);
  return Status();
}

Status StateView::Write(int group, int buffer, int64_t offset, int64_t n, const float* in) const {
  if (owner != nullptr) return owner->Write(group, buffer, offset, n, in);
  ASSIGN_OR_RETURN(const StateBuffer* b, Resident(*this, group, buffer, offset, n));
  if (n > 0) std::memcpy(static_cast<float*>(b->data) + offset, in, static_cast<size_t>(n) * 4);
  return Status();
}

Status StateSink::PutStored(int group, int buffer, int64_t offset, int64_t n, const StateFormat& format, const void* values,
                            const float* scales) {
  if (!format.compact() || (format.precision == Precision::kQ8 && format.block <= 0)) {
    return InvalidArgumentError("state sink: a part stored as ", PrecisionName(format.precision), " in blocks of ", format.block);
  }
  thread_local std::vector<float> decoded;
  decoded.resize(static_cast<size_t>(n));
  format.Decode(values, scales, 0, n, decoded.data());
  return Put(group, buffer, offset, n, decoded.data());
}

Status StateView::WriteStored(int group, int buffer, int64_t offset, int64_t n, const void* values, const float* scales) const {
  if (owner != nullptr) return owner->WriteStored(group, buffer, offset, n, values, scales);
  return UnavailableError("a view without an owner holds f32 values only");
}

Result<std::optional<StoredPart>> StateView::StoredMemory(int group, int buffer) const {
  if (owner != nullptr) return owner->StoredMemory(group, buffer);
  return std::optional<StoredPart>();
}

Status StateView::Restore(const StateCounters& saved) const { return owner != nullptr ? owner->Restore(saved) : Status(); }

bool StateView::has_own_groups() const {
  return std::any_of(groups.begin(), groups.end(), [](const StateGroup& g) { return !g.own_group.empty(); });
}

int StateView::ShardOf(const StateGroup& g) const {
  if (g.layout.world_size() == 1) return 0;
  if (g.own_group.empty()) return rank;
  const auto it = std::find(g.own_group.begin(), g.own_group.end(), rank);
  return it == g.own_group.end() ? -1 : static_cast<int>(it - g.own_group.begin());
}

Status StateView::CheckOneMesh(std::string_view what) const {
  for (const StateGroup& g : groups) {
    if (g.own_group.empty()) continue;
    return FailedPreconditionError(what, ": group '", g.name, "' is sharded over a data-parallel group of its own (", g.own_group.size(),
                                   " ranks: ParamOptions::data_parallel), which this path does not take yet (disk checkpoints do)");
  }
  return Status();
}

}  // namespace zrt
