#!/usr/bin/python3
"""examples/gpt's forward loss and every parameter gradient against PyTorch (Debian's python3-torch).

usage: torch_reference.py DIR   (DIR written by `gpt --preset tiny --reference DIR`)

The same GPT-2 architecture written with torch.nn.functional (LayerNorm eps 1e-5, tanh GELU, causal
softmax attention, output projection tied to wte), run in float64 on the fp32 weights and tokens zrt
used; zrt's fp32 loss and gradients must agree to fp32 accuracy. Exit 1 on any mismatch.
"""
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_gpt  # noqa: E402

d = sys.argv[1]
meta = json.load(open(f"{d}/meta.json"))
T, B = meta["context"], meta["batch"]
params = torch_gpt.read_weights(f"{d}/weights.bin", meta, torch.float64)
grads = np.fromfile(f"{d}/grads.bin", dtype=np.float32)
tokens = torch.from_numpy(np.fromfile(f"{d}/tokens.bin", dtype=np.uint8).astype(np.int64)).view(B, T + 1)
ours, at = {}, 0
for t in meta["tensors"]:
    n = int(np.prod(t["shape"])) if t["shape"] else 1
    ours[t["name"]] = grads[at:at + n].reshape(t["shape"]).astype(np.float64)
    at += n

loss = torch_gpt.loss(params, tokens, meta)
loss.backward()

bad = 0
rel = abs(loss.item() - meta["loss"]) / abs(loss.item())
print(f"loss: torch {loss.item():.8f}  zrt {meta['loss']:.8f}  relative difference {rel:.2e}")
bad += rel > 1e-5
worst = 0.0
for name, t in params.items():
    g = t.grad.numpy()
    err = np.linalg.norm(ours[name] - g) / max(np.linalg.norm(g), 1e-12)
    worst = max(worst, err)
    if err > 1e-4:
        print(f"  {name}: relative gradient error {err:.2e}")
        bad += 1
print(f"gradients: {len(params)} tensors, worst relative error (L2) {worst:.2e} (tolerance 1e-4)")
sys.exit(1 if bad else 0)
