#!/usr/bin/python3
"""examples/gpt's training run replayed in PyTorch, and the two loss curves side by side.

usage: torch_train.py DIR [--steps N] [--tolerance R] [--plot PNG]   (DIR: `gpt ... --trace DIR`)

The same model (torch_gpt.py), initial weights, tokens (every rank's every micro-step) and optimizer:
torch.optim.AdamW with zrt's betas, eps, weight decay (none on the tensors zrt exempts) and the lr
zrt used at each step, torch.nn.utils.clip_grad_norm_ at the same norm. Mixed precision as zrt does
it: fp32 master weights, the forward and backward in float32 on their bf16 rounding, the gradient
(the mean over ranks of each rank's mean over its micro-steps) applied to the master.

Prints both curves and the gradient norms; exits 1 when a step's loss differs by more than the
tolerance (relative, default 0.02) among the first N steps (default: all). Two runs of the same
mathematics in different summation orders drift apart slowly, and a sudden jump in one curve but not
the other is a defect; a jump in both is the optimisation's.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_gpt  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("dir")
ap.add_argument("--steps", type=int, default=0)
ap.add_argument("--tolerance", type=float, default=0.02)
ap.add_argument("--plot", default="")
args = ap.parse_args()
d = args.dir
meta = json.load(open(f"{d}/meta.json"))
zrt = [json.loads(line) for line in open(f"{d}/steps.jsonl")]
W, A, B, T = meta["world"], meta["accum"], meta["batch"], meta["context"]
row = T + 1
tokens = [np.fromfile(f"{d}/tokens.rank{r}.bin", dtype=np.uint8).astype(np.int64).reshape(-1, B, row) for r in range(W)]
torch.manual_seed(0)
torch.set_num_threads(max(1, os.cpu_count() or 1))

master = torch_gpt.read_weights(f"{d}/weights.bin", meta, torch.float32)
decay = [master[t["name"]] for t in meta["tensors"] if t["decay"]]
no_decay = [master[t["name"]] for t in meta["tensors"] if not t["decay"]]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": meta["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}],
                        lr=meta["lr"], betas=tuple(meta["betas"]), eps=meta["eps"])

steps = len(zrt) if args.steps <= 0 else min(args.steps, len(zrt))
ours = []
print(f"{'step':>5} {'zrt loss':>9} {'torch loss':>10} {'rel':>8} {'zrt norm':>9} {'torch norm':>10}")
bad = 0
for s in range(steps):
    # The forward and backward on the master's bf16 rounding; its gradient goes to the master.
    work = {k: v.detach().to(torch.bfloat16).to(torch.float32).requires_grad_(True) for k, v in master.items()}
    total = 0.0
    for r in range(W):
        for m in range(A):
            batch = torch.from_numpy(tokens[r][s * A + m])
            l = torch_gpt.loss(work, batch, meta) / (A * W)
            l.backward()
            total += l.item()
    for k, v in master.items():
        v.grad = work[k].grad
    norm = torch.nn.utils.clip_grad_norm_(list(master.values()), meta["clip"]) if meta["clip"] > 0 else \
        torch.sqrt(sum((v.grad.double() ** 2).sum() for v in master.values()))
    for g in opt.param_groups:
        g["lr"] = zrt[s]["lr"]
    opt.step()
    opt.zero_grad(set_to_none=True)
    z = zrt[s]["loss"]
    rel = abs(total - z) / abs(total)
    ours.append(total)
    mark = ""
    if rel > args.tolerance:
        bad += 1
        mark = "  <- beyond the tolerance"
    print(f"{s + 1:5d} {z:9.4f} {total:10.4f} {rel:8.1e} {zrt[s]['grad_norm']:9.2f} {float(norm):10.2f}{mark}")
print(f"{steps} steps: {bad} beyond a relative difference of {args.tolerance}")

if args.plot:
    data = os.path.join(d, "curves.dat")
    with open(data, "w") as f:
        for s in range(steps):
            f.write(f"{s + 1} {zrt[s]['loss']} {ours[s]}\n")
    if shutil.which("gnuplot"):
        script = (f"set terminal png size 800,500; set output '{args.plot}'; set xlabel 'step'; set ylabel 'loss (nats per byte)';"
                  f"set key top right; set grid; plot '{data}' using 1:2 with linespoints title 'zrt',"
                  f" '{data}' using 1:3 with lines title 'PyTorch (same model, data, optimizer)'")
        subprocess.run(["gnuplot", "-e", script], check=True)
        print(f"loss curves: {args.plot}")
    else:
        print(f"loss curves: {data} (no gnuplot to draw {args.plot})")
sys.exit(1 if bad else 0)
