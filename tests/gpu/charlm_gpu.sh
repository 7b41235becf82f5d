#!/usr/bin/env bash
# charlm with the engine on the GPU (one rank per GPU): an uninterrupted run, and the same run SIGKILLed
# after a checkpoint and restarted, must end with bit-identical parameters (GPU steps are
# deterministic); the CPU engine's final loss is printed beside the GPU one.
# usage: charlm_gpu.sh CHARLM WORKDIR [RANKS]
set -euo pipefail
bin=$1; work=$2; n=${3:-1}
mpi() { mpirun -n "$n" --oversubscribe --bind-to none "$@"; }
args=(--steps 400 --stage 3 --batch 64 --every 10 --keep-last 2 --print-every 100000)
export ZRT_LOG_LEVEL=warn
rm -rf "$work"; mkdir -p "$work"

mpi "$bin" --device cuda "${args[@]}" --ckpt "$work/base" --dump "$work/base.bin" > "$work/base.log"
echo "gpu:         $(tail -1 "$work/base.log")"
mpi "$bin" --device cuda "${args[@]}" --ckpt "$work/run" > "$work/run.1.log" 2>&1 &
job=$!
for _ in $(seq 1 600); do [ -f "$work/run/latest" ] || ! kill -0 $job 2>/dev/null && break; sleep 0.05; done
sleep 0.3
pkill -9 -f "charlm.*$work/run" -n && echo "killed a rank of the second run ($(ls "$work/run" | tr '\n' ' '))" || true
wait $job || true
mpi "$bin" --device cuda "${args[@]}" --ckpt "$work/run" --dump "$work/run.bin" > "$work/run.final.log"
echo "gpu resumed: $(tail -1 "$work/run.final.log")"
cmp "$work/base.bin" "$work/run.bin" || { echo "FAIL: the killed-and-resumed GPU run differs from the uninterrupted one"; exit 1; }
mpi "$bin" --device cpu "${args[@]}" --dump "$work/cpu.bin" > "$work/cpu.log"
echo "cpu:         $(tail -1 "$work/cpu.log")"
echo "PASS"
