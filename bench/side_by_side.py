#!/usr/bin/env python3
"""qkv and PyTorch eager on the same shapes, in one run, on the same CPU cores.

For each shape it runs `qkv bench` (one shape at a time, so the two alternate and see the same
machine load), then PyTorch eager on the CPU with the same number of threads: attention as the
explicit softmax(q·kᵀ·scale)·v (causal: the upper triangle masked with -inf), and the Q|K|V
projection as three x·W products (N x d_in times d_in x d). Prints one table with both and the
ratio qkv speed / torch speed (above 1: qkv is faster).

    python3 bench/side_by_side.py --qkv build/bin/qkv [--seq 1024,4096] [--dim 64] [--threads 2]
                                  [--impl fused] [--kernel auto] [--repeat 5]
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time

import torch


def timed(fn, warmup, repeat):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def torch_attention(q, k, v, causal):
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if causal:
        n = q.shape[-2]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return s.softmax(-1) @ v


def qkv_bench(exe, n, d, causal, impl, kernel, repeat):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "bench.json")
        cmd = [exe, "bench", "--seq", str(n), "--dim", str(d), "--heads", "1", "--batch", "1",
               "--causal", "yes" if causal else "no", "--precision", "fp32", "--impl", impl,
               "--repeat", str(repeat), "--warmup", "1", "--no-ceiling", "--json", out]
        if kernel != "auto":
            cmd += ["--kernel", kernel]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(out) as f:
            r = json.load(f)["results"][0]
        return r["attention_ms"]["median"], r.get("projection_ms", {}).get("median", float("nan"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qkv", required=True, help="path of the qkv executable")
    ap.add_argument("--seq", default="1024,4096")
    ap.add_argument("--dim", default="64")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--impl", default="fused", help="qkv implementation: fused or staged")
    ap.add_argument("--kernel", default="auto", help="qkv kernel family: auto, cpu or gpu")
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; qkv {a.impl}, kernel {a.kernel}; "
          f"B=1 H=1 fp32; median of {a.repeat}; machine load {os.getloadavg()[0]:.1f}")
    print(f"{'N':>6} {'d':>4} {'causal':>6} | {'qkv attn ms':>11} {'torch ms':>9} {'speed':>6} | "
          f"{'qkv proj ms':>11} {'torch ms':>9} {'speed':>6}")
    for n in (int(x) for x in a.seq.split(",")):
        for d in (int(x) for x in a.dim.split(",")):
            g = torch.Generator().manual_seed(n * 131 + d)
            x = torch.randn(n, d, generator=g)
            w = [torch.randn(d, d, generator=g) / d ** 0.5 for _ in range(3)]
            q, k, v = (x @ wi for wi in w)
            t_proj = timed(lambda: [x @ wi for wi in w], 2, max(a.repeat, 20))
            for causal in (False, True):
                attn_ms, proj_ms = qkv_bench(a.qkv, n, d, causal, a.impl, a.kernel, a.repeat)
                t_attn = timed(lambda: torch_attention(q, k, v, causal), 1, a.repeat)
                print(f"{n:>6} {d:>4} {'yes' if causal else 'no':>6} | {attn_ms:>11.2f} {t_attn:>9.2f} "
                      f"{t_attn / attn_ms:>5.2f}x | {proj_ms:>11.2f} {t_proj:>9.2f} {t_proj / proj_ms:>5.2f}x",
                      flush=True)


if __name__ == "__main__":
    main()
