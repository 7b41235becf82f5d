// The shard writer and the disk save's chunk queue (shard_writer.h).
#include "zrt/checkpoint/shard_writer.h"
#include "zrt/core/base.h"

#include <algorithm>
#include <cstring>
#include <ctime>
#include <future>
#include <tuple>

#include "zrt/checkpoint/codec.h"
#include "zrt/checkpoint/fs_util.h"
#include "zrt/core/logging.h"

namespace zrt::ckpt {

Result<Manifest> ManifestFor(const StateView& state, const nlohmann::json& trainer_state, int64_t chunk_elements,
                             const std::string& nonce) {
  RETURN_IF_ERROR(state.CheckOneMesh("a manifest of one rank's view (a save of it is collective: snapshot.h)"));
  return internal::LocalManifest(state, trainer_state, chunk_elements, nonce);
}

namespace internal {

Result<Manifest> LocalManifest(const StateView& state, const nlohmann::json& trainer_state, int64_t chunk_elements,
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
  m.shards = 0;
  for (const StateGroup& g : state.groups) {
    if (!g.own_group.empty()) continue;
    if (m.shards != 0 && g.layout.world_size() != m.shards) return InvalidArgumentError("checkpoint: groups sharded over different world sizes");
    m.shards = g.layout.world_size();
  }
  if (m.shards == 0) m.shards = state.world_size;
  for (const StateGroup& g : state.groups) {
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
      ge.stored.push_back(b.format.precision);
      if (IsBlockwise(b.format.precision)) {
        const int64_t block = b.format.block;
        if (block < 1 || ge.alignment % block != 0) {
          return InvalidArgumentError("checkpoint: group '", g.name, "': ", PrecisionName(b.format.precision), " blocks of ", block,
                                      " do not divide its alignment ", ge.alignment);
        }
        if (ge.block != 0 && ge.block != block) return InvalidArgumentError("checkpoint: group '", g.name, "' has q8/q4 kinds of two block sizes");
        ge.block = block;
        m.chunk_elements = (m.chunk_elements + block - 1) / block * block;  // chunks hold whole blocks
      }
      if (b.format != StateFormat::Of(b.format.precision, b.kind, ge.block)) {
        return InvalidArgumentError("checkpoint: group '", g.name, "': ", b.kind, " stored as ", PrecisionName(b.format.precision),
                                    b.format.is_signed ? " signed" : " unsigned", " (block ", b.format.block, "), which the format does not hold");
      }
    }
    m.groups.push_back(std::move(ge));
  }
  return m;
}

}  // namespace internal

// ---- ShardWriter ---------------------------------------------------------------------------------

// A chunk on its way: being encoded (and checksummed), then written. Compressed chunks keep their
// encoded bytes until written.
struct ShardWriter::InFlight {
  ChunkEntry entry;
  const char* raw = nullptr;
  std::function<void()> release;
  bool as_stored = false;       // `raw` is the kind's stored form already (WriteStored)
  std::vector<char> packed;     // a bf16 or q8 kind's stored form (before compression)
  std::vector<char> buf;        // the encoded bytes (compressed chunks)
  const char* stored = nullptr; // what is written: raw, packed or buf
  std::future<Status> encoded;  // with encoders
  IoHandle handle;
  ~InFlight() {
    if (release) release();
  }
};

ShardWriter::ShardWriter(IoEngine& io, const std::string& dir, const Manifest& m, int shard, const ShardWriteOptions& o)
    : io_(io), dir_(dir), m_(m), o_(o), index_(IndexOf(m, shard, o.part)) {}

ShardWriter::~ShardWriter() { Abandon(); }

