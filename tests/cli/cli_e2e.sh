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
expect 0 "$zrt" ckpt inspect --json "$step" --stats;  cp "$work/out.txt" "$work/inspect.json"
expect 0 "$zrt" ckpt inspect --json "$step" --tensor w2
python3 -c "import json; d=json.load(open('$work/out.txt')); t=[t['name'] for g in d['groups'] for t in g['tensors']]; assert t==['w2'], t; assert d['trainer_state']['seed']==1234" || fail "inspect --json --tensor"
expect 0 "$zrt" ckpt inspect "$step" --tensor w2  # the layout lines name only the tensors kept
grep -qE "^ +rank 0: .*w2\[" "$work/out.txt" || fail "inspect --tensor: no layout of w2"
others=$(grep -E "^ +rank " "$work/out.txt" | grep -oE "[A-Za-z0-9_.]+\[[0-9]+\.\." | grep -v "^w2\[" || true)
[ -z "$others" ] || fail "inspect --tensor w2 lists other tensors' pieces: $others"
expect 0 "$zrt" ckpt verify "$step"
expect 0 "$zrt" ckpt reshard "$step" "$work/re2" --world-size 2
expect 0 "$zrt" ckpt verify "$work/re2/step-00000060"
expect 0 "$zrt" ckpt diff "$step" "$work/re2/step-00000060";  grep -q "^identical" "$work/out.txt" || fail "diff after reshard"
expect 1 "$zrt" ckpt diff --json "$work/ck/step-00000040" "$step"  # different steps: they differ (exit 1)
# A 2-rank job resumes from the resharded copy and trains on.
mpirun -n 2 --oversubscribe --bind-to none "$charlm" --steps 80 --stage 3 --print-every 1000 --ckpt "$work/re2" > "$work/resume.log" \
  || fail "resume from the resharded checkpoint"
grep -q "resumed from $work/re2/step-00000060" "$work/resume.log" || fail "did not resume from the resharded copy"
grep -q "SUMMARY steps=80" "$work/resume.log" || fail "resumed run did not finish"

# HDF5: export (read back with h5py), import for another world size, identical state.
expect 0 "$zrt" ckpt export "$step" "$work/model.h5" --states all
/usr/bin/python3 - "$work/model.h5" "$work/inspect.json" <<'PY' || fail "h5py read-back"
import json, sys, math, h5py
f = h5py.File(sys.argv[1], "r")
assert f.attrs["step"] == 60 and f.attrs["world_size"] == 3, dict(f.attrs)
assert json.loads(f.attrs["trainer_state"])["seed"] == 1234
w1 = f["params/w1"]
assert w1.shape == (128, 96) and w1.dtype == "float32", (w1.shape, w1.dtype)
assert set(f["optimizer"].keys()) == {"exp_avg", "exp_avg_sq"}, list(f["optimizer"].keys())
assert f["optimizer/exp_avg_sq/w1"].shape == (128, 96)
assert float(f["optimizer/exp_avg_sq/w1"][...].min()) >= 0
stats = {t["name"]: t["stats"] for g in json.load(open(sys.argv[2]))["groups"] for t in g["tensors"]}
l2 = math.sqrt(float((w1[...].astype("float64") ** 2).sum()))
assert abs(l2 - stats["w1"]["l2"]) <= 1e-5 * l2, (l2, stats["w1"]["l2"])
print("h5py read-back OK: w1", w1.shape, "l2", round(l2, 4))
PY
expect 0 "$zrt" ckpt import "$work/model.h5" "$work/imp" --world-size 4
expect 0 "$zrt" ckpt verify "$work/imp/step-00000060"
expect 0 "$zrt" ckpt diff "$step" "$work/imp/step-00000060";  grep -q "^identical" "$work/out.txt" || fail "export -> import changed the state"
expect 0 "$zrt" ckpt export "$step" "$work/model_bf16.h5" --dtype bf16
/usr/bin/python3 -c "import h5py; d=h5py.File('$work/model_bf16.h5')['params/w2']; assert d.dtype=='uint16' and d.attrs['zrt_dtype']=='bf16' and d.attrs['group']=='out' or print(dict(d.attrs))" || fail "bf16 export, string attributes as str"
# The two lines docs/interop.md gives a torch user for bf16, against the f32 export rounded by torch.
/usr/bin/python3 - "$work" <<'PY' || fail "bf16 HDF5 into torch"
import sys, h5py, numpy as np, torch
w = sys.argv[1]
b = torch.from_numpy(h5py.File(w + "/model_bf16.h5")["params/w2"][()].view(np.int16)).view(torch.bfloat16)
f = torch.from_numpy(h5py.File(w + "/model.h5")["params/w2"][()])
assert torch.equal(b, f.to(torch.bfloat16)), "bf16 export differs from torch's rounding"
PY
# A file made elsewhere (h5py, no zrt attributes) imports too; a wrong layout is refused clearly.
/usr/bin/python3 - "$work" <<'PY'
import sys, numpy as np, h5py
with h5py.File(sys.argv[1] + "/foreign.h5", "w") as f:
    f["params/a"] = np.arange(12, dtype="float32").reshape(3, 4)
    f["params/b"] = np.ones(5, dtype="float64")
