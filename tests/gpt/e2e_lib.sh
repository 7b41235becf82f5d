# Sourced by tests/gpt/gpt_e2e.sh and gpt_moe.sh: the checks both run on examples/gpt. Each takes the
# gpt binary in $bin, the work directory in $work and the common flags in the array named by $1.
source "$(dirname "${BASH_SOURCE[0]}")/../support/kill.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 ZRT_LOG_LEVEL=warn
mpi() { local n=$1; shift; timeout 600 mpirun -n "$n" --oversubscribe --bind-to none "$@"; }
summary_loss() { sed -n 's/^SUMMARY steps=[0-9]* loss=\([0-9.]*\).*/\1/p'; }

# stages_agree FLAGS STEPS RANKS...: stages 0-3 end at the same loss (within 1%) at each rank count.
stages_agree() {
  local -n flags=$1; local steps=$2; shift 2
  local n stage loss ref
  echo "== stages 0-3 at $* ranks"
  for n in "$@"; do
    ref=""
    for stage in 0 1 2 3; do
      loss=$(mpi "$n" "$bin" "${flags[@]}" --steps "$steps" --stage $stage | summary_loss)
      [ -n "$loss" ] || { echo "FAIL: no loss from stage $stage at $n ranks"; exit 1; }
      [ -z "$ref" ] && ref=$loss
      python3 -c "import sys; a, b = float('$loss'), float('$ref'); sys.exit(0 if abs(a - b) <= 0.01 * b else 1)" ||
        { echo "FAIL: stage $stage at $n ranks ends at loss $loss, stage 0 at $ref"; exit 1; }
      echo "   $n ranks, stage $stage: loss $loss"
    done
  done
}

# killed_and_resumed FLAGS STEPS EVERY KILLS [RANKS [MORE]]: a RANKS-rank run (2) with a rank killed
# (-9, at random moments after a checkpoint) up to KILLS times ends with the uninterrupted run's
# weights bit for bit; then a run saved on RANKS ranks at STEPS / 2 resumes on MORE (3, resharded) to
# the end.
killed_and_resumed() {
  local -n flags=$1; local steps=$2 every=$3 kills=$4 n=${5:-2} more=${6:-3}
  local save=("${flags[@]}" --stage 3 --every "$every" --keep-last 2) killed=0 attempt job
  local args=("${save[@]}" --steps "$steps")
  rm -rf "$work/base" "$work/run" "$work/reshard"
  echo "== killed and resumed at $n ranks, bit for bit"
  mpi "$n" "$bin" "${args[@]}" --ckpt "$work/base" --dump "$work/base.bin" > "$work/base.log"
  for attempt in $(seq 1 $((3 * kills))); do
    [ $killed -ge "$kills" ] && break
    mpi "$n" "$bin" "${args[@]}" --ckpt "$work/run" --dump "$work/run.bin" > "$work/run.$attempt.log" 2>&1 &
    job=$!
    kill_after_checkpoint "$work/run" "gpt.*$work/run " $job || true
    wait $job || true
    grep -q "^SUMMARY" "$work/run.$attempt.log" || killed=$((killed + 1))  # it died before the end
    rm -f "$work/run.bin"
  done
  [ $killed -ge 1 ] || { echo "FAIL: never managed to kill a rank before the run ended"; exit 1; }
  mpi "$n" "$bin" "${args[@]}" --ckpt "$work/run" --dump "$work/run.bin" > "$work/run.final.log"
  grep -q "^resumed from $work/run/step-" "$work/run.final.log" || { echo "FAIL: the final run did not resume"; exit 1; }
  cmp "$work/base.bin" "$work/run.bin" || { echo "FAIL: the killed-and-resumed run differs from the uninterrupted one"; exit 1; }
  echo "   final weights identical to the uninterrupted run ($killed kills)"
  local half=$((steps / 2))
  mpi "$n" "$bin" "${save[@]}" --steps $half --ckpt "$work/reshard" > /dev/null
  mpi "$more" "$bin" "${args[@]}" --ckpt "$work/reshard" > "$work/reshard.log" 2>&1
  grep -q "^resumed from $work/reshard/step-$(printf %08d $half) (saved by $n ranks" "$work/reshard.log" ||
    { echo "FAIL: no resume on $more ranks"; cat "$work/reshard.log"; exit 1; }
  grep -q "^SUMMARY steps=$steps" "$work/reshard.log" || { echo "FAIL: the resharded run did not finish"; exit 1; }
  echo "   saved on $n ranks, resumed on $more, finished"
}
