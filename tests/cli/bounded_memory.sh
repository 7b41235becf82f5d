#!/usr/bin/env bash
# The offline tools stream: export (safetensors), import, reshard and verify of a checkpoint take a
# bounded amount of memory (peak RSS above the program's own under 160 MiB, for a 383 MiB checkpoint), and
# what they write is the same state. HDF5 export and diff hold one parameter group at a time: the
# groups here are small.
# usage: bounded_memory.sh ZRT PYTHONPATH WORKDIR
set -euo pipefail
zrt=$1; export PYTHONPATH=$2; work=$3
rm -rf "$work"; mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
# 32M parameters with Adam state on 4 ranks: 384 MiB of fp32 state, in groups of 4M parameters.
/usr/bin/python3 - "$work/ck" <<'PY'
import sys, numpy as np, zrt
rng = np.random.default_rng(1)
params = {f"w{i}": rng.standard_normal((2048, 2048 - i), dtype=np.float32) for i in range(8)}
opt = {k: {n: v * s for n, v in params.items()} for k, s in (("exp_avg", 0.1), ("exp_avg_sq", 0.01))}
zrt.write(sys.argv[1], params, world_size=4, optimizer=opt, groups={n: n for n in params})
PY
size_kb=$(du -sk "$work/ck" | cut -f1)
base_kb=$(/usr/bin/time -f %M "$zrt" --version 2>&1 >/dev/null | tail -1)  # the program itself: libraries, MPI
limit_kb=$((160 << 10))  # a constant: chunk buffers per thread, never the checkpoint
bounded() {
  /usr/bin/time -o "$work/rss.txt" -f %M "$@" > "$work/out.txt" 2>&1 || { cat "$work/out.txt"; fail "$*"; }
  local used=$(( $(tail -1 "$work/rss.txt") - base_kb ))
  echo "  $(( used / 1024 )) MiB above the program's own $(( base_kb / 1024 )) MiB: ${*:2:2}"
  [ "$used" -le "$limit_kb" ] || fail "$* used $used KiB of memory beyond the program's $base_kb KiB (bound: $limit_kb KiB)"
}
bounded "$zrt" ckpt export "$work/ck" "$work/all.safetensors" --states all
bounded "$zrt" ckpt import "$work/all.safetensors" "$work/imp" --world-size 3
bounded "$zrt" ckpt reshard "$work/ck" "$work/re" --world-size 5
bounded "$zrt" ckpt verify "$work/re"
bounded "$zrt" ckpt export "$work/ck" "$work/all.h5" --states all
bounded "$zrt" ckpt diff "$work/ck" "$work/imp"; grep -q "^identical" "$work/out.txt" || fail "export + import changed the state"
bounded "$zrt" ckpt diff "$work/ck" "$work/re";  grep -q "^identical" "$work/out.txt" || fail "reshard changed the state"
echo "PASS: a $((size_kb / 1024)) MiB checkpoint exported, imported, resharded, verified and compared, each in less than $((limit_kb / 1024)) MiB"
