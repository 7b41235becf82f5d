"""Which way a bf16 parameter without an fp32 master keeps updates smaller than its rounding step:
stochastic rounding (what zrt does) against Kahan compensation with a bf16 compensation buffer,
plain round-to-nearest, and an fp32 master as the reference. A 3-layer MLP regressing a fixed random
teacher, AdamW at a learning rate where most updates are below half a bf16 step, the same data and
initialisation for every rule; final training loss, mean of 3 seeds.

usage: /usr/bin/python3 bench/no_master_rounding.py [--steps 1500]   (torch on the CPU; ./scripts/bench runs it)
"""
import argparse

import torch

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=1500)
p.add_argument("--lr", type=float, default=3e-4)
args = p.parse_args()


def bf16(x):
    return x.to(torch.bfloat16).to(torch.float32)


def stochastic_bf16(x, gen):
    bits = x.view(torch.int32)
    noise = torch.randint(0, 1 << 16, x.shape, generator=gen, dtype=torch.int32)
    return ((bits + noise) & ~0xFFFF).view(torch.float32)


def train(rule, seed):
    torch.manual_seed(seed)
    d, h, n = 64, 256, 4096
    teacher = [torch.randn(d, h) / d**0.5, torch.randn(h, h) / h**0.5, torch.randn(h, 1) / h**0.5]
    x = torch.randn(n, d)
    y = torch.tanh(torch.tanh(x @ teacher[0]) @ teacher[1]) @ teacher[2]
    params = [bf16(torch.randn(d, h) / d**0.5), bf16(torch.randn(h, h) / h**0.5), bf16(torch.randn(h, 1) / h**0.5)]
    master = [q.clone() for q in params]
    comp = [torch.zeros_like(q) for q in params]
    m = [torch.zeros_like(q) for q in params]
    v = [torch.zeros_like(q) for q in params]
    gen = torch.Generator().manual_seed(seed + 1000)
    b1, b2, eps, wd = 0.9, 0.999, 1e-8, 0.01
    for t in range(1, args.steps + 1):
        idx = torch.randint(0, n, (256,), generator=torch.Generator().manual_seed(t * 7919 + seed))
        w = [q.clone().requires_grad_(True) for q in params]
        loss = ((torch.tanh(torch.tanh(x[idx] @ w[0]) @ w[1]) @ w[2] - y[idx]) ** 2).mean()
        loss.backward()
        for i, q in enumerate(params):
            g = w[i].grad
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            step = args.lr * (m[i] / (1 - b1**t)) / ((v[i] / (1 - b2**t)).sqrt() + eps)
            base = master[i] if rule == "fp32 master" else q
            new = base * (1 - args.lr * wd) - step
            if rule == "fp32 master":
                master[i] = new
                params[i] = bf16(new)
            elif rule == "round to nearest":
                params[i] = bf16(new)
            elif rule == "stochastic rounding":
                params[i] = stochastic_bf16(new, gen)
            else:  # Kahan: the bf16 compensation carries what the bf16 parameter lost
                delta = new - q - comp[i]
                total = bf16(q + delta)
                comp[i] = bf16((total - q) - delta)
                params[i] = total
    with torch.no_grad():
        return float(((torch.tanh(torch.tanh(x @ params[0]) @ params[1]) @ params[2] - y) ** 2).mean())


rules = ["fp32 master", "stochastic rounding", "Kahan (bf16 compensation)", "round to nearest"]
losses = {r: sum(train(r, s) for s in range(3)) / 3 for r in rules}
ref = losses["fp32 master"]
print(f"bench/no_master_rounding: 3-layer MLP, AdamW lr {args.lr}, {args.steps} steps, bf16 parameters, 3 seeds")
for r in rules:
    print(f"  {r:28s} final loss {losses[r]:.5f}  ({100 * (losses[r] / ref - 1):+.2f}% vs fp32 master)")
    print(f"RESULT\tno_master_rounding\t{r}\t{losses[r]:.6f}\tloss\t{ref:.6f}\tfp32 master")
