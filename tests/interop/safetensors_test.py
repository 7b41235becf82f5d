"""safetensors end to end, checked by the independent reader/writer in safetensors_spec.py:
a zrt checkpoint exported (f32, the model's bf16, all states sharded) reads back equal to the HDF5
export of the same checkpoint; the full state round-trips through import at another world size; a
Hugging Face-style file written here from torch tensors (prefixed names, extra tensors a name map
drops) initialises a 3-rank stage-3 run of examples/gpt with exactly its weights and imports into a
checkpoint; hostile files are refused, naming the file, without output.

usage: safetensors_test.py ZRT GPT WORKDIR
"""
import json
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_spec as st  # noqa: E402

zrt, gpt, work = sys.argv[1], sys.argv[2], sys.argv[3]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", ZRT_LOG_LEVEL="warn")


def run(*args, ok=True):
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True, env=env)
    if ok and p.returncode != 0:
        sys.exit(f"FAIL: {' '.join(map(str, args))} -> {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p


def mpi(n, *args):
    return run("mpirun", "-n", n, "--oversubscribe", "--bind-to", "none", *args)


def check(cond, what):
    if not cond:
        sys.exit("FAIL: " + what)
    print("ok:", what)


# A checkpoint of the tiny GPT trained 4 steps on 2 ranks (bf16 parameters, fp32 master and Adam).
ck = f"{work}/ck"
mpi(2, gpt, "--preset", "tiny", "--steps", 4, "--every", 4, "--ckpt", ck, "--val-every", 0, "--sample", 0, "--stage", 3)
ref_h5 = f"{work}/ref.h5"
run(zrt, "ckpt", "export", ck, ref_h5, "--states", "all")
with h5py.File(ref_h5, "r") as f:
    params = {k: f["params"][k][()] for k in f["params"]}
    order = sorted(params, key=lambda k: int(f["params"][k].attrs["order"]))
    kinds = list(f["optimizer"].keys())
    opt = {(kd, k): f["optimizer"][kd][k][()] for kd in kinds for k in f["optimizer"][kd]}

# f32: exactly the master weights.
run(zrt, "ckpt", "export", ck, f"{work}/f32.safetensors", "--dtype", "f32")
t, dt, meta = st.read(f"{work}/f32.safetensors")
check(set(t) == set(params) and all(np.array_equal(t[k], params[k]) for k in params), "f32 export equals the HDF5 export bit for bit")
check(set(dt.values()) == {"F32"} and meta.get("format") == "pt" and "zrt" in meta, "f32 dtypes and metadata (format pt, zrt)")

# Default: the model's dtype (bf16), rounded to nearest even.
run(zrt, "ckpt", "export", ck, f"{work}/bf16.safetensors")
got, _ = st.read_file(f"{work}/bf16.safetensors")
check(all(got[k][0] == "BF16" for k in params), "default export writes the model's dtype, BF16")
check(all(np.array_equal(got[k][1], st.f32_to_bf16(params[k])) for k in params), "bf16 values are the master weights rounded to nearest even")

# All states, sharded under a small limit, with an index.
run(zrt, "ckpt", "export", ck, f"{work}/all.safetensors", "--states", "all", "--max-shard-size", "40K")
index = f"{work}/all.safetensors.index.json"
check(os.path.exists(index) and not os.path.exists(f"{work}/all.safetensors"), "above the limit: shards and an index")
t, dt, meta = st.read(index)
shards = sorted(set(json.load(open(index))["weight_map"].values()))
check(len(shards) > 2 and all(os.path.getsize(f"{work}/{s}") < 40 * 1024 + 70000 for s in shards), f"{len(shards)} shards")
check(all(np.array_equal(t[k], params[k]) for k in params), "sharded parameters equal")
check(all(np.array_equal(t[f"optimizer/{kd}/{k}"], v) for (kd, k), v in opt.items()), "sharded optimizer state equals")
check(isinstance(meta.get("total_size"), int) and "zrt" in meta, "index metadata: total_size and zrt")

# Full state back into a checkpoint for 3 ranks: the same state as saved.
run(zrt, "ckpt", "import", index, f"{work}/re3", "--world-size", 3)
p = run(zrt, "ckpt", "diff", ck, f"{work}/re3", ok=False)
check(p.returncode == 0 and "identical" in p.stdout, "import of the full state at 3 ranks diffs identical to the checkpoint")


def manifest(root):
    return json.load(open(os.path.join(root, sorted(d for d in os.listdir(root) if d.startswith("step-"))[-1], "manifest.json")))


mf, saved = manifest(f"{work}/re3"), manifest(ck)
check(mf["step"] == saved["step"] and mf["trainer_state"] == saved["trainer_state"], "step and trainer state come back")

# A Hugging Face-style file from torch tensors: GPT2LMHeadModel names, the tied lm_head and the
# attention mask buffers (which zrt has no use for) included, bf16 as torch stores it.
state = {k: torch.from_numpy(params[k].copy()) * 0.5 + 0.01 for k in params}  # other weights than the run's
hf = {}
for k, v in state.items():
    name = "transformer." + (k + ".weight" if k in ("wte", "wpe") else k)
    hf[name] = ("BF16", v.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16))
