#!/usr/bin/env bash
# The zrt binary end to end on checkpoints written by a 3-rank training run: ls, inspect (--json),
# verify, reshard (then a 2-rank run resumes from the resharded copy), diff, plan; exit codes
# 0 ok / 1 problem / 2 usage; corrupted and missing inputs.
# usage: cli_e2e.sh ZRT CHARLM WORKDIR
set -uo pipefail
zrt=$1; charlm=$2; work=$3
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_btl_vader_single_copy_mechanism=none ZRT_LOG_LEVEL=warn
fail() { echo "FAIL: $*"; exit 1; }
expect() {  # expect CODE command...
  local want=$1; shift
  "$@" > "$work/out.txt" 2> "$work/err.txt"; local got=$?
  [ "$got" = "$want" ] || { cat "$work/out.txt" "$work/err.txt"; fail "exit $got (want $want): $*"; }
}
rm -rf "$work"; mkdir -p "$work"
mpirun -n 3 --oversubscribe --bind-to none "$charlm" --steps 60 --every 20 --stage 2 --print-every 1000 --ckpt "$work/ck" > "$work/train.log" \
  || fail "training run"
step="$work/ck/step-00000060"

expect 0 "$zrt" ckpt ls "$work/ck";              grep -q "step-00000060 *complete" "$work/out.txt" || fail "ls"
expect 0 "$zrt" ckpt ls --json "$work/ck";       python3 -c "import json,sys; d=json.load(open('$work/out.txt')); assert d[0]['complete'] and d[0]['world_size']==3" || fail "ls --json"
expect 0 "$zrt" ckpt inspect "$step" --stats;    grep -q "w1 .*min .*max .*nan 0 inf 0" "$work/out.txt" || fail "inspect --stats"
expect 0 "$zrt" ckpt inspect --json "$step" --tensor w2
python3 -c "import json; d=json.load(open('$work/out.txt')); t=[t['name'] for g in d['groups'] for t in g['tensors']]; assert t==['w2'], t; assert d['trainer_state']['seed']==1234" || fail "inspect --json --tensor"
expect 0 "$zrt" ckpt verify "$step"
expect 0 "$zrt" ckpt reshard "$step" "$work/re2" --world-size 2
expect 0 "$zrt" ckpt verify "$work/re2/step-00000060"
expect 0 "$zrt" ckpt diff "$step" "$work/re2/step-00000060";  grep -q "^identical" "$work/out.txt" || fail "diff after reshard"
expect 0 "$zrt" ckpt diff --json "$work/ck/step-00000040" "$step"
# A 2-rank job resumes from the resharded copy and trains on.
mpirun -n 2 --oversubscribe --bind-to none "$charlm" --steps 80 --stage 3 --print-every 1000 --ckpt "$work/re2" > "$work/resume.log" \
  || fail "resume from the resharded checkpoint"
grep -q "resumed from $work/re2/step-00000060" "$work/resume.log" || fail "did not resume from the resharded copy"
grep -q "SUMMARY steps=80" "$work/resume.log" || fail "resumed run did not finish"

# Problems: exit 1 with a message naming what is wrong.
cp -r "$step" "$work/bad"
python3 - "$work/bad/rank-00001.data" <<'PY'
import sys
p = sys.argv[1]; b = bytearray(open(p, 'rb').read()); b[100] ^= 0xff; open(p, 'wb').write(b)
PY
expect 1 "$zrt" ckpt verify "$work/bad";          grep -q "rank-00001.data chunk 0 .*checksum mismatch" "$work/out.txt" || fail "verify must name the chunk"
rm "$work/bad/rank-00002.index.json"
expect 1 "$zrt" ckpt verify "$work/bad";          grep -q "rank-00002.index.json: missing" "$work/out.txt" || fail "verify must name the missing rank"
expect 1 "$zrt" ckpt verify "$work/nope";         grep -q "nope" "$work/err.txt" || fail "missing directory"
expect 1 "$zrt" ckpt inspect "$work";             grep -q "manifest.json" "$work/err.txt" || fail "not a checkpoint"
expect 1 "$zrt" ckpt ls "$work/nope"
expect 1 "$zrt" plan --params -5
expect 1 "$zrt" plan --params 1e9 --stage 9
expect 0 "$zrt" plan --layers 24 --hidden 2048 --heads 16 --seq 2048 --vocab 50000 --gpus 8 --stage 3 --json
expect 2 "$zrt" ckpt reshard "$step"
expect 2 "$zrt" frobnicate
expect 0 "$zrt" --version
echo "PASS"
