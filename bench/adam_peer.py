#!/usr/bin/env python3
"""Peer for bench/adam: torch.optim.AdamW on the CPU, same shard size and thread count.

Prints 'PEER <G elements/s>' (median of the timed steps) for each variant; bench/adam prints it
beside zrt's figure. Needs Debian's python3-torch (./scripts/bench installs it)."""
import statistics
import sys
import time

import torch


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 256 << 20
    threads = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    reps = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    torch.set_num_threads(threads)
    p = torch.nn.Parameter(torch.randn(n) * 0.1)
    p.grad = torch.randn(n) * 1e-3
    for foreach in (False, True):
        opt = torch.optim.AdamW([p], lr=1e-3, weight_decay=0.01, foreach=foreach)
        opt.step()  # warm-up: allocates and touches the moments
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            opt.step()
            times.append(time.perf_counter() - t)
        gel = n / statistics.median(times) / 1e9
        print(f"PEER torch {torch.__version__} AdamW foreach={foreach} threads={threads}: {gel:.3f} G elements/s")
        print(f"PEER_GELEMS {gel:.4f}")
        del opt


if __name__ == "__main__":
    main()