Result<std::unique_ptr<ShardWriter>> ShardWriter::Open(IoEngine& io, const std::string& dir, const Manifest& m, int shard,
                                                       const ShardWriteOptions& o) {
  if (shard < 0 || shard >= m.shards) return InvalidArgumentError("shard ", shard, " of a checkpoint of ", m.shards);
  if (o.part < 0 || o.part >= m.parts) return InvalidArgumentError("part ", o.part, " of a checkpoint of ", m.parts, " part(s) per shard");
  std::unique_ptr<ShardWriter> w(new ShardWriter(io, dir, m, shard, o));
  ASSIGN_OR_RETURN(w->layouts_, SavedLayouts(m));
  const PartPlan plan(m, w->layouts_, shard);
  w->written_ = plan.Mask(o.part);
  for (auto& kinds : w->written_) {
    for (auto& chunks : kinds) {
      for (char& c : chunks) c = c ? 0 : 2;  // 0: to write; 2: another part's
    }
  }
  w->tmp_ = dir + "/" + w->index_.data_file + ".tmp";
  ASSIGN_OR_RETURN(w->file_, IoFile::Open(w->tmp_, IoFile::Mode::kCreate));
  RETURN_IF_ERROR(w->file_.Reserve(plan.max_file_bytes(o.part)), "shard ", shard);
  return w;
}

bool ShardWriter::wants(int group, int kind, int64_t offset) const {
  return written_[static_cast<size_t>(group)][static_cast<size_t>(kind)][static_cast<size_t>(offset / m_.chunk_elements)] != 2;
}

Status ShardWriter::Encode(InFlight& w, std::vector<char>* scratch) const {
  const GroupEntry& ge = m_.groups[static_cast<size_t>(w.entry.group)];
  const std::string& kind = ge.kinds[static_cast<size_t>(w.entry.kind)];
  const StateFormat form = ge.format(static_cast<size_t>(w.entry.kind));
  const char* raw = w.raw;
  const auto raw_bytes = static_cast<size_t>(form.Bytes(w.entry.elements));
  if (form.compact() && !w.as_stored) {  // the owner's compact state, stored as it keeps it
    w.packed.resize(raw_bytes);
    char* values = w.packed.data();
    RETURN_IF_ERROR(form.EncodeExact(reinterpret_cast<const float*>(w.raw), w.entry.elements, values,
                                     reinterpret_cast<float*>(values + form.ValuesBytes(w.entry.elements))),
                    "shard ", index_.rank, ", group '", ge.name, "' ", kind, " at element ", w.entry.elem_offset);
    raw = w.packed.data();
  }
  ASSIGN_OR_RETURN(w.entry.codec, EncodeChunk(raw, raw_bytes, static_cast<size_t>(form.value_bytes()), o_.compression, scratch, &w.buf));
  w.stored = w.entry.codec == Codec::kRaw ? raw : w.buf.data();
  w.entry.stored_bytes = static_cast<int64_t>(w.entry.codec == Codec::kRaw ? raw_bytes : w.buf.size());
  w.entry.xxh3 = Checksum(w.stored, static_cast<size_t>(w.entry.stored_bytes));
  return Status();
}

Status ShardWriter::Write(int group, int kind, int64_t offset, int64_t count, const float* data, std::function<void()> release) {
  return Take(group, kind, offset, count, reinterpret_cast<const char*>(data), false, std::move(release));
}

Status ShardWriter::WriteStored(int group, int kind, int64_t offset, int64_t count, const void* stored, std::function<void()> release) {
  return Take(group, kind, offset, count, static_cast<const char*>(stored), true, std::move(release));
}

