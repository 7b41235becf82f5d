"""The Python module against the CLI's HDF5 export and against torch: every tensor and state kind of a
2-rank stage-3 gpt checkpoint reads back equal (whole and by rows), also after a reshard to 3 ranks;
the arrays load into a torch module shaped like Hugging Face's GPT-2 (load_state_dict, strict) and
its state_dict, written back with zrt.write for 3 ranks with optimizer state, is resumed by examples/gpt
holding exactly those weights; verify finds a flipped byte; plan answers like the CLI; errors are
zrt.Error naming what is wrong.

usage: zrt_module_test.py ZRT GPT WORKDIR   (PYTHONPATH holds the built zrt package)
"""
import json
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np
import torch
from torch import nn

import zrt

zrt_cli, gpt, work = sys.argv[1], sys.argv[2], sys.argv[3]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", ZRT_LOG_LEVEL="warn")


def run(*args):
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"FAIL: {' '.join(map(str, args))} -> {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p


def check(cond, what):
    if not cond:
        sys.exit("FAIL: " + what)
    print("ok:", what)


ck_root = f"{work}/ck"
run("mpirun", "-n", 2, "--oversubscribe", "--bind-to", "none", gpt, "--preset", "tiny", "--steps", 4, "--every", 4, "--ckpt", ck_root,
    "--val-every", 0, "--sample", 0, "--stage", 3)
run(zrt_cli, "ckpt", "export", ck_root, f"{work}/ref.h5", "--states", "all")
h5 = h5py.File(f"{work}/ref.h5", "r")

ck = zrt.open(ck_root)
check(ck.step == 4 and ck.world_size == 2 and ck.stage == 3 and ck.trainer_state == {"seed": 1337}, f"{ck}: step, ranks, stage, trainer state")
check(sorted(ck.tensors) == sorted(h5["params"]) and ck.kinds == ["master", "exp_avg", "exp_avg_sq"], "tensors and state kinds")
check(all(np.array_equal(ck.read(n), h5["params"][n][()]) for n in ck.tensors), "every tensor's master weights equal the HDF5 export")
check(all(np.array_equal(ck.read(n, k), h5["optimizer"][k][n][()]) for n in ck.tensors for k in ("exp_avg", "exp_avg_sq")),
      "every optimizer state equals")
w = h5["params"]["wte"][()]
check(np.array_equal(ck.read("wte", start=3, stop=7), w[3:7]) and np.array_equal(ck.read("wte", start=-2), w[-2:]), "row slices")
run(zrt_cli, "ckpt", "reshard", ck_root, f"{work}/re3", "--world-size", 3)
ck3 = zrt.open(f"{work}/re3")
check(ck3.world_size == 3 and all(np.array_equal(ck3.read(n), ck.read(n)) for n in ck.tensors), "the same tensors read at 3 ranks")
# Compact optimizer state (8-bit moments, no master) is stored as it is kept; read() and the HDF5
# export give its f32 values, the same at 3 ranks after a reshard.
q8_root = f"{work}/q8"
run("mpirun", "-n", 2, "--oversubscribe", "--bind-to", "none", gpt, "--preset", "tiny", "--steps", 4, "--every", 4, "--ckpt", q8_root,
    "--val-every", 0, "--sample", 0, "--stage", 3, "--moments", "q8", "--no-master")
q8 = zrt.open(q8_root)
stored = {g["name"]: g["stored"] for g in q8.groups}
check(stored["h.0"] == ["bf16", "q8", "q8"] and stored["embed"] == ["f32", "f32", "f32"], f"stored forms per group: {stored}")
run(zrt_cli, "ckpt", "export", q8_root, f"{work}/q8.h5", "--states", "all")
q8h5 = h5py.File(f"{work}/q8.h5", "r")
check(all(np.array_equal(q8.read(n, k), q8h5["optimizer"][k][n][()]) for n in q8.tensors for k in ("exp_avg", "exp_avg_sq")),
      "q8 moments read as f32 equal the HDF5 export")
run(zrt_cli, "ckpt", "reshard", q8_root, f"{work}/q8re3", "--world-size", 3)
q8re = zrt.open(f"{work}/q8re3")
check(all(np.array_equal(q8re.read(n, k), q8.read(n, k)) for n in q8.tensors for k in ("master", "exp_avg", "exp_avg_sq")),
      "q8 state resharded to 3 ranks reads the same")
info = ck.info("h.0.ln_1.bias")
check(info["group"] == "h.0" and info["shape"] == (32,) and info["dtype"] == "bf16", f"info: {info}")


