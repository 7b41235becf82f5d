#!/usr/bin/env bash
# The getting-started trainer (examples/mlp) killed and resumed: 2-rank runs SIGKILLed (one rank, at
# random moments after the first checkpoint, so kills land mid-save too) and restarted must end with
# the uninterrupted run's weights, bit for bit.
# usage: mlp_kill_resume.sh MLP CONFIG WORKDIR
set -euo pipefail
source "$(dirname "$0")/../support/kill.sh"
bin=$1; config=$2; work=$3
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 ZRT_LOG_LEVEL=warn
mpi() { mpirun -n 2 --oversubscribe --bind-to none "$@"; }
rm -rf "$work"; mkdir -p "$work"
RANDOM=${ZRT_TEST_SEED:-$$}
# A longer run than the example's, so that kills land inside it.
sed 's/"steps": 200/"steps": 1500/; s/"total_steps": 200/"total_steps": 1500/' "$config" > "$work/config.json"
grep -q '"steps": 1500' "$work/config.json" || { echo "FAIL: could not lengthen $config"; exit 1; }
mpi "$bin" --config "$work/config.json" --ckpt "$work/base" --dump "$work/base.bin" > "$work/base.log"
tail -1 "$work/base.log"
killed=0
for attempt in $(seq 1 9); do
  [ $killed -ge 3 ] && break
  mpi "$bin" --config "$work/config.json" --ckpt "$work/run" --dump "$work/run.bin" > "$work/run.$attempt.log" 2>&1 &
  job=$!
  kill_after_checkpoint "$work/run" "mlp.*$work/run " $job && killed=$((killed + 1))
  wait $job || true
  rm -f "$work/run.bin"  # only a run that finishes cleanly may leave the dump
done
[ $killed -ge 1 ] || { echo "FAIL: never managed to kill a rank"; exit 1; }
mpi "$bin" --config "$work/config.json" --ckpt "$work/run" --dump "$work/run.bin" > "$work/run.final.log"
grep -q "^resumed from $work/run/step-" "$work/run.final.log" || { echo "FAIL: the final run did not resume"; cat "$work/run.final.log"; exit 1; }
cmp "$work/base.bin" "$work/run.bin" || { echo "FAIL: the killed-and-resumed run differs from the uninterrupted one"; exit 1; }
echo "killed $killed times and resumed: final weights identical to the uninterrupted run"
