// bench/io: IoEngine sequential write and read throughput against fio with the same block size, queue
// depth, O_DIRECT and allocation policy on the same filesystem (./scripts/bench runs fio and passes its
// figures in): writes into a file that grows as it is written (fio --fallocate=none) and into one
// preallocated first (IoFile::Reserve, what checkpoint and swap files get; fio's default
// --fallocate=native), then reads.
//
//   io_bench --dir DIR [--size BYTES] [--bs BYTES] [--fio "qd:write_mbps:read_mbps:prealloc_write_mbps,..."]
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>

#include "bench/bench_util.h"
#include "zrt/offload/io_engine.h"
#include "zrt/core/device.h"

using namespace zrt;

namespace {
double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Streams `size` bytes through `bs`-byte requests with at most `qd` in flight; returns MB/s.
Result<double> Stream(IoEngine& io, const IoFile& f, char* buf, int64_t size, int64_t bs, int qd, bool write) {
  std::deque<IoHandle> window;
  const double t0 = Now();
  for (int64_t off = 0; off < size; off += bs) {
    if (static_cast<int>(window.size()) == qd) {
      RETURN_IF_ERROR(window.front().Wait());
      window.pop_front();
    }
    // Each request has its own slice of the buffer (no reuse while in flight).
    char* slice = buf + (off / bs % qd) * bs;
    ASSIGN_OR_RETURN(IoHandle h, write ? io.Write(f, slice, static_cast<size_t>(bs), off) : io.Read(f, slice, static_cast<size_t>(bs), off));
    window.push_back(std::move(h));
  }
  while (!window.empty()) {
    RETURN_IF_ERROR(window.front().Wait());
    window.pop_front();
  }
  if (write) RETURN_IF_ERROR(f.Sync());
  return static_cast<double>(size) / (Now() - t0) / 1e6;
}
}  // namespace

int main(int argc, char** argv) {
  std::string dir, fio;
  int64_t size = int64_t{2} << 30, bs = 1 << 20;
  CLI::App app{"io_bench: the IoEngine's write and read rates against fio's at the same queue depths"};
  app.add_option("--dir", dir, "scratch directory (files are written only here, and removed)")->required();
  app.add_option("--size", size, "bytes per file")->capture_default_str();
  app.add_option("--bs", bs, "request size, bytes")->capture_default_str();
  app.add_option("--fio", fio, "fio's figures: \"qd:write_mbps:read_mbps:prealloc_write_mbps,...\" (writes: --fallocate=none, native)");
  CLI11_PARSE(app, argc, argv);
  struct Peer {
    double write = -1, read = -1, prealloc_write = -1;  // MB/s; -1: not measured
  };
  std::map<int, Peer> peer;  // by queue depth
  std::stringstream ss(fio);
  for (std::string item; std::getline(ss, item, ',');) {
    int q = 0;
    Peer p;
    if (std::sscanf(item.c_str(), "%d:%lf:%lf:%lf", &q, &p.write, &p.read, &p.prealloc_write) >= 3) peer[q] = p;
  }
  std::filesystem::create_directories(dir);
  CpuDevice dev;
  auto buf = dev.Allocate(static_cast<size_t>(bs) * 32, MemCategory::kStaging, kIoAlignment);
  if (!buf.ok()) return 1;
  std::memset(buf->data(), 0x5a, buf->size());
  std::printf("bench/io: %s sequential, %lld KiB requests, O_DIRECT, one stream, in %s\n", FormatBytes(size).c_str(),
              static_cast<long long>(bs >> 10), dir.c_str());
  std::printf("%-9s %4s %21s %21s %21s\n", "", "", "write (file grows)", "write (preallocated)", "read");
  std::printf("%-9s %4s %7s %7s %5s %7s %7s %5s %7s %7s %5s\n", "backend", "qd", "MB/s", "fio", "ratio", "MB/s", "fio", "ratio",
              "MB/s", "fio", "ratio");
  for (auto backend : {IoOptions::Backend::kUring, IoOptions::Backend::kThreads}) {
    for (int qd : {1, 8, 32}) {
      IoOptions o;
      o.backend = backend;
      o.queue_depth = qd;
      o.block_bytes = bs;
      o.threads = qd;
      auto io = IoEngine::Create(o);
      if (!io.ok()) {
        std::fprintf(stderr, "%s\n", io.status().ToString().c_str());
        continue;
      }
      const std::string path = dir + "/io_bench.dat";
      Result<double> w = 0.0, wp = 0.0, r = 0.0;
      for (bool reserve : {false, true}) {  // a fresh file each time
        std::filesystem::remove(path);
        auto f = IoFile::Open(path, IoFile::Mode::kCreate);
        if (!f.ok()) return 1;
        if (reserve) {
          if (Status s = f->Reserve(size); !s.ok()) {
            std::fprintf(stderr, "%s\n", s.ToString().c_str());
            return 1;
          }
          wp = Stream(**io, *f, buf->as<char>(), size, bs, qd, true);
          r = Stream(**io, *f, buf->as<char>(), size, bs, qd, false);
        } else {
          w = Stream(**io, *f, buf->as<char>(), size, bs, qd, true);
        }
        (void)std::move(*f).Close().ok();
      }
      std::filesystem::remove(path);
      for (const auto* x : {&w, &wp, &r}) {
        if (!x->ok()) {
          std::fprintf(stderr, "%s\n", x->status().ToString().c_str());
          return 1;
        }
      }
      const Peer p = peer.count(qd) ? peer[qd] : Peer{};
      auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
      const std::string name((*io)->backend());
      std::printf("%-9s %4d %7.0f %7.0f %5.2f %7.0f %7.0f %5.2f %7.0f %7.0f %5.2f\n", name.c_str(), qd, *w, p.write, ratio(*w, p.write), *wp,
                  p.prealloc_write, ratio(*wp, p.prealloc_write), *r, p.read, ratio(*r, p.read));
      if (backend == IoOptions::Backend::kUring) {
        bench::PrintResult("io", "write qd" + std::to_string(qd), *w, "MB/s", p.write, "fio MB/s");
        bench::PrintResult("io", "prealloc write qd" + std::to_string(qd), *wp, "MB/s", p.prealloc_write, "fio MB/s");
        bench::PrintResult("io", "read qd" + std::to_string(qd), *r, "MB/s", p.read, "fio MB/s");
      }
    }
  }
  return 0;
}
