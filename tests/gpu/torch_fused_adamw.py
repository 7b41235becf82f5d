#!/usr/bin/env python3
"""Peer for bench/adam_gpu: torch.optim.AdamW(fused=True) on one GPU, same shard size.
Prints 'PEER_GELEMS <G elements/s>' (median of timed steps), or nothing when torch/CUDA is missing."""
import sys

try:
    import torch
except ImportError:
    sys.exit(0)


def main():
    if not torch.cuda.is_available():
        return
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 256 << 20
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    p = torch.nn.Parameter(torch.zeros(n, device="cuda"))
    p.grad = torch.zeros(n, device="cuda")
    try:
        opt = torch.optim.AdamW([p], lr=1e-3, weight_decay=0.01, fused=True)
    except (TypeError, RuntimeError):
        opt = torch.optim.AdamW([p], lr=1e-3, weight_decay=0.01, foreach=True)
    opt.step()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        opt.step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    ms = times[len(times) // 2]
    print(f"torch {torch.__version__} AdamW fused: {n / ms / 1e6:.2f} G elements/s")
    print(f"PEER_GELEMS {n / ms / 1e6:.4f}")


if __name__ == "__main__":
    main()
