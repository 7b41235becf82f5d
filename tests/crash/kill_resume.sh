#!/usr/bin/env bash
# Resume-after-failure, end to end (DESIGN.md: "a job killed at any instant restarts from the newest
# complete checkpoint and continues exactly as if nothing had happened").
#   1. baseline: a 4-rank charlm run, uninterrupted, dumps its final parameters;
#   2. the same run, SIGKILLed (one rank, at random moments, saves every few steps so kills land
#      mid-save too) KILLS times and restarted each time: the final parameters must be bit-identical;
#   3. preemption: SIGUSR1 to one rank makes every rank save at the next step boundary and exit 0;
#   4. each placement of the optimizer state (engine memory, host memory, NVMe: state and parameter
#      shards in swap files, the dead run's are scratch: cleared) with a save every step: killed in the
#      middle of a capture, restarted, final parameters identical to the in-memory baseline; and q8
#      moments (saved as kept) in memory and on NVMe likewise against the q8 baseline;
#   5. hybrid sharding (S = 2) killed twice at random moments, restarted, identical to its own baseline;
#      a 4-rank run killed, then resumed on 2 ranks (resharded) runs to the end;
#   6. SIGTERM to the launcher (scripts/zrt-mpirun, the documented recipe): every rank saves, the job
#      exits 0, and the resumed run is bit-identical to the baseline.
# usage: kill_resume.sh CHARLM WORKDIR [KILLS]
set -euo pipefail
bin=$1; work=$2; kills=${3:-4}
source "$(dirname "$0")/../support/kill.sh"  # rank_pids
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_btl_vader_single_copy_mechanism=none ZRT_LOG_LEVEL=warn
mpi() { local n=$1; shift; mpirun -n "$n" --oversubscribe --bind-to none "$@"; }
# Waits (up to 120 s) until a checkpoint has been committed under $1 (one newer than what `latest`
# said before, $3, when given) or job $2 ended, so the random kill below lands after there is
# something to resume from, however slow the build (sanitizers).
wait_for_checkpoint() {
  for _ in $(seq 1 1200); do
    [ -f "$1/latest" ] && [ "$(cat "$1/latest" 2>/dev/null || true)" != "${3:-}" ] && return 0
    kill -0 "$2" 2>/dev/null || return 0
    sleep 0.1
  done
}
# SIGKILLs one random rank process of the job matching $1; says which, and what $2 held then.
kill_random_rank() {
  local victim
  victim=$(rank_pids "$1" | shuf -n 1 --random-source=<(yes "$RANDOM") || true)
  [ -n "$victim" ] && kill -9 "$victim" 2>/dev/null || return 1
  echo "   killed rank process $victim ($(ls "$2" 2>/dev/null | tr '\n' ' '))"
}
steps=240
args=(--steps $steps --stage 3 --batch 32 --every 4 --keep-last 2 --print-every 100000)
rm -rf "$work"; mkdir -p "$work"
RANDOM=${ZRT_TEST_SEED:-$$}

echo "== baseline (uninterrupted)"
mpi 4 "$bin" "${args[@]}" --ckpt "$work/base" --dump "$work/base.bin" > "$work/base.log"
tail -1 "$work/base.log"

echo "== killed $kills times, restarted each time"
killed=0
for attempt in $(seq 1 $((kills * 3))); do
  [ $killed -ge $kills ] && break
  mpi 4 "$bin" "${args[@]}" --ckpt "$work/run" --dump "$work/run.bin" > "$work/run.$attempt.log" 2>&1 &
  job=$!
  wait_for_checkpoint "$work/run" $job
  sleep "0.$((RANDOM % 6))"
  kill_random_rank "charlm.*$work/run " "$work/run" && killed=$((killed + 1))
  wait $job || true
  rm -f "$work/run.bin"  # only a run that finishes cleanly may leave the dump
done
[ $killed -ge 1 ] || { echo "FAIL: never managed to kill a rank"; exit 1; }
mpi 4 "$bin" "${args[@]}" --ckpt "$work/run" --dump "$work/run.bin" > "$work/run.final.log"
tail -1 "$work/run.final.log"
grep -q "resumed_from=$work/run/step-" "$work/run.final.log" || { echo "FAIL: the final run did not resume"; exit 1; }
cmp "$work/base.bin" "$work/run.bin" || { echo "FAIL: the killed-and-resumed run differs from the baseline"; exit 1; }
echo "   final parameters identical to the uninterrupted run"

