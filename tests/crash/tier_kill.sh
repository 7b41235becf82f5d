#!/usr/bin/env bash
# The memory tier under kills (issue: recovery tiers). A 4-rank charlm run snapshots into the memory
# tier every step (two emulated nodes of 2 ranks, replicas on the other node) and to disk every 40:
#   1. one rank SIGKILLed at random moments KILLS times (kills land mid-snapshot, mid-commit,
#      mid-step), restarted each time: restarts resume from the memory tier, and the final parameters
#      are bit-identical to an uninterrupted run;
#   2. killed, then node 0's tier memory deleted (its ranks' own copies and the replicas it held):
#      ranks 0 and 1 are restored from their replicas on node 1; identical at the end;
#   3. killed, then a byte of rank 2's own copy flipped: rank 2 uses its replica; identical;
#   4. killed, then rank 3's own copy and its replica both deleted: every rank resumes from disk
#      together; identical;
#   5. a run that ends normally leaves no tier files behind;
#   6. the optimizer state offloaded to NVMe (each snapshot handed over by the next step, beside the
#      disk saves): one rank killed at random twice, restarted each time; identical at the end.
# usage: tier_kill.sh CHARLM WORKDIR [KILLS]
set -euo pipefail
bin=$1; work=$2; kills=${3:-4}
source "$(dirname "$0")/../support/kill.sh"  # rank_pids
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_btl_vader_single_copy_mechanism=none ZRT_LOG_LEVEL=warn
mpi() { local n=$1; shift; mpirun -n "$n" --oversubscribe --bind-to none "$@"; }
steps=1000
args=(--steps $steps --stage 3 --batch 32 --every 40 --keep-last 2 --print-every 100000)
rm -rf "$work"; mkdir -p "$work/shm"
tier=(--memory-every 1 --memory-dir "$work/shm" --ranks-per-node 2)
extra=()  # more arguments of the killed runs and their finish (the NVMe case)
RANDOM=${ZRT_TEST_SEED:-$$}
# Waits (up to 120 s) until every rank's tier holds a generation, or job $1 ended.
wait_for_tier() {
  for _ in $(seq 1 1200); do
    [ "$(ls -d "$work"/shm/zrt-tier-*/rank-*/own/step-* 2>/dev/null | grep -vc '\.tmp$')" -ge 4 ] && return 0
    kill -0 "$1" 2>/dev/null || return 0
    sleep 0.1
  done
}
# Starts a run on root $1 and SIGKILLs one random rank at a random moment; 0 if it killed one.
run_and_kill() {
  local root=$1 log=$2 job victim
  mpi 4 "$bin" "${args[@]}" "${tier[@]}" "${extra[@]}" --ckpt "$root" > "$log" 2>&1 &
  job=$!
  wait_for_tier $job
  sleep "$((RANDOM % 2)).$((RANDOM % 10))"
  victim=$(rank_pids "charlm.*--ckpt $root$" | shuf -n 1 --random-source=<(yes "$RANDOM") || true)
  local killed=1
  if [ -n "$victim" ] && kill -9 "$victim" 2>/dev/null; then killed=0; fi
  wait $job || true
  return $killed
}
finish() {  # finishes the run on root $1 and compares with the baseline
  mpi 4 "$bin" "${args[@]}" "${tier[@]}" "${extra[@]}" --ckpt "$1" --dump "$work/final.bin" > "$2"
  cmp "$work/base.bin" "$work/final.bin" || { echo "FAIL: $3: the resumed run differs from the uninterrupted one"; exit 1; }
  rm -f "$work/final.bin"
}
tierdir() { ls -d "$work"/shm/zrt-tier-* | head -1; }

echo "== baseline (uninterrupted, no tier)"
mpi 4 "$bin" "${args[@]}" --ckpt "$work/base" --dump "$work/base.bin" > "$work/base.log"
tail -1 "$work/base.log"

echo "== killed $kills times with the tier on, restarted each time"
killed=0; from_memory=0
for attempt in $(seq 1 $((kills * 3))); do
  [ $killed -ge $kills ] && break
  if run_and_kill "$work/run" "$work/run.$attempt.log"; then
    killed=$((killed + 1))
    echo "   attempt $attempt: killed a rank; $(grep -h '^resumed from' "$work/run.$attempt.log" || echo 'fresh start')"
  fi
  grep -q "(memory)" "$work/run.$attempt.log" && from_memory=$((from_memory + 1))
  # A run that ended before the kill came: start the next attempt from scratch.
  if grep -q "^SUMMARY" "$work/run.$attempt.log"; then rm -rf "$work/run"; fi