Status ShardWriter::Take(int group, int kind, int64_t offset, int64_t count, const char* data, bool stored, std::function<void()> release) {
  auto w = std::make_unique<InFlight>();
  w->release = std::move(release);  // called whatever happens below
  RETURN_IF_ERROR(failed_);
  if (group < 0 || static_cast<size_t>(group) >= written_.size() || kind < 0 ||
      static_cast<size_t>(kind) >= written_[static_cast<size_t>(group)].size()) {
    return InvalidArgumentError("shard ", index_.rank, ": no kind ", kind, " in group ", group);
  }
  const int64_t shard = layouts_[static_cast<size_t>(group)].shard_size(), chunk = m_.chunk_elements;
  std::vector<char>& seen = written_[static_cast<size_t>(group)][static_cast<size_t>(kind)];
  if (offset < 0 || offset % chunk != 0 || offset >= shard || count != std::min(chunk, shard - offset) || seen[static_cast<size_t>(offset / chunk)]) {
    return InvalidArgumentError("shard ", index_.rank, ", group '", m_.groups[static_cast<size_t>(group)].name, "' ",
                                m_.groups[static_cast<size_t>(group)].kinds[static_cast<size_t>(kind)], ": elements [", offset, ", ",
                                offset + count, ") are not a chunk of its ", shard, " still to write");
  }
  if (seen[static_cast<size_t>(offset / chunk)] == 2) {
    return InvalidArgumentError("shard ", index_.rank, ", group '", m_.groups[static_cast<size_t>(group)].name, "': the chunk at element ",
                                offset, " is not part ", index_.part, "'s");
  }
  seen[static_cast<size_t>(offset / chunk)] = 1;
  w->entry = ChunkEntry{group, kind, offset, count, 0, 0, Codec::kRaw, 0};
  w->raw = data;
  w->as_stored = stored;
  if (o_.encoders == nullptr) {
    failed_ = Encode(*w, &scratch_);
  } else {
    w->encoded = o_.encoders->Submit([this, p = w.get()] {
      thread_local std::vector<char> encoder_scratch;
      return Encode(*p, &encoder_scratch);
    });
  }
  encoding_.push_back(std::move(w));
  const size_t depth = o_.encoders != nullptr ? 2 * static_cast<size_t>(o_.encoders->workers() + 1) : 0;
  while (failed_.ok() && encoding_.size() > depth) failed_ = Issue(16);
  if (!failed_.ok()) Abandon();
  return failed_;
}

Status ShardWriter::Issue(size_t in_flight) {
  std::unique_ptr<InFlight> w = std::move(encoding_.front());
  encoding_.pop_front();
  if (w->encoded.valid()) RETURN_IF_ERROR(w->encoded.get());
  ChunkEntry& c = w->entry;
  if (c.codec == Codec::kRaw) file_offset_ = AlignUp(file_offset_, static_cast<int64_t>(kIoAlignment));  // raw chunks stay O_DIRECT-able
  c.file_offset = file_offset_;
  index_.chunks.push_back(c);
  ASSIGN_OR_RETURN(w->handle, io_.Write(file_, w->stored, static_cast<size_t>(c.stored_bytes), file_offset_));
  window_.push_back(std::move(w));
  file_offset_ += c.stored_bytes;
  stored_bytes_ += c.stored_bytes;
  return Drain(in_flight);
}

Status ShardWriter::Drain(size_t keep) {
  while (window_.size() > keep) {
    Status s = window_.front()->handle.Wait();
    window_.pop_front();  // gives the chunk back
    RETURN_IF_ERROR(s);
  }
  return Status();
}

void ShardWriter::Abandon() {
  for (auto& w : encoding_) {
    if (w->encoded.valid()) w->encoded.wait();
  }
  encoding_.clear();
  while (!window_.empty()) {  // nothing may be given back while the engine still uses it
    (void)window_.front()->handle.Wait();
    window_.pop_front();
  }
}

Status ShardWriter::Flush() {
  while (failed_.ok() && !encoding_.empty()) failed_ = Issue(16);
  if (failed_.ok()) failed_ = Drain(0);
  if (!failed_.ok()) Abandon();
  return failed_;
}

