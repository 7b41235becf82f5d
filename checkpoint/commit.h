// The commit protocol of a checkpoint, written once (../shared/DESIGN.md "Checkpoints" 1 and 6). Used
// by the Checkpointer (collective, one save per step), the offline reshard and the HDF5 import.
//
//   BeginSave    ROOT/step-N.tmp-<nonce>/ is created; the nonce (NewNonce, drawn once per save and
//                shared by every rank) ties the manifest and every index of the save together.
//   ...          each shard writer publishes its data file and then its index (shard_writer.h), the
//                manifest is published (PublishFile: temp name, write, fsync, rename); nothing here
//                is complete, and nothing that crashes here is ever taken for complete.
//   Commit       the ranks agree that every write succeeded (one all-reduce); then one process checks
//                the directory complete (manifest and every index exist and agree), fsyncs it,
//                renames it to ROOT/step-N (atomic: the checkpoint exists from here on), fsyncs ROOT,
//                rewrites ROOT/latest (advisory) and applies retention. The outcome is the same on
//                every rank. On failure the temp directory is removed; the previous complete
//                checkpoint is never touched.
//   Retention   a checkpoint is deleted by renaming it to ROOT/step-N.dead-<nonce> first (atomic: it is
//               complete under its name or not at all), fsyncing ROOT, then removing the dead name.
//   Repair      at start-up: temp and dead directories of saves and deletions that died are removed,
//               `latest` is pointed at the newest complete checkpoint, retention is applied again (a
//               job killed between a commit's rename and its `latest` or retention leaves them stale).
//
// Durability steps ask the IoEngine's hooks first ("commit" before the rename), the fault-injection
// seam of the tests.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "zrt/core/communicator.h"
#include "zrt/core/status.h"
#include "zrt/offload/io_engine.h"

namespace zrt::ckpt {

// 16 hex digits from the system's random source.
std::string NewNonce();

// Where one save is written and where it ends up.
struct SaveDir {
  std::string root;
  int64_t step = 0;
  std::string nonce;
  std::string tmp;    // ROOT/step-N.tmp-<nonce>
  std::string final;  // ROOT/step-N
};
SaveDir SaveDirFor(const std::string& root, int64_t step, const std::string& nonce);

// Creates the temp directory (and the root). Any process may call it; it is idempotent.
Status BeginSave(const SaveDir& save);

// dir/name, atomically and durably (temp name, write, fsync, rename); the directory is fsynced by Commit.
Status PublishFile(const IoEngine& io, const std::string& dir, std::string_view name, std::string_view content);

// Retention after a commit: keep the newest `keep_last` complete checkpoints (0: keep all) and every
// step that is a multiple of `keep_every` (0: none). Never deletes the newest complete checkpoint, an
// incomplete one (it may be being repaired by hand) or a save in progress.
struct Retention {
  int keep_last = 0;
  int64_t keep_every = 0;
};

// Collective over `comm` (null: this process alone). `local` is this process's write outcome. Rank 0
// commits; every rank returns the same outcome: OK, the failing rank's error ("failed on rank r: ..."
// on the others), or rank 0's commit error. The temp directory is removed on failure.
Status Commit(Communicator* comm, const Status& local, const SaveDir& save, const Retention& retention, const IoEngine& io);

// Applies retention under `root` (Commit does it after each commit).
Status ApplyRetention(const std::string& root, const Retention& retention);

// Start-up repair of `root` (created if missing): removes the temp directories of saves that died,
// the dead directories of deletions that died and half-written pointer files, then points `latest` at
// the newest complete checkpoint and applies `retention`. Only one process per root, and never while
// a save to the root is in progress.
Status RepairRoot(const std::string& root, const Retention& retention, const IoEngine& io);

// Discards a save that will not be committed (its temp directory).
void AbandonSave(const SaveDir& save);

}  // namespace zrt::ckpt
