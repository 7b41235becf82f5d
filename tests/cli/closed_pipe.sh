#!/usr/bin/env bash
# Every `zrt` command whose reader goes away (`zrt ... | head -1`, or a reader gone before the first
# byte) stops quietly: exit 0 (all its output fitted in the pipe) or 141 (cut), nothing on stderr, never
# killed by SIGPIPE halfway, and a command that writes files leaves a complete result and no temporary
# files; a command's own verdict (diff: they differ) still decides the status; any other write error
# (a full disk) is exit 1 with a message (docs/cli.md "Exit codes").
# usage: closed_pipe.sh ZRT CHARLM WORKDIR
set -uo pipefail
zrt=$1; charlm=$2; work=$3
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_btl_vader_single_copy_mechanism=none ZRT_LOG_LEVEL=warn
fail() { echo "FAIL: $*"; exit 1; }
rm -rf "$work"; mkdir -p "$work"

# Runs "$@" with its stdout a pipe whose read end is already closed: the first write fails (EPIPE)
# every time, unlike `| head`, where the command may finish before head exits. Python starts the
# command with SIGPIPE at its default action (restore_signals), as a shell would.
closed_reader() {
  /usr/bin/python3 - "$@" <<'PY'
import os, subprocess, sys
r, w = os.pipe()
os.close(r)
p = subprocess.run(sys.argv[1:], stdout=w, stderr=subprocess.PIPE)
sys.stderr.buffer.write(p.stderr)
sys.exit(128 - p.returncode if p.returncode < 0 else p.returncode)  # killed by signal N: 128 + N
PY
}

# check NAME CODE STDERR_FILE: exit code 0 or 141 and an empty stderr.
check() {
  local name=$1 code=$2 err=$3
  { [ "$code" = 0 ] || [ "$code" = 141 ]; } || { cat "$err"; fail "$name: exit $code (want 0 or 141)"; }
  [ ! -s "$err" ] || { cat "$err"; fail "$name: printed on stderr"; }
  echo "   $name: exit $code, quiet"
}

mpirun -n 3 --oversubscribe --bind-to none "$charlm" --steps 10 --every 5 --stage 2 --print-every 1000 \
  --ckpt "$work/ck" > "$work/train.log" 2>&1 || { cat "$work/train.log"; fail "training run"; }
a="$work/ck/step-00000005"; b="$work/ck/step-00000010"
"$zrt" ckpt inspect "$b" --stats | wc -c > "$work/bytes"  # output sizes, for the record
echo "== inspect --stats prints $(cat "$work/bytes") bytes"

printing=(
  "ls|ckpt ls $work/ck"
  "ls --json|ckpt ls --json $work/ck"
  "inspect --stats|ckpt inspect $b --stats"
  "inspect --json --stats|ckpt inspect --json $b --stats"
  "verify|ckpt verify $b"
  "diff (identical)|ckpt diff $b $b"
  "plan|plan --params 7e9 --gpus 64"
  "plan --json|plan --json --params 7e9 --gpus 64"
  "help|--help"
)
echo "== printing commands, into head -1 and into a reader gone before the first byte"
for entry in "${printing[@]}"; do
  name=${entry%%|*}; read -r -a args <<< "${entry#*|}"
  "$zrt" "${args[@]}" 2> "$work/err" | head -1 > "$work/first"
  check "$name | head -1" "${PIPESTATUS[0]}" "$work/err"
  [ -s "$work/first" ] || fail "$name: head got no line"
  closed_reader "$zrt" "${args[@]}" 2> "$work/err"
  check "$name, reader gone" $? "$work/err"
done

# A command's own verdict wins over a cut output: diff of different steps still exits 1 and says why.
closed_reader "$zrt" ckpt diff "$a" "$b" > /dev/null 2> "$work/err"; code=$?
[ "$code" = 1 ] && grep -q "elements differ" "$work/err" || { cat "$work/err"; fail "diff of different steps, reader gone: exit $code"; }
echo "   diff (different), reader gone: exit 1, says why"

# Any other write error is a failure, never a quiet end: the output the caller asked for is incomplete.
"$zrt" ckpt inspect "$b" --stats > /dev/full 2> "$work/err"; code=$?
[ "$code" = 1 ] && grep -q "writing the output: No space left on device" "$work/err" || { cat "$work/err"; fail "inspect > /dev/full: exit $code"; }
echo "   inspect > /dev/full: exit 1, says why"

echo "== commands that write files, reader gone: the result is complete, nothing temporary left"
closed_reader "$zrt" ckpt reshard "$b" "$work/re" --world-size 2 2> "$work/err"; check "reshard" $? "$work/err"
closed_reader "$zrt" ckpt export "$b" "$work/model.h5" --states all 2> "$work/err"; check "export hdf5" $? "$work/err"
closed_reader "$zrt" ckpt export "$b" "$work/model.safetensors" 2> "$work/err"; check "export safetensors" $? "$work/err"
closed_reader "$zrt" ckpt import "$work/model.h5" "$work/imp" --world-size 4 2> "$work/err"; check "import" $? "$work/err"
for d in "$work/re/step-00000010" "$work/imp/step-00000010"; do
  "$zrt" ckpt verify "$d" > /dev/null || fail "$d does not verify"
  "$zrt" ckpt diff "$b" "$d" > /dev/null || fail "$d differs from $b"
done
/usr/bin/python3 -c "import h5py; f = h5py.File('$work/model.h5'); assert 'params' in f and 'optimizer' in f" || fail "model.h5 unreadable"
leftovers=$(find "$work/re" "$work/imp" "$work" -maxdepth 2 \( -name '*.tmp*' -o -name '.*tmp*' -o -name '*.partial*' \) -print)
[ -z "$leftovers" ] || fail "temporary files left: $leftovers"
echo "PASS"
