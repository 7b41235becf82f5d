#!/usr/bin/env bash
# examples/gpt end to end (tiny preset):
#   1. stages 0-3 at 1-4 ranks follow the same loss curve (same data per rank; ZeRO only changes
#      where state lives: the final losses agree to bf16 rounding);
#   2. kill -9 of one rank, at random moments after a checkpoint, and restart: the final weights are
#      the uninterrupted run's, bit for bit; a run killed on 2 ranks resumes on 3 (resharded) to the end;
#   3. the tiny preset learns: validation loss under 3.0 (from ln 256 = 5.55) within 300 steps.
# usage: gpt_e2e.sh GPT WORKDIR
set -euo pipefail
bin=$1; work=$2
source "$(dirname "$0")/e2e_lib.sh"
rm -rf "$work"; mkdir -p "$work"
RANDOM=${ZRT_TEST_SEED:-$$}
common=(--preset tiny --batch 4 --accum 2 --lr 3e-3 --sample 0 --print-every 1000 --val-every 0)

stages_agree common 25 1 2 3 4
killed_and_resumed common 120 5 3

echo "== the tiny preset learns"
mpi 2 "$bin" --preset tiny --steps 300 --lr 3e-3 --print-every 1000 --val-every 300 --sample 0 > "$work/learn.log"
val=$(sed -n 's/^step .* validation loss //p' "$work/learn.log" | tail -1)
python3 -c "import sys; sys.exit(0 if float('$val') < 3.0 else 1)" || { echo "FAIL: validation loss $val after 300 steps (want < 3.0)"; exit 1; }
echo "   validation loss $val after 300 steps"
