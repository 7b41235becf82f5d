#!/usr/bin/env bash
# examples/gpt end to end (tiny preset):
#   1. stages 0-3 at 1-4 ranks follow the same loss curve (same data per rank; ZeRO only changes
#      where state lives: the final losses agree to bf16 rounding);
#   2. kill -9 of one rank, at random moments after a checkpoint, and restart: the final weights are
#      the uninterrupted run's, bit for bit; a run killed on 2 ranks resumes on 3 (resharded) to the end;
#   3. the tiny preset learns: validation loss under 3.0 (from ln 256 = 5.55) within 300 steps.
# usage: gpt_e2e.sh GPT WORKDIR
set -euo pipefail
source "$(dirname "$0")/../support/kill.sh"
bin=$1; work=$2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 ZRT_LOG_LEVEL=warn
mpi() { local n=$1; shift; mpirun -n "$n" --oversubscribe --bind-to none "$@"; }
rm -rf "$work"; mkdir -p "$work"
RANDOM=${ZRT_TEST_SEED:-$$}
common=(--preset tiny --batch 4 --accum 2 --lr 3e-3 --sample 0 --print-every 1000 --val-every 0)

echo "== stages 0-3 at 1-4 ranks"
for n in 1 2 3 4; do
  ref=""
  for stage in 0 1 2 3; do
    loss=$(mpi $n "$bin" "${common[@]}" --steps 25 --stage $stage | sed -n 's/^SUMMARY steps=[0-9]* loss=\([0-9.]*\).*/\1/p')
    [ -n "$loss" ] || { echo "FAIL: no loss from stage $stage at $n ranks"; exit 1; }
    [ -z "$ref" ] && ref=$loss
    python3 -c "import sys; a, b = float('$loss'), float('$ref'); sys.exit(0 if abs(a - b) <= 0.01 * b else 1)" ||
      { echo "FAIL: stage $stage at $n ranks ends at loss $loss, stage 0 at $ref"; exit 1; }
    echo "   $n ranks, stage $stage: loss $loss"
  done
done

echo "== killed and resumed, bit for bit"
save=("${common[@]}" --stage 3 --every 5 --keep-last 2)
args=("${save[@]}" --steps 120)
mpi 2 "$bin" "${args[@]}" --ckpt "$work/base" --dump "$work/base.bin" > "$work/base.log"
killed=0
for attempt in $(seq 1 9); do
  [ $killed -ge 3 ] && break
  mpi 2 "$bin" "${args[@]}" --ckpt "$work/run" --dump "$work/run.bin" > "$work/run.$attempt.log" 2>&1 &
  job=$!
  kill_after_checkpoint "$work/run" "gpt.*$work/run " $job && killed=$((killed + 1))
  wait $job || true
  rm -f "$work/run.bin"
done
[ $killed -ge 1 ] || { echo "FAIL: never managed to kill a rank"; exit 1; }
mpi 2 "$bin" "${args[@]}" --ckpt "$work/run" --dump "$work/run.bin" > "$work/run.final.log"
grep -q "^resumed from $work/run/step-" "$work/run.final.log" || { echo "FAIL: the final run did not resume"; exit 1; }
cmp "$work/base.bin" "$work/run.bin" || { echo "FAIL: the killed-and-resumed run differs from the uninterrupted one"; exit 1; }
echo "   final weights identical to the uninterrupted run"
mpi 2 "$bin" "${save[@]}" --steps 60 --ckpt "$work/reshard" > /dev/null
mpi 3 "$bin" "${args[@]}" --ckpt "$work/reshard" > "$work/reshard.log"
grep -q "^resumed from $work/reshard/step-00000060 (saved by 2 ranks" "$work/reshard.log" || { echo "FAIL: no resume on 3 ranks"; cat "$work/reshard.log"; exit 1; }
grep -q "^SUMMARY steps=120" "$work/reshard.log" || { echo "FAIL: the resharded run did not finish"; exit 1; }
echo "   saved on 2 ranks, resumed on 3, finished"

echo "== the tiny preset learns"
mpi 2 "$bin" --preset tiny --steps 300 --lr 3e-3 --print-every 1000 --val-every 300 --sample 0 > "$work/learn.log"
val=$(sed -n 's/^step .* validation loss //p' "$work/learn.log" | tail -1)
python3 -c "import sys; sys.exit(0 if float('$val') < 3.0 else 1)" || { echo "FAIL: validation loss $val after 300 steps (want < 3.0)"; exit 1; }
echo "   validation loss $val after 300 steps"
