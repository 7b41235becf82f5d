"""examples/gpt's model written with torch.nn.functional, for the scripts that check zrt against PyTorch
(torch_reference.py: one forward/backward; torch_train.py: a whole training run).

GPT-2's architecture: learned positions, pre-LayerNorm blocks (eps 1e-5), causal softmax attention, a
tanh-GELU MLP, a final LayerNorm and the output projection tied to wte; byte tokens.
"""
import math

import numpy as np
import torch
import torch.nn.functional as F


def read_weights(path, meta, dtype):
    """The fp32 tensors of weights.bin in meta["tensors"] order, as leaf tensors of `dtype`."""
    flat = np.fromfile(path, dtype=np.float32)
    params, at = {}, 0
    for t in meta["tensors"]:
        n = int(np.prod(t["shape"])) if t["shape"] else 1
        params[t["name"]] = torch.tensor(flat[at:at + n].reshape(t["shape"]), dtype=dtype, requires_grad=True)
        at += n
    assert at == flat.size, f"{path} does not match meta.json"
    return params


def loss(p, tokens, meta):
    """Mean next-byte cross-entropy of `tokens` (B x (T + 1) int64) under the parameters `p`."""
    V, T, L, D, H = (meta[k] for k in ("vocab", "context", "layers", "dim", "heads"))
    B = tokens.shape[0]
    x_in, y = tokens[:, :T], tokens[:, 1:]
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
    return F.cross_entropy(logits.reshape(-1, V), y.reshape(-1))