echo "== preemption (SIGUSR1 to one rank)"
mpi 4 "$bin" "${args[@]}" --ckpt "$work/pre" > "$work/pre.log" 2>&1 &
job=$!
wait_for_checkpoint "$work/pre" $job
kill -USR1 "$(rank_pids "charlm.*$work/pre" | tail -1)" 2>/dev/null || true
wait $job || { echo "FAIL: a preempted run must exit 0"; cat "$work/pre.log"; exit 1; }
if grep -q "^preempted" "$work/pre.log"; then
  grep "^preempted" "$work/pre.log"
  mpi 4 "$bin" "${args[@]}" --ckpt "$work/pre" --dump "$work/pre.bin" > "$work/pre.final.log"
  cmp "$work/base.bin" "$work/pre.bin" || { echo "FAIL: the preempted-and-resumed run differs"; exit 1; }
  echo "   resumed after preemption; identical to the uninterrupted run"
else
  echo "   (the run finished before the signal arrived)"
fi

# Runs charlm with a save every step under root $1, kills a random rank twice at random moments (each
# step's capture streams while the next step runs, NVMe state handed over by the next step, so every
# kill lands in the middle of one), restarts, and compares the final parameters with the dump $2.
# The rest: charlm's arguments.
killed_twice() {
  local root=$1 base=$2 pkilled=0 before job
  shift 2
  for attempt in 1 2 3 4; do
    [ $pkilled -ge 2 ] && break
    before=$(cat "$root/latest" 2>/dev/null || true)
    mpi 4 "$bin" "$@" --ckpt "$root" > "$root.$attempt.log" 2>&1 &
    job=$!
    wait_for_checkpoint "$root" $job "$before"  # one of this run's own
    sleep "0.$((RANDOM % 6))"
    kill_random_rank "charlm.*$root" "$root" && pkilled=$((pkilled + 1))
    wait $job || true
  done
  [ $pkilled -ge 1 ] || { echo "FAIL: never managed to kill a rank ($root)"; exit 1; }
  mpi 4 "$bin" "$@" --ckpt "$root" --dump "$root.bin" > "$root.final.log"
  grep -q "resumed_from=$root/step-" "$root.final.log" || { echo "FAIL: $root did not resume"; exit 1; }
  tail -1 "$root.final.log"
  cmp "$base" "$root.bin" || { echo "FAIL: the resumed run ($root) differs from its baseline"; exit 1; }
  echo "   final parameters identical to the uninterrupted run"
}

# Each placement of the optimizer state (engine memory, host memory, NVMe swap files), a save every
# step, killed twice mid-capture: identical to the in-memory baseline.
mkdir -p "$work/swap"
nargs=(--steps $steps --stage 3 --batch 32 --every 1 --keep-last 2 --print-every 100000)
for placement in none host nvme; do
  echo "== optimizer state in $placement memory: killed mid-capture twice, restarted, identical to the baseline"
  off=(--offload "$placement")
  [ "$placement" = nvme ] && off+=(--nvme-dir "$work/swap")
  killed_twice "$work/at-$placement" "$work/base.bin" "${nargs[@]}" "${off[@]}"
done
# q8 and q4 moments (compact state: the saves stage and write the codes and scales as the optimizer
# keeps them, from memory or as the step streams them from NVMe; q4's two codes a byte in the swap
# files), killed twice mid-capture: identical to the uninterrupted run of the same precision.
for moments in q8 q4; do
  mpi 4 "$bin" "${nargs[@]}" --moments $moments --ckpt "$work/$moments-base" --dump "$work/$moments-base.bin" > "$work/$moments-base.log"
  placements="none nvme"
  [ $moments = q4 ] && placements=nvme  # q4 in memory takes q8's paths; the swap files' half bytes are its own
  for placement in $placements; do
    echo "== $moments moments in $placement memory: killed mid-capture twice, restarted, identical to the $moments baseline"
    off=(--offload "$placement")
    [ "$placement" = nvme ] && off+=(--nvme-dir "$work/swap")
    killed_twice "$work/$moments-at-$placement" "$work/$moments-base.bin" "${nargs[@]}" --moments $moments "${off[@]}"
  done
