// libFuzzer target for the whole checkpoint read path: a valid 2-shard checkpoint of a small model,
// with one of its files (the manifest, an index, a data file) replaced by the input, goes through the
// catalog, verify at both levels and a strict and a non-strict load into the model. Any input must
// give Statuses: no crash, hang, sanitizer report, allocation beyond what the files justify, or read
// outside the directory (the target's own files lie next to it; a load that reads them reads wrong
// data and fails its checksums). Inputs whose first byte has its high bit set are resealed (a valid
// JSON checksum) so the fuzzer reaches the rules behind the checksum.
//   input: [selector byte][file content]; selector % 5: manifest, index 0, index 1, data 0, data 1
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "zrt/checkpoint/catalog.h"
#include "zrt/checkpoint/checkpointer.h"
#include "zrt/checkpoint/format.h"
#include "zrt/checkpoint/load.h"
#include "zrt/core/communicator.h"
#include "zrt/core/logging.h"
#include "tests/fuzz/targets/fuzz_checks.h"

namespace {

namespace fs = std::filesystem;
using namespace zrt;
using namespace zrt::ckpt;

const std::vector<std::pair<std::string, std::vector<int64_t>>> kTensors = {{"w", {37, 5}}, {"b", {5}}, {"e", {1500}}};

// One rank's view of the model (2 ranks, stage 3), buffers owned by the caller.
StateView View(int rank, std::vector<std::vector<float>>* storage) {
  StateView v;
  v.rank = rank;
  v.world_size = 2;
  v.stage = 3;
  StateGroup g;
  g.name = "g";
  for (const auto& [name, shape] : kTensors) g.tensors.push_back({name, shape, DType::kBF16});
  g.layout = *ShardLayout::Create(g.tensors, 2, 16);
  for (const char* kind : {"master", "exp_avg", "exp_avg_sq"}) {
    storage->emplace_back(static_cast<size_t>(g.layout.shard_size()), 0.25f);
    g.buffers.push_back({kind, DType::kF32, storage->back().data(), g.layout.shard_size()});
  }
  v.groups.push_back(std::move(g));
  return v;
}

struct Pristine {
  fs::path base;
  std::vector<std::pair<std::string, std::string>> files;  // name -> content
};

const std::vector<std::string> kFileNames = {"manifest.json", IndexFileName(0), IndexFileName(1), DataFileName(0), DataFileName(1)};

const Pristine& Original() {
  static const Pristine p = [] {
    Pristine out;
    out.base = fuzz::ScratchDir("zrt_dirfuzz_");
    fs::remove_all(out.base);
    const fs::path root = out.base / "pristine";
    Status s = RunLoopbackRanks(2, [&](Communicator& comm) -> Status {
      CpuDevice staging;
      CheckpointOptions o;
      o.root = root.string();
      o.chunk_elements = 1024;
      ASSIGN_OR_RETURN(auto ck, Checkpointer::Create(&comm, &staging, o));
      std::vector<std::vector<float>> storage;
      StateView v = View(comm.rank(), &storage);
      v.counters.step = 5;
      RETURN_IF_ERROR(ck->SaveAsync(v));
      return ck->Wait();
    });
    if (!s.ok()) std::abort();
    for (const std::string& n : kFileNames) {
      std::ifstream in(root / StepDirName(5) / n, std::ios::binary);
      out.files.emplace_back(n, std::string(std::istreambuf_iterator<char>(in), {}));
    }
    return out;
  }();
  return p;
}

}  // namespace

// ZRT_FUZZ_WRITE_SEEDS=DIR: write one seed per file (its pristine content) and exit.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  SetLogLevel(LogLevel::kError);
  const Pristine& p = Original();
  if (const char* dir = std::getenv("ZRT_FUZZ_WRITE_SEEDS")) {
    for (size_t i = 0; i < p.files.size(); ++i) {
      std::ofstream(std::string(dir) + "/seed" + std::to_string(i), std::ios::binary) << static_cast<char>(i) << p.files[i].second;
    }
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const Pristine& p = Original();
  const fs::path root = p.base / "case", dir = root / StepDirName(5);
  std::error_code ec;
  fs::remove_all(root, ec);
  fs::create_directories(dir, ec);
  const size_t which = data[0] % p.files.size();
  std::string content(reinterpret_cast<const char*>(data) + 1, size - 1);
  if ((data[0] & 0x80) != 0) {
    nlohmann::json j = nlohmann::json::parse(content, nullptr, /*allow_exceptions=*/false);
    if (j.is_object()) {
      j.erase("checksum");
      content = zrt::ckpt::internal::Seal(std::move(j));
    }
  }
  for (size_t i = 0; i < p.files.size(); ++i) {
    std::ofstream(dir / p.files[i].first, std::ios::binary) << (i == which ? content : p.files[i].second);
  }
  std::vector<std::string> problems;
  (void)CheckComplete(dir.string(), VerifyLevel::kMetadata, &problems);
  problems.clear();
  (void)CheckComplete(dir.string(), VerifyLevel::kFull, &problems);
  (void)ListCheckpoints(root.string());
  for (bool strict : {true, false}) {
    for (int rank = 0; rank < 2; ++rank) {
      std::vector<std::vector<float>> storage;
      LoadOptions o;
      o.strict = strict;
      (void)Load(dir.string(), View(rank, &storage), o).status();
    }
  }
  return 0;
}
