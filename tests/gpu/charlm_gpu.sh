#!/usr/bin/env bash
# charlm with the engine on the GPU (one rank per GPU): an uninterrupted run, and the same run SIGKILLed
# after a checkpoint and restarted, must end with bit-identical parameters (GPU steps are
# deterministic); the CPU engine's final loss is printed beside the GPU one.
# usage: charlm_gpu.sh CHARLM WORKDIR [RANKS]
set -euo pipefail
bin=$1; work=$2; n=${3:-1}
mpi() { mpirun -n "$n" --oversubscribe --bind-to none "$@"; }
# Runs charlm with its output in LOG (the first argument); on failure shows the end of it.
run() { local log=$1; shift; mpi "$bin" "$@" > "$log" 2>&1 || { grep -h "^charlm:" "$log" || tail -5 "$log"; echo "FAIL: charlm $*"; exit 1; }; }
args=(--steps 400 --stage 3 --batch 64 --every 10 --keep-last 2 --print-every 100000)
export ZRT_LOG_LEVEL=warn
rm -rf "$work"; mkdir -p "$work"

run "$work/base.log" --device cuda "${args[@]}" --ckpt "$work/base" --dump "$work/base.bin"
echo "gpu:         $(tail -1 "$work/base.log")"
mpi "$bin" --device cuda "${args[@]}" --ckpt "$work/run" > "$work/run.1.log" 2>&1 &
job=$!
for _ in $(seq 1 600); do [ -f "$work/run/latest" ] || ! kill -0 $job 2>/dev/null && break; sleep 0.05; done
sleep 0.3
pkill -9 -f "charlm.*$work/run" -n && echo "killed a rank of the second run ($(ls "$work/run" | tr '\n' ' '))" || true
wait $job || true
run "$work/run.final.log" --device cuda "${args[@]}" --ckpt "$work/run" --dump "$work/run.bin"
echo "gpu resumed: $(tail -1 "$work/run.final.log")"
cmp "$work/base.bin" "$work/run.bin" || { echo "FAIL: the killed-and-resumed GPU run differs from the uninterrupted one"; exit 1; }
run "$work/cpu.log" --device cpu "${args[@]}" --dump "$work/cpu.bin"
echo "cpu:         $(tail -1 "$work/cpu.log")"
echo "PASS"
