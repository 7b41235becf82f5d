#include "zrt/checkpoint/shard_writer.h"

#include <algorithm>
#include <cstring>
#include <ctime>
#include <deque>
#include <tuple>

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

ArrivingState::ArrivingState(std::vector<std::vector<int64_t>> counts, int64_t chunk_elements) : chunk_(chunk_elements) {
  size_t kinds = 0;
  for (const std::vector<int64_t>& g : counts) {
    std::vector<Filling>& f = fill_.emplace_back(g.size());
    for (size_t k = 0; k < g.size(); ++k) f[k].count = g[k];
    kinds = std::max(kinds, g.size());
  }
  pool_max_ = 2 * kinds + 8;  // the kinds being filled, those queued, and the writes in flight
}

Result<DeviceBuffer> ArrivingState::Acquire(std::unique_lock<std::mutex>& lock) {
  for (;;) {
    if (stopped_) return status_;
    if (!free_.empty()) {
      DeviceBuffer b = std::move(free_.back());
      free_.pop_back();
      return b;
    }
    if (allocated_ < pool_max_) {
      ++allocated_;
      lock.unlock();
      auto b = host_.Allocate(static_cast<size_t>(chunk_) * 4, MemCategory::kStaging, kIoAlignment);
      lock.lock();
      if (!b.ok()) --allocated_;
      return b;
    }
    cv_.wait(lock);
  }
}

Status ArrivingState::Put(int group, int buffer, int64_t offset, int64_t n, const float* data) {
  std::unique_lock<std::mutex> lock(mu_);
  if (stopped_) return status_;
  if (closed_) return FailedPreconditionError("a save's state: a part arrived after the delivery ended");
  if (group < 0 || static_cast<size_t>(group) >= fill_.size() || buffer < 0 ||
      static_cast<size_t>(buffer) >= fill_[static_cast<size_t>(group)].size()) {
    return InvalidArgumentError("a save's state: no deferred buffer ", buffer, " in group ", group);
  }
  Filling& f = fill_[static_cast<size_t>(group)][static_cast<size_t>(buffer)];
  if (offset != f.next || n < 0 || n > f.count - f.next) {
    return InvalidArgumentError("a save's state: group ", group, " buffer ", buffer, ": elements ", offset, "+", n, " arrived where ",
                                f.next, " of ", f.count, " was expected");
  }
  while (n > 0) {
    if (f.buf.empty()) {
      ASSIGN_OR_RETURN(f.buf, Acquire(lock));
    }
    const int64_t start = f.next / chunk_ * chunk_;
    const int64_t take = std::min(n, chunk_ - (f.next - start));
    lock.unlock();  // only this thread touches a buffer being filled
    std::memcpy(f.buf.as<float>() + (f.next - start), data, static_cast<size_t>(take) * 4);
    lock.lock();
    if (stopped_) return status_;
    data += take;
    n -= take;
    f.next += take;
    if (f.next - start == chunk_ || f.next == f.count) {
      ready_.push_back(Chunk{group, buffer, start, f.next - start, std::move(f.buf)});
      f.buf = DeviceBuffer();
      cv_.notify_all();
    }
  }
  return Status();
}

void ArrivingState::Close(const Status& status) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return;
  closed_ = true;
  Status s = status;
  for (size_t g = 0; g < fill_.size() && s.ok(); ++g) {
    for (size_t k = 0; k < fill_[g].size() && s.ok(); ++k) {
      if (fill_[g][k].next != fill_[g][k].count) {
        s = InternalError("a save's state: the delivery ended at element ", fill_[g][k].next, " of ", fill_[g][k].count, " of group ", g,
                          " buffer ", k);
      }
    }
  }
  if (status_.ok()) status_ = std::move(s);
  for (auto& g : fill_) {
    for (Filling& f : g) f.buf = DeviceBuffer();
  }
  cv_.notify_all();
}

bool ArrivingState::wanted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !stopped_ && !closed_;
}

bool ArrivingState::closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

void ArrivingState::Stop(const Status& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) return;
  stopped_ = true;
  if (status_.ok()) status_ = why.ok() ? InternalError("a save's state: stopped") : why;
  cv_.notify_all();
}

Result<std::optional<ArrivingState::Chunk>> ArrivingState::Next(bool wait) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (stopped_ || (closed_ && !status_.ok())) return status_;
    if (!ready_.empty()) {
      std::optional<Chunk> c(std::move(ready_.front()));
      ready_.pop_front();
      return c;
    }
    if (closed_ || !wait) return std::optional<Chunk>();
    cv_.wait(lock);
  }
}

