#!/usr/bin/env python3
"""PyTorch's attention on the shapes `qkv bench` sweeps, for a side-by-side comparison on the same
device. Times torch.nn.functional.scaled_dot_product_attention where the installed torch has it
(2.0 and later), else the explicit softmax(Q·Kᵀ·scale)·V; median and range of --repeat timed calls
after --warmup, with the same FLOP convention as qkv bench (4·B·H·N²·d, half when causal).
--backward times eager autograd's backward pass too (out.backward(d_out), the forward done
beforehand), as `qkv bench --backward` times qkv's, with its ratio to the forward.

    python3 bench/torch_attention.py [--device cuda|cpu] [--seq 512,1024] [--heads 8] [--dim 64]
                                     [--batch 1] [--precision fp32,fp16] [--repeat 20] [--json FILE]
                                     [--backward]
"""
import argparse
import json
import statistics
import time

import torch


def attention(q, k, v, causal):
    sdpa = getattr(torch.nn.functional, "scaled_dot_product_attention", None)
    if sdpa is not None:
        return sdpa(q, k, v, is_causal=causal)
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if causal:
        n = q.shape[-2]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return s.softmax(-1) @ v


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seq", default="512,1024,2048,4096,8192")
    ap.add_argument("--heads", default="8")
    ap.add_argument("--dim", default="64")
    ap.add_argument("--batch", default="1")
    ap.add_argument("--precision", default="fp32,fp16")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json")
    ap.add_argument("--backward", action="store_true", help="time autograd's backward pass too")
    a = ap.parse_args()
    ints = lambda s: [int(x) for x in s.split(",")]
    dev = torch.device(a.device)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"torch {torch.__version__} on {name}; "
          f"{'scaled_dot_product_attention' if hasattr(torch.nn.functional, 'scaled_dot_product_attention') else 'explicit softmax(QK^T)V'}")
    print(f"{'B':>2} {'H':>3} {'N':>6} {'d':>4} {'causal':>6} {'prec':>5} {'ms':>9} {'range':>17} {'GFLOP/s':>9}"
          + (f" {'backward ms':>12} {'range':>17} {'bwd/fwd':>8}" if a.backward else ""))
    rows = []
    for b in ints(a.batch):
        for h in ints(a.heads):
            for n in ints(a.seq):
                for d in ints(a.dim):
                    for causal in (False, True):
                        for prec in a.precision.split(","):
                            dtype = torch.float16 if prec == "fp16" else torch.float32
                            if dtype == torch.float16 and dev.type == "cpu":
                                continue  # half-precision matmul on a CPU is not what anyone runs
                            g = torch.Generator(device="cpu").manual_seed(n * 131 + d)
                            q, k, v = (torch.randn(b, h, n, d, generator=g).to(dev, dtype) for _ in range(3))
                            times, back = [], []
                            d_out = torch.randn(b, h, n, d, generator=g).to(dev, dtype)
                            for t in (q, k, v):
                                t.requires_grad_(a.backward)
                            for i in range(a.warmup + a.repeat):
                                if a.backward:
                                    t0 = time.perf_counter()
                                    out = attention(q, k, v, causal)
                                    ms = (time.perf_counter() - t0) * 1e3
                                    if dev.type == "cuda":
                                        torch.cuda.synchronize()
                                        ms = (time.perf_counter() - t0) * 1e3
                                    t1 = time.perf_counter()
                                    out.backward(d_out)
                                    if dev.type == "cuda":
                                        torch.cuda.synchronize()
                                    if i >= a.warmup:
                                        times.append(ms)
                                        back.append((time.perf_counter() - t1) * 1e3)
                                    for t in (q, k, v):
                                        t.grad = None
                                    continue
                                if dev.type == "cuda":
                                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                                    start.record()
                                    attention(q, k, v, causal)
                                    end.record()
                                    torch.cuda.synchronize()
                                    ms = start.elapsed_time(end)
                                else:
                                    t0 = time.perf_counter()
                                    attention(q, k, v, causal)
                                    ms = (time.perf_counter() - t0) * 1e3
                                if i >= a.warmup:
                                    times.append(ms)
                            flop = 4 * b * h * n * n * d / (2 if causal else 1)
                            med = statistics.median(times)
                            row = dict(batch=b, heads=h, seq=n, dim=d, causal=causal, precision=prec,
                                       median_ms=med, min_ms=min(times), max_ms=max(times),
                                       gflops=flop / (med * 1e6))
                            line = (f"{b:>2} {h:>3} {n:>6} {d:>4} {'yes' if causal else 'no':>6} {prec:>5} {med:>9.3f} "
                                    f"{min(times):>8.3f}-{max(times):<8.3f} {flop / (med * 1e6):>9.1f}")
                            if a.backward:
                                bmed = statistics.median(back)
                                row.update(backward_median_ms=bmed, backward_min_ms=min(back),
                                           backward_max_ms=max(back), backward_over_forward=bmed / med)
                                line += f" {bmed:>12.3f} {min(back):>8.3f}-{max(back):<8.3f} {bmed / med:>8.2f}"
                            rows.append(row)
                            print(line)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(torch=torch.__version__, device=name, results=rows), f, indent=2)


if __name__ == "__main__":
    main()
