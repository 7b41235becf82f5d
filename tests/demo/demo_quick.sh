#!/usr/bin/env bash
# The README's first command, short: `scripts/demo --quick` on the binaries of this build (train gpt
# small on 4 ranks, kill a rank, resume resharded on 2, ls / verify / inspect), so the suite fails
# whenever the demo would. Checks its status and that its summary says what happened.
# usage: demo_quick.sh SOURCE_DIR BUILD_DIR WORKDIR
set -uo pipefail
src=$1; build=$2; work=$3
fail() { echo "FAIL: $*"; exit 1; }
bash "$src/scripts/demo" --quick --build "$build" --work "$work" > "$work.log" 2>&1; code=$?
cat "$work.log"
[ "$code" = 0 ] || fail "scripts/demo --quick exited $code"
summary=$(sed -n '/^== summary/,$p' "$work.log")
grep -q "steps trained: *12 (killed after step [0-9]* on 4 ranks; resumed at step [0-9]* on 2 ranks)" <<< "$summary" || fail "no summary of the kill and resume"
resumed=$(sed -n 's/.*resumed at step \([0-9]*\) on 2 ranks.*/\1/p' <<< "$summary")
{ [ "$resumed" -gt 0 ] && [ "$resumed" -lt 12 ]; } || fail "resumed at step '$resumed': the kill did not interrupt training"
grep -q "saved by 4 ranks, loaded by 2" <<< "$summary" || fail "not resharded 4 -> 2"
grep -q "^OK: .*chunks verified" "$work.log" || fail "zrt ckpt verify did not pass"
grep -q "format v1, step 12, saved by 2 rank(s)" "$work.log" || fail "zrt ckpt inspect did not show the final checkpoint"
[ -s "$work/loss_4ranks.dat" ] && [ -s "$work/loss_2ranks.dat" ] || fail "no loss curve data"
grep -q "loss curve:" <<< "$summary" || fail "the summary does not say where the loss curve is"
echo "PASS"
