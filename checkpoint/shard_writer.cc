#include "zrt/checkpoint/shard_writer.h"

#include <ctime>
#include <deque>

#include "zrt/checkpoint/fs_util.h"
#include "zrt/core/device.h"
#include "zrt/core/version.h"

namespace zrt::ckpt {

Result<Manifest> ManifestFor(const StateView& state, const nlohmann::json& trainer_state, int64_t chunk_elements,
                             const std::string& nonce) {
  Manifest m;
  m.nonce = nonce;
  m.step = state.counters.step;
  m.world_size = state.world_size;
  m.stage = state.stage;
  m.zrt_version = std::string(Version());
  m.created_unix = static_cast<int64_t>(std::time(nullptr));
  m.chunk_elements = chunk_elements;
  m.loss_scale = state.counters.loss_scale;
  m.scaler_good_steps = state.counters.scaler_good_steps;
  m.scaler_hysteresis_left = state.counters.scaler_hysteresis_left;
  m.engine_state = nlohmann::json::parse(state.counters.engine_state, nullptr, false);
  if (!m.engine_state.is_object()) return InvalidArgumentError("checkpoint: the engine state is not a JSON object");
  m.trainer_state = trainer_state;
  m.shards = state.groups.empty() ? state.world_size : state.groups[0].layout.world_size();
  for (const StateGroup& g : state.groups) {
    if (g.layout.world_size() != m.shards) return InvalidArgumentError("checkpoint: groups sharded over different world sizes");
    GroupEntry ge;
    ge.name = g.name;
    ge.lr = g.lr;
    ge.weight_decay = g.weight_decay;
    ge.alignment = g.layout.alignment();
    for (size_t t = 0; t < g.tensors.size(); ++t) {
      ge.tensors.push_back({g.tensors[t].name, g.tensors[t].shape, g.tensors[t].dtype,
                            g.layout.tensor_offset(static_cast<int64_t>(t)), g.tensors[t].numel()});
    }
    for (const StateBuffer& b : g.buffers) {
      if (b.dtype != DType::kF32) return InvalidArgumentError("checkpoint: state '", b.kind, "' must be f32");
      ge.kinds.push_back(b.kind);
    }
    m.groups.push_back(std::move(ge));
  }
  return m;
}

Status WriteShard(IoEngine& io, const std::string& dir, const Manifest& m, int rank, const ShardState& state,
                  const CompressOptions& compression, ShardWriteStats* stats) {
  constexpr int64_t kAlign = static_cast<int64_t>(kIoAlignment);
  if (state.size() != m.groups.size()) {
    return InvalidArgumentError("shard ", rank, ": ", state.size(), " groups of state for a manifest of ", m.groups.size());
  }
  for (size_t g = 0; g < state.size(); ++g) {
    if (state[g].size() != m.groups[g].kinds.size()) {
      return InvalidArgumentError("shard ", rank, ", group '", m.groups[g].name, "': ", state[g].size(), " state buffers for ",
                                  m.groups[g].kinds.size(), " kinds");
    }
    for (const StateBuffer& b : state[g]) {
      if (b.dtype != DType::kF32) return InvalidArgumentError("shard ", rank, ": state '", b.kind, "' must be f32");
    }
  }
  RankIndex index;
  index.nonce = m.nonce;
  index.step = m.step;
  index.rank = rank;
  index.shards = m.shards;
  index.data_file = DataFileName(rank);
  const std::string tmp = dir + "/" + index.data_file + ".tmp";
  ASSIGN_OR_RETURN(IoFile f, IoFile::Open(tmp, IoFile::Mode::kCreate));
  CpuDevice host;  // before every buffer it hands out: destroyed after them
  // Compressed chunks need their own buffers until written: a bounded window stays in flight.
  struct InFlight {
    IoHandle handle;
    std::vector<char> buf;
    DeviceBuffer raw;  // a chunk read from non-resident state
  };
  std::deque<InFlight> window;
  std::vector<char> scratch;
  std::vector<DeviceBuffer> spare;  // chunk buffers for non-resident state, reused once written
  int64_t file_off = 0;
  auto drain = [&](size_t keep) -> Status {
    while (window.size() > keep) {
      Status s = window.front().handle.Wait();
      if (!window.front().raw.empty()) spare.push_back(std::move(window.front().raw));
      window.pop_front();
      if (!s.ok()) {
        while (!window.empty()) {  // nothing may be freed while the engine still uses it
          (void)window.front().handle.Wait();
          window.pop_front();
        }
        return s;
      }
    }
    return Status();
  };
  auto write_all = [&]() -> Status {
    for (size_t g = 0; g < state.size(); ++g) {
      for (size_t k = 0; k < state[g].size(); ++k) {
        const StateBuffer& p = state[g][k];
        for (int64_t e = 0; e < p.count; e += m.chunk_elements) {
          const int64_t n = std::min(m.chunk_elements, p.count - e);
          const size_t raw_bytes = static_cast<size_t>(n) * 4;
          InFlight w;
          const char* raw = p.data == nullptr ? nullptr : static_cast<const char*>(p.data) + static_cast<size_t>(e) * 4;
          if (raw == nullptr) {
            if (!p.read) return InvalidArgumentError("state '", p.kind, "' of group '", m.groups[g].name, "' has neither data nor a read function");
            if (spare.empty()) {
              ASSIGN_OR_RETURN(w.raw, host.Allocate(static_cast<size_t>(m.chunk_elements) * 4, MemCategory::kStaging, kIoAlignment));
            } else {
              w.raw = std::move(spare.back());
              spare.pop_back();
            }
            RETURN_IF_ERROR(p.read(e, n, w.raw.data()), "reading state '", p.kind, "' of group '", m.groups[g].name, "' at element ", e);
            raw = w.raw.as<char>();
          }
          ASSIGN_OR_RETURN(Codec codec, EncodeChunk(raw, raw_bytes, 4, compression, &scratch, &w.buf));
          const char* stored = codec == Codec::kRaw ? raw : w.buf.data();
          const size_t stored_bytes = codec == Codec::kRaw ? raw_bytes : w.buf.size();
          if (codec == Codec::kRaw) file_off = (file_off + kAlign - 1) / kAlign * kAlign;  // raw chunks stay O_DIRECT-able
          index.chunks.push_back(ChunkEntry{static_cast<int>(g), static_cast<int>(k), e, n, file_off,
                                            static_cast<int64_t>(stored_bytes), codec, Checksum(stored, stored_bytes)});
          ASSIGN_OR_RETURN(w.handle, io.Write(f, stored, stored_bytes, file_off));
          window.push_back(std::move(w));
          RETURN_IF_ERROR(drain(16));
          file_off += static_cast<int64_t>(stored_bytes);
          if (stats) stats->stored_bytes += static_cast<int64_t>(stored_bytes);
        }
      }
    }
    return drain(0);
  };
  if (Status s = write_all(); !s.ok()) {
    (void)drain(0);
    return s;
  }
  index.data_bytes = file_off;
  RETURN_IF_ERROR(io.Sync(f));
  RETURN_IF_ERROR(std::move(f).Close());
  RETURN_IF_ERROR(io.FileOp("rename", tmp));
  RETURN_IF_ERROR(RenamePath(tmp, dir + "/" + index.data_file));
  // The index last: its presence says this rank's data is durable.
  return WriteFileDurably(io, dir, IndexFileName(rank), EncodeIndex(index));
}

}  // namespace zrt::ckpt