Status ShardWriter::Finish(ShardWriteStats* stats) {
  RETURN_IF_ERROR(Flush());
  for (size_t g = 0; g < written_.size(); ++g) {
    for (size_t k = 0; k < written_[g].size(); ++k) {
      const auto& seen = written_[g][k];
      if (const auto it = std::find(seen.begin(), seen.end(), 0); it != seen.end()) {
        return failed_ = InternalError("shard ", index_.rank, ", group '", m_.groups[g].name, "' ", m_.groups[g].kinds[k], ": chunk at element ",
                                       (it - seen.begin()) * m_.chunk_elements, " was never written");
      }
    }
  }
  std::sort(index_.chunks.begin(), index_.chunks.end(), [](const ChunkEntry& a, const ChunkEntry& b) {
    return std::tie(a.group, a.kind, a.elem_offset) < std::tie(b.group, b.kind, b.elem_offset);
  });
  index_.data_bytes = file_offset_;
  RETURN_IF_ERROR(file_.Truncate(file_offset_));  // what the reservation holds beyond the chunks
  RETURN_IF_ERROR(io_.Sync(file_));
  RETURN_IF_ERROR(std::move(file_).Close());
  RETURN_IF_ERROR(io_.FileOp("rename", tmp_));
  RETURN_IF_ERROR(RenamePath(tmp_, dir_ + "/" + index_.data_file));
  if (stats != nullptr) stats->stored_bytes = stored_bytes_;
  // The index last: its presence says this rank's data is durable.
  return WriteFileDurably(io_, dir_, IndexFileName(index_.rank, index_.part, index_.parts), EncodeIndex(index_));
}

Status WriteShard(IoEngine& io, const std::string& dir, const Manifest& m, int shard, const StateView& state,
                  const ShardWriteOptions& options, ShardWriteStats* stats) {
  if (state.groups.size() != m.groups.size()) {
    return InvalidArgumentError("shard ", shard, ": ", state.groups.size(), " groups of state for a manifest of ", m.groups.size());
  }
  ASSIGN_OR_RETURN(std::unique_ptr<ShardWriter> w, ShardWriter::Open(io, dir, m, shard, options));
  CpuDevice host;  // before its buffers: destroyed after them
  std::vector<DeviceBuffer> spare;
  for (size_t g = 0; g < state.groups.size(); ++g) {
    const StateGroup& sg = state.groups[g];
    if (sg.buffers.size() != m.groups[g].kinds.size()) {
      return InvalidArgumentError("shard ", shard, ", group '", m.groups[g].name, "': ", sg.buffers.size(), " state buffers for ",
                                  m.groups[g].kinds.size(), " kinds");
    }
    for (size_t k = 0; k < sg.buffers.size(); ++k) {
      const StateBuffer& b = sg.buffers[k];
      for (int64_t e = 0; e < b.count; e += m.chunk_elements) {
        const int64_t n = std::min(m.chunk_elements, b.count - e);
        if (!w->wants(static_cast<int>(g), static_cast<int>(k), e)) continue;
        if (b.data != nullptr) {
          RETURN_IF_ERROR(w->Write(static_cast<int>(g), static_cast<int>(k), e, n, static_cast<const float*>(b.data) + e));
          continue;
        }
        if (spare.empty()) RETURN_IF_ERROR(w->Flush());  // the writes in flight give their buffers back
        if (spare.empty()) {
          ASSIGN_OR_RETURN(DeviceBuffer buf, host.Allocate(static_cast<size_t>(m.chunk_elements) * 4, MemCategory::kStaging, kIoAlignment));
          spare.push_back(std::move(buf));
        }
        auto buf = std::make_shared<DeviceBuffer>(std::move(spare.back()));
        spare.pop_back();
        RETURN_IF_ERROR(state.Read(static_cast<int>(g), static_cast<int>(k), e, n, buf->as<float>()), "reading ", b.kind, " of group '",
                        sg.name, "' at element ", e);
        RETURN_IF_ERROR(w->Write(static_cast<int>(g), static_cast<int>(k), e, n, buf->as<float>(), [&spare, buf] { spare.push_back(std::move(*buf)); }));
      }
    }
  }
  return w->Finish(stats);
}