# A torch module shaped like transformers' GPT2Model (Conv1D weights are [in, out], as zrt's).
class Linear(nn.Module):
    def __init__(self, i, o):
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.zeros(i, o)), nn.Parameter(torch.zeros(o))


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.Module()
        self.attn.c_attn, self.attn.c_proj = Linear(d, 3 * d), Linear(d, d)
        self.mlp = nn.Module()
        self.mlp.c_fc, self.mlp.c_proj = Linear(d, 4 * d), Linear(4 * d, d)


class GPT(nn.Module):
    def __init__(self, v, t, d, layers):
        super().__init__()
        self.wte, self.wpe = nn.Parameter(torch.zeros(v, d)), nn.Parameter(torch.zeros(t, d))
        self.h = nn.ModuleList(Block(d) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)


V, D = ck.info("wte")["shape"]
T = ck.info("wpe")["shape"][0]
layers = sum(1 for n in ck.tensors if n.endswith("ln_1.weight"))
model = GPT(V, T, D, layers)
model.load_state_dict({k: torch.from_numpy(v) for k, v in ck.state_dict().items()}, strict=True)
check(torch.equal(model.h[0].attn.c_attn.weight, torch.from_numpy(h5["params"]["h.0.attn.c_attn.weight"][()])),
      "load_state_dict(strict=True) from zrt's arrays")
with torch.no_grad():
    for p in model.parameters():
        p.mul_(0.5).add_(0.125)
sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
zeros = {k: np.zeros_like(v) for k, v in sd.items()}
out = zrt.write(f"{work}/fromtorch", sd, world_size=3, stage=3, optimizer={"exp_avg": zeros, "exp_avg_sq": zeros}, step=4,
                trainer_state={"seed": 1337}, groups={n: ck.info(n)["group"] for n in ck.tensors}, model_dtype="bf16")
ok, problems = zrt.verify(out)
check(ok and not problems and zrt.open(out).world_size == 3, f"zrt.write -> {out} verifies")
dump = f"{work}/resumed.bin"
p = run("mpirun", "-n", 3, "--oversubscribe", "--bind-to", "none", gpt, "--preset", "tiny", "--steps", 4, "--stage", 3, "--ckpt",
        f"{work}/fromtorch", "--val-every", 0, "--sample", 0, "--dump", dump)
want = np.concatenate([sd[n].ravel() for n in ck.tensors])
check("resumed from" in p.stdout and np.array_equal(np.fromfile(dump, dtype=np.float32), want),
      "examples/gpt resumes the torch-written checkpoint on 3 ranks holding exactly its weights")
p = run("mpirun", "-n", 2, "--oversubscribe", "--bind-to", "none", gpt, "--preset", "tiny", "--steps", 6, "--stage", 2, "--ckpt",
        f"{work}/fromtorch", "--val-every", 0, "--sample", 0)
check("SUMMARY steps=6" in p.stdout, "and trains on from it at another world size")

# verify finds a flipped byte; errors are zrt.Error with the name.
bad = f"{work}/bad"
shutil.copytree(ck.dir, bad)
data = f"{bad}/rank-00001.data"
b = bytearray(open(data, "rb").read())
b[200] ^= 0xFF
open(data, "wb").write(b)
ok, problems = zrt.verify(bad)
check(not ok and any("rank-00001.data" in q for q in problems), f"verify: {problems[:1]}")
for call, needle in [(lambda: zrt.open(f"{work}/nope"), "nope"), (lambda: ck.read("nope"), "nope"), (lambda: ck.read("wte", "exp_avg_sq_x"), "exp_avg_sq_x"),
                     (lambda: zrt.open(bad).read("wte"), "checksum")]:
    try:
        call()
        check(False, f"an error for {needle}")
    except zrt.Error as e:
        check(needle in str(e), f"zrt.Error: {e}")

cli = json.loads(run(zrt_cli, "plan", "--params", "7.5e9", "--gpus", 64, "--stage", 3, "--json").stdout)
check(zrt.plan(params=7.5e9, gpus=64, stage=3) == cli, "plan() equals `zrt plan --json`")
cli = json.loads(run(zrt_cli, "plan", "--params", "7.5e9", "--gpus", 4096, "--tokens", "1e12", "--tflops", 300, "--relaunch", 600,
                     "--tier-miss", "0.2", "--restart-disk", 30, "--json").stdout)
check(zrt.plan(params=7.5e9, gpus=4096, tokens=1e12, tflops=300, relaunch=600, tier_miss=0.2, restart_disk=30) == cli
      and cli["failures"]["costs_seconds"]["restart_disk"] == 30, "plan() with a failure model equals `zrt plan --json`")
print("PASS")
