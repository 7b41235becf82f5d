#!/usr/bin/python3
"""Reference values for runtime/schedule_test.cc, computed with PyTorch (Debian's python3-torch 1.13).

Each schedule is run the way a torch trainer runs it: an SGD optimizer with lr = 1, the scheduler
stepped once per optimizer step, get_last_lr() read before each step. transformers' schedules are
LambdaLR over their lambdas (written out here as transformers defines them); the torch-native ones
are CosineAnnealingLR and LinearLR. Prints C++ initialisers.
"""
import math
import torch

STEPS = [0, 1, 5, 9, 10, 11, 37, 50, 99, 100]


def run(make, last):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1.0)
    sched = make(opt)
    out = []
    for _ in range(last + 1):
        out.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    return out


def hf(kind, W, T, min_lr_rate=0.0):
    def f(t):
        if kind != "constant" and t < W:
            return float(t) / float(max(1, W))
        if kind in ("constant", "warmup_constant"):
            return 1.0
        if kind == "linear":
            return max(0.0, float(T - t) / float(max(1, T - W)))
        progress = float(t - W) / float(max(1, T - W))
        factor = 0.5 * (1.0 + math.cos(math.pi * 0.5 * 2.0 * progress))
        return max(0.0, factor * (1.0 - min_lr_rate) + min_lr_rate)
    return lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, f)


def show(name, values, steps):
    print(f"// {name}")
    print("{" + ", ".join(repr(values[s]) for s in steps) + "},")


show("warmup_constant W=10", run(hf("warmup_constant", 10, 0), 100), STEPS)
show("linear W=10 T=100", run(hf("linear", 10, 100), 100), STEPS)
show("cosine W=10 T=100", run(hf("cosine", 10, 100), 100), STEPS)
show("cosine W=10 T=100 min 0.1", run(hf("cosine", 10, 100, 0.1), 100), STEPS)
seven = list(range(8))
show("CosineAnnealingLR T_max=7 eta_min=0", run(lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=7), 7), seven)
show("CosineAnnealingLR T_max=7 eta_min=0.25", run(lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=7, eta_min=0.25), 7), seven)
show("LinearLR 1 -> 0 over 7", run(lambda o: torch.optim.lr_scheduler.LinearLR(o, start_factor=1.0, end_factor=0.0, total_iters=7), 7), seven)