// ---- ChunkQueue ----------------------------------------------------------------------------------

std::vector<std::vector<QueuedKind>> QueuedKinds(const Manifest& m, const std::vector<ShardLayout>& layouts) {
  std::vector<std::vector<QueuedKind>> kinds;
  for (size_t g = 0; g < m.groups.size(); ++g) {
    const GroupEntry& ge = m.groups[g];
    auto& group = kinds.emplace_back();
    for (size_t k = 0; k < ge.kinds.size(); ++k) group.push_back({layouts[g].shard_size(), ge.format(k)});
  }
  return kinds;
}

ChunkQueue::ChunkQueue(std::vector<std::vector<QueuedKind>> kinds, int64_t chunk_elements, int64_t budget_bytes, Device* device,
                       std::vector<DeviceBuffer> spare, std::vector<std::vector<std::vector<char>>> keep)
    : chunk_(chunk_elements), keep_(std::move(keep)), device_(device), spare_(std::move(spare)) {
  size_t most_kinds = 0;
  int64_t largest = 0;
  for (const std::vector<QueuedKind>& g : kinds) {
    std::vector<Filling>& f = fill_.emplace_back(g.size());
    for (size_t k = 0; k < g.size(); ++k) {
      f[k].form = g[k];
      largest = std::max(largest, g[k].format.Bytes(chunk_));
    }
    most_kinds = std::max(most_kinds, g.size());
  }
  // A capture fills at most one chunk per kind at once (the kinds of a window), and the writer holds
  // what it writes: with fewer buffers than that the two could wait for each other.
  const int64_t least = static_cast<int64_t>(most_kinds + 2) * largest;
  max_bytes_ = budget_bytes <= 0 ? INT64_MAX : std::max(least, budget_bytes);
}

std::vector<DeviceBuffer> ChunkQueue::TakeBuffers() {
  std::lock_guard<std::mutex> lock(mu_);
  for (Chunk& c : ready_) spare_.push_back(std::move(c.buffer));
  ready_.clear();
  for (auto& g : fill_) {
    for (Filling& f : g) {
      if (!f.buf.empty()) spare_.push_back(std::move(f.buf));
    }
  }
  held_ = 0;
  return std::move(spare_);
}

// The smallest spare buffer that holds `bytes`, or a new one of `bytes`.
Result<DeviceBuffer> ChunkQueue::Acquire(std::unique_lock<std::mutex>& lock, int64_t bytes) {
  for (;;) {
    if (stopped_) return status_;
    auto fit = spare_.end();
    for (auto it = spare_.begin(); it != spare_.end(); ++it) {
      if (static_cast<int64_t>(it->size()) >= bytes && (fit == spare_.end() || it->size() < fit->size())) fit = it;
    }
    const int64_t size = fit != spare_.end() ? static_cast<int64_t>(fit->size()) : bytes;
    if (held_ == 0 || held_ + size <= max_bytes_) {
      held_ += size;
      peak_ = std::max(peak_, held_);
      if (fit != spare_.end()) {
        DeviceBuffer b = std::move(*fit);
        spare_.erase(fit);
        return b;
      }
      lock.unlock();
      auto b = device_->Allocate(static_cast<size_t>(bytes), MemCategory::kStaging, kIoAlignment);
      lock.lock();
      if (!b.ok()) held_ -= size;
      return b;
    }
    cv_.wait(lock);
  }
}