hf["lm_head.weight"] = hf["transformer.wte.weight"]
hf["transformer.h.0.attn.bias"] = ("U8", np.tril(np.ones((8, 8), dtype=np.uint8)))
st.write(f"{work}/hf.safetensors", hf, {"format": "pt"})
names = {"exact": {"transformer.wte.weight": "wte", "transformer.wpe.weight": "wpe", "lm_head.weight": None,
                   "transformer.h.0.attn.bias": None},
         "prefix": {"transformer.": ""}}
json.dump(names, open(f"{work}/names.json", "w"))
expect = {k: v.to(torch.bfloat16).float().numpy() for k, v in state.items()}

dump = f"{work}/init.bin"
mpi(3, gpt, "--preset", "tiny", "--steps", 0, "--stage", 3, "--init", f"{work}/hf.safetensors", "--init-names", f"{work}/names.json",
    "--val-every", 0, "--sample", 0, "--dump", dump)
flat = np.fromfile(dump, dtype=np.float32)
want = np.concatenate([expect[k].ravel() for k in order])
check(flat.shape == want.shape and np.array_equal(flat, want), "gpt --init on 3 ranks at stage 3 holds exactly the file's weights")
p = mpi(2, gpt, "--preset", "tiny", "--steps", 3, "--stage", 2, "--init", f"{work}/hf.safetensors", "--init-names", f"{work}/names.json",
        "--val-every", 0, "--sample", 0)
check("SUMMARY steps=3" in p.stdout and "initialised from" in p.stdout, "a run initialised from it trains")
p = run("mpirun", "-n", 1, gpt, "--preset", "tiny", "--steps", 0, "--init", f"{work}/hf.safetensors", ok=False)
check(p.returncode != 0 and "transformer." in p.stdout + p.stderr, "without the name map: refused, naming the tensor")

# The same file imported into a checkpoint (parameters only) and exported again: the same values.
run(zrt, "ckpt", "import", f"{work}/hf.safetensors", f"{work}/hfck", "--world-size", 2, "--name-map", f"{work}/names.json")
run(zrt, "ckpt", "export", f"{work}/hfck", f"{work}/back.safetensors", "--dtype", "f32")
t, _, _ = st.read(f"{work}/back.safetensors")
check(set(t) == set(expect) and all(np.array_equal(t[k], expect[k]) for k in expect), "import + export returns the file's weights")
p = run(zrt, "ckpt", "inspect", f"{work}/hfck", "--json")
info = json.loads(p.stdout)
check(json.dumps(info).count("exp_avg") == 0, "a parameters-only import holds no optimizer state")

# Hostile files: refused by import with the file named, nothing written.
good = open(f"{work}/f32.safetensors", "rb").read()
(n,) = np.frombuffer(good[:8], dtype="<u8")
header = json.loads(good[8:8 + int(n)])


def with_header(h, tail=None):
    text = json.dumps(h).encode()
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    return np.uint64(len(text)).tobytes() + text + (good[8 + int(n):] if tail is None else tail)


first = next(k for k in header if k != "__metadata__")
overlap = json.loads(json.dumps(header))  # one tensor moved onto the first bytes of the buffer
second = next(k for k in header if k != "__metadata__" and header[k]["data_offsets"][0] > 0)
overlap[second]["data_offsets"] = [0, overlap[second]["data_offsets"][1] - overlap[second]["data_offsets"][0]]
bad_dtype = json.loads(json.dumps(header))
bad_dtype[first]["dtype"] = "Q7"
huge_shape = json.loads(json.dumps(header))
huge_shape[first]["shape"] = [1 << 40, 1 << 40]
cases = {
    "truncated": good[: len(good) - 100],
    "header length beyond the file": np.uint64(1 << 40).tobytes() + good[8:],
    "not JSON": np.uint64(16).tobytes() + b"{not json at all" + good[24:],
    "overlapping tensors": with_header(overlap),
    "trailing bytes": good + b"\0" * 64,
    "unknown dtype": with_header(bad_dtype),
    "shape overflow": with_header(huge_shape),
    "empty": b"",
}
for what, blob in cases.items():
    path = f"{work}/hostile.safetensors"
    open(path, "wb").write(blob)
    out = f"{work}/hostile-out"
    p = run(zrt, "ckpt", "import", path, out, "--world-size", 2, ok=False)
    check(p.returncode == 1 and "hostile.safetensors" in p.stderr and not os.path.exists(out),
          f"hostile ({what}): rc {p.returncode}: {p.stderr.strip()[:150]}")
os.makedirs(f"{work}/idx", exist_ok=True)
json.dump({"metadata": {}, "weight_map": {first: "../f32.safetensors"}}, open(f"{work}/idx/model.safetensors.index.json", "w"))
p = run(zrt, "ckpt", "import", f"{work}/idx", f"{work}/idx-out", "--world-size", 1, ok=False)
check(p.returncode == 1 and "plain file name" in p.stderr, "an index naming ../ is refused")
os.symlink(f"{work}/f32.safetensors", f"{work}/idx/link.safetensors")
p = run(zrt, "ckpt", "import", f"{work}/idx/link.safetensors", f"{work}/idx-out", "--world-size", 1, ok=False)
check(p.returncode == 1 and "symbolic link" in p.stderr, "a symbolic link is refused")
print("PASS")
