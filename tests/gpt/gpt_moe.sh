#!/usr/bin/env bash
# examples/gpt with a mixture of experts (--experts 4 --top-k 2, the tiny preset), end to end:
#   1. stages 0-3 at 1, 2 and 3 ranks follow the same loss curve (ZeRO moves state, not results);
#   2. kill -9 of one rank mid-run, twice, and restart: the final weights are the uninterrupted run's,
#      bit for bit; a run saved on 2 ranks resumes on 3 (resharded) to the end;
#   3. it learns: the loss after 120 steps is below 3.6 (from ln 256 = 5.55).
# usage: gpt_moe.sh GPT WORKDIR
set -euo pipefail
bin=$1; work=$2
source "$(dirname "$0")/e2e_lib.sh"
rm -rf "$work"; mkdir -p "$work"
RANDOM=${ZRT_TEST_SEED:-$$}
common=(--preset tiny --experts 4 --top-k 2 --batch 4 --accum 2 --lr 3e-3 --sample 0 --print-every 1000 --val-every 0)

stages_agree common 20 1 2 3
killed_and_resumed common 300 10 2

echo "== it learns"
loss=$(mpi 2 "$bin" "${common[@]}" --steps 120 | summary_loss)
python3 -c "import sys; sys.exit(0 if float('$loss') < 3.6 else 1)" || { echo "FAIL: loss $loss after 120 steps (want < 3.6)"; exit 1; }
echo "   loss $loss after 120 steps"