Result<ChunkQueue::Filling*> ChunkQueue::Expect(int group, int buffer, int64_t offset, int64_t n) {
  if (stopped_) return status_;
  if (closed_) return FailedPreconditionError("a save's state: a part arrived after the delivery ended");
  if (group < 0 || static_cast<size_t>(group) >= fill_.size() || buffer < 0 ||
      static_cast<size_t>(buffer) >= fill_[static_cast<size_t>(group)].size()) {
    return InvalidArgumentError("a save's state: no buffer ", buffer, " in group ", group);
  }
  Filling& f = fill_[static_cast<size_t>(group)][static_cast<size_t>(buffer)];
  if (offset != f.next || n < 0 || n > f.form.count - f.next) {
    return InvalidArgumentError("a save's state: group ", group, " buffer ", buffer, ": elements ", offset, "+", n, " arrived where ",
                                f.next, " of ", f.form.count, " was expected");
  }
  const int64_t block = f.form.format.blockwise() ? f.form.format.block : 1;
  if (offset % block != 0 || (n % block != 0 && offset + n != f.form.count)) {
    return InvalidArgumentError("a save's state: group ", group, " buffer ", buffer, ": elements ", offset, "+", n,
                                " are not whole blocks of ", block);
  }
  return &f;
}

template <typename Fill>
Status ChunkQueue::Arrive(int group, int buffer, int64_t offset, int64_t n, Fill fill) {
  std::unique_lock<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(Filling* const f, Expect(group, buffer, offset, n));
  int64_t done = 0;
  while (done < n) {
    const int64_t start = f->next / chunk_ * chunk_, count = std::min(chunk_, f->form.count - start);
    const int64_t take = std::min(n - done, chunk_ - (f->next - start));
    if (!keep_.empty() && !keep_[static_cast<size_t>(group)][static_cast<size_t>(buffer)][static_cast<size_t>(start / chunk_)]) {
      done += take;  // another writer's chunk
      f->next += take;
      continue;
    }
    if (f->buf.empty()) {
      // A whole chunk's bytes even for a shard's short last chunk: buffers stay interchangeable.
      ASSIGN_OR_RETURN(f->buf, Acquire(lock, f->form.format.Bytes(chunk_)));
    }
    lock.unlock();  // only this producer touches a buffer being filled
    Status s = fill(f->buf.as<char>(), count, f->next - start, done, take);
    lock.lock();
    RETURN_IF_ERROR(s);
    if (stopped_) return status_;
    done += take;
    f->next += take;
    if (f->next - start == count) {
      ready_.push_back(Chunk{group, buffer, start, count, std::move(f->buf)});
      f->buf = DeviceBuffer();
      cv_.notify_all();
    }
  }
  return Status();
}

Status ChunkQueue::Put(int group, int buffer, int64_t offset, int64_t n, const float* data) {
  return Arrive(group, buffer, offset, n, [&](char* chunk, int64_t count, int64_t at, int64_t done, int64_t take) -> Status {
    const StateFormat& form = fill_[static_cast<size_t>(group)][static_cast<size_t>(buffer)].form.format;
    if (!form.compact()) {
      std::memcpy(chunk + at * 4, data + done, static_cast<size_t>(take) * 4);
      return Status();
    }
    RETURN_IF_ERROR(form.EncodeExact(data + done, take, chunk + form.ValuesBytes(at), reinterpret_cast<float*>(chunk + form.ValuesBytes(count)) + form.Scales(at)),
                    "a save's state: group ", group, " buffer ", buffer, " at element ", offset + done);
    std::lock_guard<std::mutex> lock(mu_);
    encoded_ += take;
    return Status();
  });
}

