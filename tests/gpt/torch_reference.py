#!/usr/bin/python3
"""examples/gpt's forward loss and every parameter gradient against PyTorch (Debian's python3-torch).

usage: torch_reference.py DIR   (DIR written by `gpt --preset tiny --reference DIR`)

The same GPT-2 architecture written with torch.nn.functional (LayerNorm eps 1e-5, tanh GELU, causal
softmax attention, output projection tied to wte), run in float64 on the fp32 weights and tokens zrt
used; zrt's fp32 loss and gradients must agree to fp32 accuracy. Exit 1 on any mismatch.
"""
import json
import math
import sys

import numpy as np
import torch
import torch.nn.functional as F

d = sys.argv[1]
meta = json.load(open(f"{d}/meta.json"))
V, T, L, D, H, B = (meta[k] for k in ("vocab", "context", "layers", "dim", "heads", "batch"))
weights = np.fromfile(f"{d}/weights.bin", dtype=np.float32)
grads = np.fromfile(f"{d}/grads.bin", dtype=np.float32)
tokens = torch.from_numpy(np.fromfile(f"{d}/tokens.bin", dtype=np.uint8).astype(np.int64)).view(B, T + 1)

params, ours, at = {}, {}, 0
for t in meta["tensors"]:
    n = int(np.prod(t["shape"])) if t["shape"] else 1
    params[t["name"]] = torch.tensor(weights[at:at + n].reshape(t["shape"]), dtype=torch.float64, requires_grad=True)
    ours[t["name"]] = grads[at:at + n].reshape(t["shape"]).astype(np.float64)
    at += n
assert at == weights.size, "weights.bin does not match meta.json"

x_in, y = tokens[:, :T], tokens[:, 1:]
p = params
x = p["wte"][x_in] + p["wpe"][torch.arange(T)]
mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
for l in range(L):
    q = f"h.{l}."
    h = F.layer_norm(x, (D,), p[q + "ln_1.weight"], p[q + "ln_1.bias"], eps=1e-5)
    qkv = h @ p[q + "attn.c_attn.weight"] + p[q + "attn.c_attn.bias"]
    qq, kk, vv = qkv.split(D, dim=2)
    heads = lambda z: z.view(B, T, H, D // H).transpose(1, 2)
    att = (heads(qq) @ heads(kk).transpose(-2, -1)) / math.sqrt(D // H)
    att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
    a = (att @ heads(vv)).transpose(1, 2).reshape(B, T, D)
    x = x + a @ p[q + "attn.c_proj.weight"] + p[q + "attn.c_proj.bias"]
    h = F.layer_norm(x, (D,), p[q + "ln_2.weight"], p[q + "ln_2.bias"], eps=1e-5)
    h = F.gelu(h @ p[q + "mlp.c_fc.weight"] + p[q + "mlp.c_fc.bias"], approximate="tanh")
    x = x + h @ p[q + "mlp.c_proj.weight"] + p[q + "mlp.c_proj.bias"]
x = F.layer_norm(x, (D,), p["ln_f.weight"], p["ln_f.bias"], eps=1e-5)
logits = x @ p["wte"].T
loss = F.cross_entropy(logits.reshape(-1, V), y.reshape(-1))
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
