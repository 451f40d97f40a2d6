#!/usr/bin/env python3
"""Decode (a few query rows against a long K/V sequence) in qkv and PyTorch eager, interleaved in
one run on the same CPU cores.

qkv: `qkv bench --decode` times context::sdpa against a kv_cache (K and V resident on the device,
only q uploaded per call), with the split-S kernels (--split on) and with one chunk (--split off);
the time compared is the host time of the whole call (upload of q, the kernels, the readback).
PyTorch 1.13 has no F.scaled_dot_product_attention, so two eager forms with grouped-query heads:
  grouped: q viewed as (B, Hkv, G·L, E) @ kᵀ, softmax, @ v (each K/V row read once per group);
  repeat_interleave: K and V repeated to Hq heads first, as enable_gqa=True is documented.
Rounds alternate qkv split, torch grouped, torch repeat_interleave, qkv unsplit, so every
measurement sees the same machine load. Prints medians per round and the ratio
torch ms / qkv ms (above 1: qkv is faster).

    /usr/bin/python3 bench/decode_side_by_side.py --qkv build/bin/qkv [--kv-seq 65536] [--q-len 1]
        [--heads 8] [--kv-heads 2] [--dim 64] [--threads 2] [--repeat 10] [--rounds 2]
"""
import argparse
import json
import os
import subprocess
import tempfile

import torch

from side_by_side import timed  # the median of `repeat` timed calls after `warmup`, in ms


def grouped(q, k, v):
    b, hq, l, e = q.shape
    hkv = k.shape[1]
    qg = q.reshape(b, hkv, (hq // hkv) * l, e)
    s = (qg @ k.transpose(-1, -2)) * e ** -0.5
    return (s.softmax(-1) @ v).reshape(b, hq, l, v.shape[-1])


def repeated(q, k, v):
    g = q.shape[1] // k.shape[1]
    kr, vr = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    s = (q @ kr.transpose(-1, -2)) * q.shape[-1] ** -0.5
    return s.softmax(-1) @ vr


def qkv_decode(exe, a, split):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "bench.json")
        cmd = [exe, "bench", "--decode", "--seq", str(a.q_len), "--kv-seq", str(a.kv_seq), "--heads",
               str(a.heads), "--kv-heads", str(a.kv_heads), "--dim", str(a.dim), "--batch", "1", "--causal", "no",
               "--precision", "fp32", "--split", "on" if split else "off", "--repeat", str(a.repeat),
               "--warmup", "2", "--no-ceiling", "--json", out]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(out) as f:
            r = json.load(f)["results"][0]
        return r["call_ms"]["median"], r["attention_ms"]["median"], r["kernel"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qkv", required=True, help="path of the qkv executable")
    ap.add_argument("--kv-seq", type=int, default=65536)
    ap.add_argument("--q-len", type=int, default=1)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(a.kv_seq)
    q = torch.randn(1, a.heads, a.q_len, a.dim, generator=g)
    k = torch.randn(1, a.kv_heads, a.kv_seq, a.dim, generator=g)
    v = torch.randn(1, a.kv_heads, a.kv_seq, a.dim, generator=g)
    assert torch.allclose(grouped(q, k, v), repeated(q, k, v), atol=1e-5)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; L={a.q_len} S={a.kv_seq} "
          f"Hq={a.heads} Hkv={a.kv_heads} d={a.dim} fp32; medians of {a.repeat}; "
          f"load average {os.getloadavg()[0]:.1f} at the start")
    print(f"{'round':>5} | {'qkv split ms':>12} {'(kernels)':>9} | {'torch grouped':>13} {'torch repeat':>12} | "
          f"{'qkv P=1 ms':>10} {'(kernels)':>9} | {'grouped/split':>13} {'repeat/split':>12} | load")
    for rnd in range(1, a.rounds + 1):
        split_ms, split_k, family = qkv_decode(a.qkv, a, True)
        t_grouped = timed(lambda: grouped(q, k, v), 2, a.repeat)
        t_repeat = timed(lambda: repeated(q, k, v), 2, a.repeat)
        one_ms, one_k, _ = qkv_decode(a.qkv, a, False)
        print(f"{rnd:>5} | {split_ms:>12.2f} {split_k:>9.2f} | {t_grouped:>13.2f} {t_repeat:>12.2f} | "
              f"{one_ms:>10.2f} {one_k:>9.2f} | {t_grouped / split_ms:>12.2f}x {t_repeat / split_ms:>11.2f}x | "
              f"{os.getloadavg()[0]:.1f}", flush=True)
    print(f"qkv kernel family: {family}")


if __name__ == "__main__":
    main()