// Each chunk of a compact kind holds its values or codes, then (q8) its blocks' scales: the part's
// codes and scales are copied to their places in the chunks they fall in.
Status ChunkQueue::PutStored(int group, int buffer, int64_t offset, int64_t n, const StateFormat& format, const void* values,
                             const float* scales) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (group >= 0 && static_cast<size_t>(group) < fill_.size() && buffer >= 0 && static_cast<size_t>(buffer) < fill_[static_cast<size_t>(group)].size()) {
      const StateFormat& form = fill_[static_cast<size_t>(group)][static_cast<size_t>(buffer)].form.format;
      if (format != form) {
        return InvalidArgumentError("a save's state: group ", group, " buffer ", buffer, " arrived stored as ", PrecisionName(format.precision),
                                    " (block ", format.block, ") where the checkpoint stores it as ", PrecisionName(form.precision), " (block ", form.block, ")");
      }
    }
  }
  if (!format.compact()) return Put(group, buffer, offset, n, static_cast<const float*>(values));
  return Arrive(group, buffer, offset, n, [&](char* chunk, int64_t count, int64_t at, int64_t done, int64_t take) -> Status {
    std::memcpy(chunk + format.ValuesBytes(at), static_cast<const char*>(values) + format.ValuesBytes(done), static_cast<size_t>(format.ValuesBytes(take)));
    if (format.Scales(1) > 0) {
      std::memcpy(chunk + format.ValuesBytes(count) + 4 * format.Scales(at), scales + format.Scales(done), static_cast<size_t>(format.Scales(take)) * 4);
    }
    return Status();
  });
}

void ChunkQueue::Waited(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  waited_ += seconds;
}

void ChunkQueue::Close(const Status& status) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return;
  closed_ = true;
  Status s = status;
  for (size_t g = 0; g < fill_.size() && s.ok(); ++g) {
    for (size_t k = 0; k < fill_[g].size() && s.ok(); ++k) {
      if (fill_[g][k].next != fill_[g][k].form.count) {
        s = InternalError("a save's state: the delivery ended at element ", fill_[g][k].next, " of ", fill_[g][k].form.count, " of group ", g,
                          " buffer ", k);
      }
    }
  }
  if (status_.ok()) status_ = std::move(s);
  cv_.notify_all();
}

bool ChunkQueue::closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

void ChunkQueue::Stop(const Status& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) return;
  stopped_ = true;
  if (status_.ok()) status_ = why.ok() ? InternalError("a save's state: stopped") : why;
  cv_.notify_all();
}

Result<std::optional<ChunkQueue::Chunk>> ChunkQueue::Next(bool wait) {
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

void ChunkQueue::Release(DeviceBuffer buffer) {
  std::lock_guard<std::mutex> lock(mu_);
  held_ -= static_cast<int64_t>(buffer.size());
  spare_.push_back(std::move(buffer));
  cv_.notify_all();
}

double ChunkQueue::waited() const {
  std::lock_guard<std::mutex> lock(mu_);
  return waited_;
}

int64_t ChunkQueue::peak_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_;
}

int64_t ChunkQueue::encoded_elements() const {
  std::lock_guard<std::mutex> lock(mu_);
  return encoded_;
}

// The chunks in the order they fill; when none is ready, the ones on their way finish first (their
// buffers go back to the queue the owner may be waiting on).
Status WriteQueuedShard(IoEngine& io, const std::string& dir, const Manifest& m, int shard, ChunkQueue& queue,
                        const ShardWriteOptions& options, ShardWriteStats* stats, std::span<const int> groups) {
  Status s = [&]() -> Status {
    ASSIGN_OR_RETURN(std::unique_ptr<ShardWriter> w, ShardWriter::Open(io, dir, m, shard, options));
    for (;;) {
      ASSIGN_OR_RETURN(std::optional<ChunkQueue::Chunk> c, queue.Next(false));
      if (!c) {
        RETURN_IF_ERROR(w->Flush());
        ASSIGN_OR_RETURN(c, queue.Next(true));
        if (!c) break;
      }
      auto buffer = std::make_shared<DeviceBuffer>(std::move(c->buffer));
      const int group = groups.empty() ? c->group : c->group >= 0 && static_cast<size_t>(c->group) < groups.size() ? groups[static_cast<size_t>(c->group)] : -1;
      RETURN_IF_ERROR(w->WriteStored(group, c->kind, c->offset, c->count, buffer->data(),
                                     [&queue, buffer] { queue.Release(std::move(*buffer)); }));
    }
    return w->Finish(stats);
  }();
  if (!s.ok()) queue.Stop(s);
  return s;
}

}  // namespace zrt::ckpt