done
[ -z "$(ls -A "$work/swap")" ] || { echo "FAIL: swap files left behind: $(ls -R "$work/swap")"; exit 1; }

# Hybrid sharding (S = 2: two replica groups), a save every step: killed twice at random moments (a
# replica mid-capture or a shard's only writer mid-write), restarted, identical to its own baseline.
echo "== hybrid sharding (S = 2): killed twice, restarted, identical to the uninterrupted hybrid run"
hargs=(--steps $steps --stage 3 --shard-group-size 2 --batch 32 --every 1 --keep-last 2 --print-every 100000)
mpi 4 "$bin" "${hargs[@]}" --ckpt "$work/hybrid-base" --dump "$work/hybrid-base.bin" > "$work/hybrid-base.log"
root="$work/hybrid"
hkilled=0
for attempt in 1 2 3 4; do
  [ $hkilled -ge 2 ] && break
  before=$(cat "$root/latest" 2>/dev/null || true)
  mpi 4 "$bin" "${hargs[@]}" --ckpt "$root" > "$root.$attempt.log" 2>&1 &
  job=$!
  wait_for_checkpoint "$root" $job "$before"
  sleep "0.$((RANDOM % 6))"
  kill_random_rank "charlm.*$root" "$root" && hkilled=$((hkilled + 1))
  wait $job || true
done
[ $hkilled -ge 1 ] || { echo "FAIL: never managed to kill a rank (hybrid)"; exit 1; }
mpi 4 "$bin" "${hargs[@]}" --ckpt "$root" --dump "$root.bin" > "$root.final.log"
grep -q "resumed_from=$root/step-" "$root.final.log" || { echo "FAIL: the hybrid run did not resume"; exit 1; }
tail -1 "$root.final.log"
cmp "$work/hybrid-base.bin" "$root.bin" || { echo "FAIL: the resumed hybrid run differs from its baseline"; exit 1; }
echo "   final parameters identical to the uninterrupted hybrid run"

echo "== killed on 4 ranks, resumed on 2"
mpi 4 "$bin" "${args[@]}" --ckpt "$work/reshard" > "$work/reshard.log" 2>&1 &
job=$!
wait_for_checkpoint "$work/reshard" $job
kill -9 "$(rank_pids "charlm.*$work/reshard" | tail -1)" 2>/dev/null || true
wait $job || true
mpi 2 "$bin" "${args[@]}" --ckpt "$work/reshard" > "$work/reshard.final.log"
grep -h "^resumed from" "$work/reshard.final.log" || true
tail -1 "$work/reshard.final.log"
grep -q "SUMMARY steps=$steps" "$work/reshard.final.log" || { echo "FAIL: the 2-rank resume did not finish"; exit 1; }
echo "== SIGTERM to the launcher (zrt-mpirun)"
launcher="$(cd "$(dirname "$0")/../.." && pwd)/scripts/zrt-mpirun"
"$launcher" -n 4 --oversubscribe --bind-to none "$bin" "${args[@]}" --ckpt "$work/term" > "$work/term.log" 2>&1 &
job=$!
wait_for_checkpoint "$work/term" $job
kill -TERM $job
wait $job || { echo "FAIL: SIGTERM to zrt-mpirun must end in a save and exit 0"; cat "$work/term.log"; exit 1; }
if grep -q "^preempted" "$work/term.log"; then
  grep "^preempted" "$work/term.log"
  mpi 4 "$bin" "${args[@]}" --ckpt "$work/term" --dump "$work/term.bin" > "$work/term.final.log"
  cmp "$work/base.bin" "$work/term.bin" || { echo "FAIL: the run stopped by SIGTERM and resumed differs"; exit 1; }
  echo "   saved on SIGTERM, exit 0, resumed identical to the uninterrupted run"
else
  echo "   (the run finished before the signal arrived)"
fi
echo "PASS"