void ArrivingState::Release(DeviceBuffer buffer) {
  std::lock_guard<std::mutex> lock(mu_);
  free_.push_back(std::move(buffer));
  cv_.notify_all();
}

namespace {

Status WriteShardFiles(IoEngine& io, const std::string& dir, const Manifest& m, int rank, const ShardState& state,
                       const ShardWriteOptions& o, ShardWriteStats* stats) {
  constexpr int64_t kAlign = static_cast<int64_t>(kIoAlignment);
  ArrivingState* arriving = o.arriving;
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
  RankIndex index = IndexOf(m, rank);
  const std::string tmp = dir + "/" + index.data_file + ".tmp";
  ASSIGN_OR_RETURN(IoFile f, IoFile::Open(tmp, IoFile::Mode::kCreate));
  CpuDevice host;  // before every buffer it hands out: destroyed after them
  // A chunk on its way: being encoded (and checksummed), then written. Compressed chunks need their own
  // buffers until written: a bounded window stays in flight.
  struct InFlight {
    ChunkEntry entry;
    const char* raw = nullptr;
    DeviceBuffer buffer;   // a chunk read from non-resident state, or an arriving chunk's
    bool arrived = false;  // buffer is an arriving chunk's
    std::vector<char> buf;  // the encoded bytes (compressed chunks)
    std::future<Status> encoded;  // with encoders
    IoHandle handle;
  };
  std::deque<std::unique_ptr<InFlight>> encoding, window;
  const size_t encode_depth = o.encoders != nullptr ? 2 * static_cast<size_t>(o.encoders->workers() + 1) : 0;
  std::vector<char> scratch;
  std::vector<DeviceBuffer> spare;  // chunk buffers for non-resident state, reused once written
  int64_t file_off = 0;
  auto recycle = [&](InFlight& w) {
    if (w.arrived) {
      arriving->Release(std::move(w.buffer));
    } else if (!w.buffer.empty()) {
      spare.push_back(std::move(w.buffer));
    }
  };
  auto drain = [&](size_t keep) -> Status {
    while (window.size() > keep) {
      Status s = window.front()->handle.Wait();
      recycle(*window.front());
      window.pop_front();
      if (!s.ok()) {
        while (!window.empty()) {  // nothing may be freed while the engine still uses it
          (void)window.front()->handle.Wait();
          window.pop_front();
        }
        return s;
      }
    }
    return Status();
  };
  auto encode = [&compression = o.compression](InFlight& w, std::vector<char>* scratch_buf) -> Status {
    const size_t raw_bytes = static_cast<size_t>(w.entry.elements) * 4;
    ASSIGN_OR_RETURN(w.entry.codec, EncodeChunk(w.raw, raw_bytes, 4, compression, scratch_buf, &w.buf));
    const char* stored = w.entry.codec == Codec::kRaw ? w.raw : w.buf.data();
    w.entry.stored_bytes = static_cast<int64_t>(w.entry.codec == Codec::kRaw ? raw_bytes : w.buf.size());
    w.entry.xxh3 = Checksum(stored, static_cast<size_t>(w.entry.stored_bytes));
    return Status();
  };
  // The oldest encoded chunk, written at the end of the file (raw ones 4 KiB-aligned).
  auto issue = [&](size_t in_flight) -> Status {
    std::unique_ptr<InFlight> w = std::move(encoding.front());
    encoding.pop_front();
    if (w->encoded.valid()) RETURN_IF_ERROR(w->encoded.get());
    ChunkEntry& c = w->entry;
    if (c.codec == Codec::kRaw) file_off = (file_off + kAlign - 1) / kAlign * kAlign;  // raw chunks stay O_DIRECT-able
    c.file_offset = file_off;
    index.chunks.push_back(c);
    const char* stored = c.codec == Codec::kRaw ? w->raw : w->buf.data();
    ASSIGN_OR_RETURN(w->handle, io.Write(f, stored, static_cast<size_t>(c.stored_bytes), file_off));
    window.push_back(std::move(w));
    RETURN_IF_ERROR(drain(in_flight));
    file_off += c.stored_bytes;
    if (stats) stats->stored_bytes += c.stored_bytes;
    return Status();
  };
  // Every chunk still being encoded is waited for (an error leaves none using its buffers).
  auto settle = [&]() {
    for (auto& w : encoding) {
      if (w->encoded.valid()) w->encoded.wait();
    }
    encoding.clear();
  };
  // One chunk: encoded here or on an encoder, then issued in order.
  auto put = [&](int g, int k, int64_t e, int64_t n, const char* raw, std::unique_ptr<InFlight> w, size_t in_flight) -> Status {
    w->entry = ChunkEntry{g, k, e, n, 0, 0, Codec::kRaw, 0};
    w->raw = raw;
    if (o.encoders == nullptr) {
      RETURN_IF_ERROR(encode(*w, &scratch));
    } else {
      w->encoded = o.encoders->Submit([&encode, p = w.get()] {
        thread_local std::vector<char> encoder_scratch;
        return encode(*p, &encoder_scratch);
      });
    }
    encoding.push_back(std::move(w));
    while (encoding.size() > encode_depth) RETURN_IF_ERROR(issue(in_flight));
    return Status();
  };
  auto issue_all = [&](size_t in_flight) -> Status {
    while (!encoding.empty()) RETURN_IF_ERROR(issue(in_flight));
    return Status();
  };
  auto write_all = [&]() -> Status {
    for (size_t g = 0; g < state.size(); ++g) {
      for (size_t k = 0; k < state[g].size(); ++k) {
        const StateBuffer& p = state[g][k];
        if (p.data == nullptr && !p.read && arriving != nullptr) continue;  // below, as it arrives
        for (int64_t e = 0; e < p.count; e += m.chunk_elements) {
          const int64_t n = std::min(m.chunk_elements, p.count - e);
          auto w = std::make_unique<InFlight>();
          const char* raw = p.data == nullptr ? nullptr : static_cast<const char*>(p.data) + static_cast<size_t>(e) * 4;
          if (raw == nullptr) {
            if (!p.read) return InvalidArgumentError("state '", p.kind, "' of group '", m.groups[g].name, "' has neither data nor a read function");
            if (spare.empty()) {
              ASSIGN_OR_RETURN(w->buffer, host.Allocate(static_cast<size_t>(m.chunk_elements) * 4, MemCategory::kStaging, kIoAlignment));
            } else {
              w->buffer = std::move(spare.back());
              spare.pop_back();
            }
            RETURN_IF_ERROR(p.read(e, n, w->buffer.data()), "reading state '", p.kind, "' of group '", m.groups[g].name, "' at element ", e);
            raw = w->buffer.as<char>();
          }
          RETURN_IF_ERROR(put(static_cast<int>(g), static_cast<int>(k), e, n, raw, std::move(w), 16));
        }
      }
    }
    // Arriving chunks in the order they fill; when none is ready, the chunks on their way finish first
    // (their buffers go back to the pool the owner's thread may be waiting on).
    while (arriving != nullptr) {
      ASSIGN_OR_RETURN(std::optional<ArrivingState::Chunk> c, arriving->Next(false));
      if (!c) {
        RETURN_IF_ERROR(issue_all(8));
        RETURN_IF_ERROR(drain(0));
        ASSIGN_OR_RETURN(c, arriving->Next(true));
        if (!c) break;
      }
      if (c->group < 0 || static_cast<size_t>(c->group) >= state.size() || c->kind < 0 ||
          static_cast<size_t>(c->kind) >= state[static_cast<size_t>(c->group)].size()) {
        return InternalError("an arriving chunk names group ", c->group, " buffer ", c->kind, " of a shard without it");
      }
      auto w = std::make_unique<InFlight>();
      w->arrived = true;
      w->buffer = std::move(c->buffer);
      const char* raw = w->buffer.as<char>();
      RETURN_IF_ERROR(put(c->group, c->kind, c->offset, c->count, raw, std::move(w), 8));
    }
    RETURN_IF_ERROR(issue_all(16));
    RETURN_IF_ERROR(drain(0));
    std::sort(index.chunks.begin(), index.chunks.end(), [](const ChunkEntry& a, const ChunkEntry& b) {
      return std::tie(a.group, a.kind, a.elem_offset) < std::tie(b.group, b.kind, b.elem_offset);
    });
    return Status();
  };
  if (Status s = write_all(); !s.ok()) {
    settle();
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

}  // namespace

Status WriteShard(IoEngine& io, const std::string& dir, const Manifest& m, int rank, const ShardState& state,
                  const ShardWriteOptions& options, ShardWriteStats* stats) {
  Status s = WriteShardFiles(io, dir, m, rank, state, options, stats);
  if (!s.ok() && options.arriving != nullptr) options.arriving->Stop(s);  // the owner's thread stops waiting to deliver
  return s;
}

}  // namespace zrt::ckpt