done
[ $killed -ge 2 ] || { echo "FAIL: managed to kill only $killed runs"; exit 1; }
finish "$work/run" "$work/run.final.log" "kills"
grep -h "^resumed from" "$work/run.final.log"
grep -q "(memory)" "$work/run.final.log" && from_memory=$((from_memory + 1))
[ $from_memory -ge 1 ] || { echo "FAIL: no restart resumed from the memory tier"; exit 1; }
echo "   $from_memory restarts from the memory tier; final parameters identical to the uninterrupted run"
[ -z "$(ls -A "$work/shm")" ] || { echo "FAIL: tier files left after a normal end: $(ls -R "$work/shm" | head)"; exit 1; }
echo "   the run's normal end left no tier files"

echo "== node 0's memory lost"
run_and_kill "$work/node" "$work/node.log" || true
rm -rf "$(tierdir)/rank-00000" "$(tierdir)/rank-00001"
finish "$work/node" "$work/node.final.log" "node loss"
grep -h "^resumed from\|peer's replica" "$work/node.final.log"
if grep -q "(memory)\|(peer)" "$work/node.final.log"; then
  [ "$(grep -c "peer's replica" "$work/node.final.log")" -eq 2 ] || { echo "FAIL: ranks 0 and 1 were not restored from replicas"; exit 1; }
fi
echo "   identical to the uninterrupted run"

echo "== a byte of rank 2's own copy flipped"
run_and_kill "$work/flip" "$work/flip.log" || true
for data in $(ls "$(tierdir)"/rank-00002/own/step-*/rank-*.data | grep -v '\.tmp/'); do  # every whole generation
  printf '\x5a' | dd of="$data" bs=1 seek=4100 conv=notrunc status=none
done
# The newest generation whose replica of rank 2 is whole (on rank 0, two nodes away), and the newest
# disk checkpoint: rank 2 must be served by its replica unless the disk holds a step as new (the kill
# may land after a disk save of step N and before N's replica was whole: then disk N serves everyone).
newest() { ls -d "$@" 2>/dev/null | grep -v '\.tmp' | sed 's/.*step-0*//' | sort -n | tail -1 || true; }
rep=$(newest "$(tierdir)"/rank-00000/replica-00002/step-*); disk=$(newest "$work/flip"/step-*)
finish "$work/flip" "$work/flip.final.log" "corrupt copy"
grep -h "^resumed from\|peer's replica" "$work/flip.final.log"
if [ "${rep:--1}" -gt "${disk:--1}" ]; then
  grep -q "rank 2: its own memory-tier copy was unusable" "$work/flip.final.log" || { echo "FAIL: rank 2 did not use its replica"; exit 1; }
  echo "   rank 2 restored from its replica of step $rep; identical to the uninterrupted run"
else
  echo "   no replica newer than disk step ${disk:-none} (kill at a disk save); identical to the uninterrupted run"
fi

echo "== rank 3's copy and its replica both gone"
run_and_kill "$work/gone" "$work/gone.log" || true
rm -rf "$(tierdir)"/rank-00003/own/step-* "$(tierdir)"/rank-00001/replica-00003/step-*
finish "$work/gone" "$work/gone.final.log" "no copy"
grep -h "^resumed from" "$work/gone.final.log" || true
if grep -q "^resumed from" "$work/gone.final.log"; then
  grep -q "^resumed from .*(disk)" "$work/gone.final.log" || { echo "FAIL: expected every rank to resume from disk"; exit 1; }
fi
echo "   every rank resumed from disk; identical to the uninterrupted run"

echo "== optimizer state on NVMe (snapshots handed over by the next step), killed twice"
extra=(--offload nvme --nvme-dir "$work/swap")
rm -rf "${work:?}"/shm/*; mkdir -p "$work/swap"
killed=0; last_killed=0
for attempt in $(seq 1 6); do
  [ $killed -ge 2 ] && break
  last_killed=0
  if run_and_kill "$work/nvme" "$work/nvme.$attempt.log"; then
    killed=$((killed + 1)); last_killed=1
    echo "   attempt $attempt: killed a rank; $(grep -h '^resumed from' "$work/nvme.$attempt.log" || echo 'fresh start')"
  fi
  if grep -q "^SUMMARY" "$work/nvme.$attempt.log"; then rm -rf "$work/nvme"; fi
done
[ $killed -ge 1 ] || { echo "FAIL: managed to kill no NVMe run"; exit 1; }
finish "$work/nvme" "$work/nvme.final.log" "NVMe-offloaded state"
grep -h "^resumed from" "$work/nvme.final.log" || true
if [ $last_killed -eq 1 ]; then
  grep -q "^resumed from .*(memory)" "$work/nvme.final.log" || { echo "FAIL: the NVMe run did not resume from the memory tier"; exit 1; }
fi
echo "   resumed from the memory tier; identical to the uninterrupted run"
echo "PASS"
