#!/usr/bin/env bash
# examples/gpt with a mixture of experts (--experts 4 --top-k 2, the tiny preset), end to end:
#   1. stages 0-3 at 1, 2 and 3 ranks follow the same loss curve (ZeRO moves state, not results);
#   2. kill -9 of one rank mid-run, twice, and restart: the final weights are the uninterrupted run's,
#      bit for bit; a run saved on 2 ranks resumes on 3 (resharded) to the end;
#   3. it learns: the loss after 120 steps is below 3.6 (from ln 256 = 5.55);
#   4. expert parallelism (--expert-parallel P: P experts' ranks, all-to-all token dispatch, each
#      expert's state over its N / P holders) is the same model: at 2 and 4 ranks and every P
#      dividing 4 experts and the ranks, stages 2 and 3 end at the loss of P = 1 (within 0.5%); with
#      P = 2, killed and resumed bit for bit at 2 ranks, and saved on 2 (one holder per expert)
#      resumed on 4 (two: the experts' data-parallel size changes, EP fixed).
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

echo "== expert parallelism: the loss of every expert on every rank"
for n in 2 4; do
  for stage in 2 3; do
    ref=$(mpi $n "$bin" "${common[@]}" --steps 20 --stage $stage | summary_loss)
    for ep in 2 4; do
      [ $((n % ep)) -eq 0 ] || continue
      loss=$(mpi $n "$bin" "${common[@]}" --steps 20 --stage $stage --expert-parallel $ep | summary_loss)
      [ -n "$loss" ] || { echo "FAIL: no loss from --expert-parallel $ep at $n ranks, stage $stage"; exit 1; }
      python3 -c "import sys; a, b = float('$loss'), float('$ref'); sys.exit(0 if abs(a - b) <= 0.005 * b else 1)" ||
        { echo "FAIL: --expert-parallel $ep at $n ranks, stage $stage ends at loss $loss, every expert local at $ref"; exit 1; }
      echo "   $n ranks, stage $stage, EP $ep: loss $loss (EP 1: $ref)"
    done
  done
done
ep_flags=("${common[@]}" --expert-parallel 2)
killed_and_resumed ep_flags 120 10 1 2 4