with h5py.File(sys.argv[1] + "/wrong.h5", "w") as f:
    f["weights/a"] = np.zeros(3, dtype="float32")
with h5py.File(sys.argv[1] + "/ints.h5", "w") as f:
    f["params/a"] = np.zeros(3, dtype="int32")
PY
expect 0 "$zrt" ckpt import "$work/foreign.h5" "$work/foreign" --world-size 3
expect 0 "$zrt" ckpt inspect --json "$work/foreign/step-00000000" --stats
/usr/bin/python3 -c "import json; d=json.load(open('$work/out.txt')); t={t['name']:t for g in d['groups'] for t in g['tensors']}; assert t['a']['stats']['max']==11 and t['b']['stats']['mean']==1, t" || fail "foreign import"
expect 1 "$zrt" ckpt import "$work/wrong.h5" "$work/w" --world-size 2;  grep -q "no /params group" "$work/err.txt" || fail "wrong layout message"
expect 1 "$zrt" ckpt import "$work/ints.h5" "$work/w" --world-size 2;   grep -q "not floating point" "$work/err.txt" || fail "int dataset message"
expect 1 "$zrt" ckpt import "$work/nope.h5" "$work/w" --world-size 2
expect 2 "$zrt" ckpt export "$step" "$work/x.h5" --states some;  grep -q "states" "$work/err.txt" || fail "bad option value message"
expect 2 "$zrt" ckpt reshard "$step" "$work/r0" --world-size 0; grep -q "must be an integer >= 1, got '0'" "$work/err.txt" || fail "world size 0 message"
expect 2 "$zrt" ckpt frobnicate "$step"
# --json everywhere, before or after the command; a root where a checkpoint is expected: its newest.
for cmd in "ckpt ls $work/ck" "ckpt inspect $work/ck" "ckpt verify $work/ck" "--json ckpt verify $step" \
           "ckpt reshard $work/ck $work/rj --world-size 2" "ckpt export $work/ck $work/j.safetensors" \
           "ckpt import $work/j.safetensors $work/ij --world-size 2" "ckpt diff $work/ck $work/rj" "plan --params 1e9 --gpus 8"; do
  # shellcheck disable=SC2086
  expect 0 "$zrt" $cmd --json
  /usr/bin/python3 -c "import json,sys; json.load(open('$work/out.txt'))" || fail "zrt $cmd --json: not JSON: $(head -c 300 "$work/out.txt")"
done
expect 0 "$zrt" ckpt inspect "$work/ck"; grep -q "is a checkpoint root: using its newest complete checkpoint .*step-00000060" "$work/err.txt" || fail "root hint"

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
expect 2 "$zrt" plan --params -5;  grep -q "must be a number > 0, got '-5'" "$work/err.txt" || fail "plan --params -5 message"
expect 1 "$zrt" plan --params 1e12 --gpus 1 --gpu-mem 1;  grep -q "no configuration fits" "$work/err.txt" || fail "plan: nothing fits"
expect 0 "$zrt" plan --arch llama --layers 80 --hidden 8192 --heads 64 --kv-heads 8 --ffn 28672 --vocab 32000 --seq 4096 --gpus 64 --json
/usr/bin/python3 -c "import json; d=json.load(open('$work/out.txt')); assert abs(d['params'] - 68.98e9) < 1e8 and d['recommendation'] and d['deepspeed']['zero3'], d['params']" || fail "plan llama"
expect 2 "$zrt" plan --params 1e9 --stage 9
expect 0 "$zrt" plan --layers 24 --hidden 2048 --heads 16 --seq 2048 --vocab 50000 --gpus 8 --stage 3 --json
# Failures and goodput: the prediction, flags out of range, a bench file that is not one.
expect 0 "$zrt" plan --params 405e9 --gpus 16384 --tokens 15.6e12 --tflops 400 --step-time 5 --json
/usr/bin/python3 -c "import json; f=json.load(open('$work/out.txt'))['failures']; assert 0.9 < f['disk_only']['ettr'] <= f['memory_tier']['ettr'] < 1 and f['disk_only']['failures'] > 0, f" \
  || fail "plan failures"
expect 0 "$zrt" plan --params 405e9 --gpus 16384;  grep -q "^  ETTR " "$work/out.txt" || fail "plan prints the ETTR"
expect 2 "$zrt" plan --params 1e9 --tier-miss 2;  grep -q "must be a number in \[0, 1\], got '2'" "$work/err.txt" || fail "plan --tier-miss 2 message"
expect 2 "$zrt" plan --params 1e9 --relaunch -1
printf 'RESULT\tcheckpoint\tN=2 stall per save\tsoon\ts\t1\tmemcpy s\t1\t-\t-\n' > "$work/bench.tsv"
expect 1 "$zrt" plan --params 1e9 --from-bench "$work/bench.tsv";  grep -q "bench.tsv: no bench/checkpoint RESULT lines" "$work/err.txt" || fail "plan --from-bench names the file"
expect 1 "$zrt" plan --params 1e9 --from-bench "$work";  grep -q "must be a regular file" "$work/err.txt" || fail "plan --from-bench directory"
expect 2 "$zrt" ckpt reshard "$step"
expect 2 "$zrt" frobnicate
expect 0 "$zrt" --version
echo "PASS"
