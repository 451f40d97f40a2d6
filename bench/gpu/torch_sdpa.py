#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention on the shapes bench/gpu/check.sh times qkv on, on the same
GPU in the same run: the flash backend (FlashAttention-2 in PyTorch) where it takes the call (fp16),
else the memory-efficient one (fp32), timed by CUDA events around each call; median and range of
--repeat calls after --warmup. FLOP: 4·B·H·N·S·d, half with causal (qkv bench's convention).

--backward N adds training rows at L = S = N (the batch tokens / N, --heads, each --dim and
precision, causal and not), as `qkv bench --backward` times qkv: the forward alone, and the backward
alone (torch.autograd.grad of the forward's output against a fixed random d_out, the graph kept
between calls), each timed by CUDA events, and backward / forward. The backward's FLOP are counted
as 2.5 times the forward's (FlashAttention-2's convention: five products against two).

    python3 bench/gpu/torch_sdpa.py --json FILE [--seq 1024,...] [--dim 64,128] [--tokens 16384]
                                    [--heads 16] [--precision fp16,fp32] [--decode 65536]
                                    [--backward 4096]

Without CUDA (a dry run on a CPU machine) it runs the same loop on the CPU with the math backend,
and says so in the JSON: those numbers compare nothing.
"""
import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F


def backends_for(dtype, cuda):
    """The SDPA backends to try, in order, and their names."""
    try:
        from torch.nn.attention import SDPBackend
    except ImportError:  # torch < 2.2: no choice (before 2.0, the explicit product)
        return [(None, "default" if hasattr(F, "scaled_dot_product_attention") else "explicit softmax(QK^T)V")]
    if not cuda:
        return [(SDPBackend.MATH, "math")]
    if dtype == torch.float16:
        return [(SDPBackend.FLASH_ATTENTION, "flash"), (SDPBackend.EFFICIENT_ATTENTION, "efficient")]
    return [(SDPBackend.EFFICIENT_ATTENTION, "efficient"), (SDPBackend.MATH, "math")]


def explicit(q, k, v, causal):
    """softmax(Q·Kᵀ·scale)·V for a torch without scaled_dot_product_attention (before 2.0)."""
    if k.shape[1] != q.shape[1]:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if causal:
        n, m = q.shape[-2], k.shape[-2]
        s = s.masked_fill(torch.ones(n, m, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return s.softmax(-1) @ v


def run(q, k, v, causal, backend, gqa):
    if not hasattr(F, "scaled_dot_product_attention"):
        return explicit(q, k, v, causal)
    kwargs = {"is_causal": causal}
    if gqa:
        kwargs["enable_gqa"] = True
    if backend is None:
        return F.scaled_dot_product_attention(q, k, v, **kwargs)
    from torch.nn.attention import sdpa_kernel

    with sdpa_kernel([backend]):
        return F.scaled_dot_product_attention(q, k, v, **kwargs)


def timed(fn, cuda, repeat, warmup):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
    return times


def one(shape, dtype, causal, cuda, repeat, warmup, gqa=False):
    b, hq, hkv, n, s, d = shape
    dev = torch.device("cuda" if cuda else "cpu")
    g = torch.Generator(device="cpu").manual_seed(n * 131 + d)
    q = torch.randn(b, hq, n, d, generator=g).to(dev, dtype)
    k = torch.randn(b, hkv, s, d, generator=g).to(dev, dtype)
    v = torch.randn(b, hkv, s, d, generator=g).to(dev, dtype)
    row = {"batch": b, "heads": hq, "kv_heads": hkv, "seq": n, "kv_seq": s, "dim": d, "causal": causal,
           "precision": "fp16" if dtype == torch.float16 else "fp32"}
    for backend, name in backends_for(dtype, cuda):
        try:
            run(q, k, v, causal, backend, gqa)
            times = timed(lambda: run(q, k, v, causal, backend, gqa), cuda, repeat, warmup)
        except RuntimeError as e:  # this backend does not take the call: the next
            row.setdefault("refused", {})[name] = str(e).splitlines()[0][:200]
            continue
        flop = 4.0 * b * hq * n * s * d * (0.5 if causal and n == s else 1.0)
        med = statistics.median(times)
        row.update(backend=name, ms={"median": med, "min": min(times), "max": max(times)},
                   tflops=flop / (med * 1e-3) / 1e12)
        return row
    row["backend"] = None
    return row


def one_backward(shape, dtype, causal, cuda, repeat, warmup):
    """The forward and the backward of one shape, timed apart, on the first backend that takes both."""
    b, h, n, d = shape
    dev = torch.device("cuda" if cuda else "cpu")
    g = torch.Generator(device="cpu").manual_seed(n * 137 + d)
    q, k, v, d_out = (torch.randn(b, h, n, d, generator=g).to(dev, dtype) for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_(True)
    row = {"batch": b, "heads": h, "kv_heads": h, "seq": n, "kv_seq": n, "dim": d, "causal": causal,
           "precision": "fp16" if dtype == torch.float16 else "fp32", "backward": True}
    for backend, name in backends_for(dtype, cuda):
        try:
            with torch.no_grad():
                forward = timed(lambda: run(q, k, v, causal, backend, False), cuda, repeat, warmup)
            out = run(q, k, v, causal, backend, False)
            grads = torch.autograd.grad(out, (q, k, v), d_out, retain_graph=True)
            if not all(bool(torch.isfinite(x).all()) for x in grads):
                row.setdefault("refused", {})[name] = "a gradient has NaN or Inf: not timing a broken result"
                continue
            backward = timed(lambda: torch.autograd.grad(out, (q, k, v), d_out, retain_graph=True), cuda, repeat,
                             warmup)
        except RuntimeError as e:  # this backend does not take the call (or its backward): the next
            row.setdefault("refused", {})[name] = str(e).splitlines()[0][:200]
            continue
        flop = 4.0 * b * h * n * n * d * (0.5 if causal else 1.0)
        f, bw = statistics.median(forward), statistics.median(backward)
        row.update(backend=name, forward_ms={"median": f, "min": min(forward), "max": max(forward)},
                   backward_ms={"median": bw, "min": min(backward), "max": max(backward)},
                   backward_over_forward=bw / f, forward_tflops=flop / (f * 1e-3) / 1e12,
                   backward_tflops=2.5 * flop / (bw * 1e-3) / 1e12)
        return row
    row["backend"] = None
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", default="1024,2048,4096,8192,16384")
    ap.add_argument("--dim", default="64,128")
    ap.add_argument("--tokens", type=int, default=16384, help="B·N: the batch is tokens / N (at least 1)")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--precision", default="fp16,fp32")
    ap.add_argument("--decode", type=int, default=65536, help="keys of the decode step (L = 1, 32/8 heads, d 128); 0: none")
    ap.add_argument("--backward", default="", help="L = S of the training rows (forward and backward), e.g. 4096")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    cuda = torch.cuda.is_available()
    info = {"torch": torch.__version__, "cuda": cuda,
            "device": torch.cuda.get_device_name(0) if cuda else "CPU (no CUDA: these numbers compare nothing)"}
    print(f"torch {info['torch']} on {info['device']}", flush=True)
    rows = []
    for n in (int(x) for x in a.seq.split(",")):
        for d in (int(x) for x in a.dim.split(",")):
            for prec in a.precision.split(","):
                dtype = torch.float16 if prec == "fp16" else torch.float32
                if dtype == torch.float16 and not cuda:
                    continue
                for causal in (False, True):
                    b = max(1, a.tokens // n)
                    r = one((b, a.heads, a.heads, n, n, d), dtype, causal, cuda, a.repeat, a.warmup)
                    rows.append(r)
                    print(f"  N {n:6} d {d:4} {prec} causal {causal!s:5} {r.get('backend')}: "
                          f"{r.get('ms', {}).get('median', float('nan')):9.3f} ms {r.get('tflops', 0):8.2f} TFLOP/s",
                          flush=True)
    if a.decode:
        for prec in a.precision.split(","):
            dtype = torch.float16 if prec == "fp16" else torch.float32
            if dtype == torch.float16 and not cuda:
                continue
            # one query row against every key: no causal mask (PyTorch's is top-left)
            r = one((1, 32, 8, 1, a.decode, 128), dtype, False, cuda, a.repeat, a.warmup, gqa=True)
            r["decode"] = True
            rows.append(r)
            print(f"  decode S {a.decode} {prec} {r.get('backend')}: "
                  f"{r.get('ms', {}).get('median', float('nan')):9.3f} ms", flush=True)
    for n in (int(x) for x in a.backward.split(",") if x):
        for d in (int(x) for x in a.dim.split(",")):
            for prec in a.precision.split(","):
                dtype = torch.float16 if prec == "fp16" else torch.float32
                if dtype == torch.float16 and not cuda:
                    continue
                for causal in (False, True):
                    r = one_backward((max(1, a.tokens // n), a.heads, n, d), dtype, causal, cuda, a.repeat, a.warmup)
                    rows.append(r)
                    print(f"  backward N {n:6} d {d:4} {prec} causal {causal!s:5} {r.get('backend')}: forward "
                          f"{r.get('forward_ms', {}).get('median', float('nan')):9.3f} ms, backward "
                          f"{r.get('backward_ms', {}).get('median', float('nan')):9.3f} ms "
                          f"({r.get('backward_tflops', 0):8.2f} TFLOP/s)", flush=True)
    with open(a.json, "w") as f:
        json.dump({"info": info, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
