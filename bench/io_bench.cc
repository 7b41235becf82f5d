// bench/io: IoEngine sequential write and read throughput against fio with the same block size, queue
// depth and O_DIRECT on the same filesystem (./scripts/bench runs fio and passes its figures in).
//
//   io_bench --dir DIR [--size BYTES] [--bs BYTES] [--fio "qd:write_mbps:read_mbps,..."]
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
  app.add_option("--fio", fio, "fio's figures: \"qd:write_mbps:read_mbps,...\"");
  CLI11_PARSE(app, argc, argv);
  std::map<int, std::pair<double, double>> peer;  // qd -> (write, read) MB/s
  std::stringstream ss(fio);
  for (std::string item; std::getline(ss, item, ',');) {
    int q = 0;
    double w = 0, r = 0;
    if (std::sscanf(item.c_str(), "%d:%lf:%lf", &q, &w, &r) == 3) peer[q] = {w, r};
  }
  std::filesystem::create_directories(dir);
  CpuDevice dev;
  auto buf = dev.Allocate(static_cast<size_t>(bs) * 32, MemCategory::kStaging, kIoAlignment);
  if (!buf.ok()) return 1;
  std::memset(buf->data(), 0x5a, buf->size());
  std::printf("bench/io: %s sequential, %lld KiB requests, O_DIRECT, one stream, in %s\n", FormatBytes(size).c_str(),
              static_cast<long long>(bs >> 10), dir.c_str());
  std::printf("%-9s %4s %12s %12s %8s %12s %12s %8s\n", "backend", "qd", "write MB/s", "fio write", "ratio", "read MB/s",
              "fio read", "ratio");
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
      auto f = IoFile::Open(path, IoFile::Mode::kCreate);
      if (!f.ok()) return 1;
      auto w = Stream(**io, *f, buf->as<char>(), size, bs, qd, true);
      auto r = Stream(**io, *f, buf->as<char>(), size, bs, qd, false);
      (void)std::move(*f).Close().ok();
      std::filesystem::remove(path);
      if (!w.ok() || !r.ok()) {
        std::fprintf(stderr, "%s\n", (w.ok() ? r.status() : w.status()).ToString().c_str());
        return 1;
      }
      const auto [pw, pr] = peer.count(qd) ? peer[qd] : std::pair<double, double>{-1, -1};
      const std::string name((*io)->backend());
      std::printf("%-9s %4d %12.0f %12.0f %8.2f %12.0f %12.0f %8.2f\n", name.c_str(), qd, *w, pw, pw > 0 ? *w / pw : 0, *r, pr,
                  pr > 0 ? *r / pr : 0);
      if (backend == IoOptions::Backend::kUring) {
        bench::PrintResult("io", "write qd" + std::to_string(qd), *w, "MB/s", pw, "fio MB/s");
        bench::PrintResult("io", "read qd" + std::to_string(qd), *r, "MB/s", pr, "fio MB/s");
      }
    }
  }
  return 0;
}
