#!/usr/bin/env python3
"""A continuous-batching decode step from Python, three ways, in one process: B sequences with
lengths drawn log-uniform in [16, --max-len] (seeded), Hq = 8 query heads over Hkv = 2 K/V heads,
d = 128, float16, pages of 16 rows in shuffled order, one new key and value per sequence appended.

  gather   flash_attn_with_kvcache over the caller's arrays, the rows of each sequence gathered on
           the host into one ragged (varlen) batch: the path the call takes for ALiBi slopes that
           differ per sequence (slopes are given, differing by 1e-7, so that the three forms do the
           same work)
  arrays   flash_attn_with_kvcache over the caller's arrays with a block_table: the pages the batch
           uses uploaded into a device pool for the call, the batched paged decode, the new rows
           written back into the arrays
  cache    qkv.paged_attention against a qkv.PagedKVCache: the pool stays on the device

Each form is timed around the Python call (time.perf_counter); rounds alternate the forms, medians
per round; the arrays forms include a copy of the two pools per call (so that every call starts
from the same cache), timed alone as "copy".

With --varlen, flash_attn_varlen_func with a block_table over the same pools (no append; sequence
b has 1 query, every fourth 17: decode beside chunks of prefill), two ways:

  gather   each sequence's rows gathered on the host into one ragged call: the route the call takes
           for ALiBi slopes that differ per sequence (or inputs that record gradients)
  paged    the library's paged call, the pages the batch reads uploaded into a device pool

    /usr/bin/python3 bench/python_paged.py [--batch 16] [--max-len 4096] [--rounds 3] [--calls 5] [--varlen]

Numbers: bench/RESULTS.md, "Python paged decode".
"""

import argparse
import os
import statistics
import time

import numpy as np
import torch

import qkv
from qkv.flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache

HQ, HKV, D, PAGE = 8, 2, 128, 16


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--max-len", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--varlen", action="store_true", help="flash_attn_varlen_func(block_table=): gather vs paged")
    a = ap.parse_args()
    torch.manual_seed(0)
    rng = np.random.default_rng(1)
    B = a.batch
    lens = np.exp(rng.uniform(np.log(16), np.log(a.max_len), B)).astype(int)
    per = [-(-(int(n) + 1) // PAGE) for n in lens]
    num_pages = sum(per)
    order = torch.randperm(num_pages)
    table = torch.zeros(B, max(per), dtype=torch.int32)
    at = 0
    for b in range(B):
        table[b, :per[b]] = order[at:at + per[b]]
        at += per[b]
    kp, vp = torch.randn(num_pages, PAGE, HKV, D).half(), torch.randn(num_pages, PAGE, HKV, D).half()
    q, k, v = torch.randn(B, 1, HQ, D).half(), torch.randn(B, 1, HKV, D).half(), torch.randn(B, 1, HKV, D).half()
    seqlens = torch.tensor(lens, dtype=torch.int32)
    same = torch.full((B, HQ), 0.01)
    differ = same.clone()
    differ[0, 0] += 1e-7
    cache = qkv.PagedKVCache(num_pages, PAGE, HKV, D, dtype="float16")
    cache.append_pages(kp, vp)
    step = dict(cache_seqlens=seqlens, block_table=table, causal=True)
    forms = {
        "gather": lambda: flash_attn_with_kvcache(q, kp.clone(), vp.clone(), k, v, alibi_slopes=differ, **step),
        "arrays": lambda: flash_attn_with_kvcache(q, kp.clone(), vp.clone(), k, v, alibi_slopes=same, **step),
        "cache": lambda: qkv.paged_attention(q, cache, table, seqlens, k=k, v=v, causal=True, alibi_slopes=same[0]),
        "copy": lambda: (kp.clone(), vp.clone()),
    }
    if a.varlen:
        lq = [17 if b % 4 == 3 else 1 for b in range(B)]
        cu_q = torch.tensor(np.concatenate([[0], np.cumsum(lq)]), dtype=torch.int32)
        cu_k = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32)
        qr = torch.randn(sum(lq), HQ, D).half()
        args = (qr, kp, vp, cu_q, cu_k, max(lq), int(lens.max()))
        forms = {
            "gather": lambda: flash_attn_varlen_func(*args, causal=True, alibi_slopes=differ, block_table=table),
            "paged": lambda: flash_attn_varlen_func(*args, causal=True, alibi_slopes=same, block_table=table),
        }
    print(f"B = {B}, {int(lens.sum())} keys (lengths {int(lens.min())}..{int(lens.max())}), Hq = {HQ}, Hkv = {HKV}, "
          f"d = {D}, float16, {num_pages} pages of {PAGE}; {qkv.default_context()}")
    ratios = "paged / gather" if a.varlen else "arrays / gather | cache / arrays"
    print("round | " + " | ".join(f"{n} ms" for n in forms) + f" | {ratios} | load")
    for r in range(a.rounds):
        med = {}
        for name, f in forms.items():
            f()
            ts = []
            for _ in range(a.calls):
                t = time.perf_counter()
                f()
                ts.append((time.perf_counter() - t) * 1e3)
            med[name] = statistics.median(ts)
        ratio = (f"{med['paged'] / med['gather']:.3f}" if a.varlen else
                 f"{med['arrays'] / med['gather']:.2f} | {med['cache'] / med['arrays']:.3f}")
        print(f"{r} | " + " | ".join(f"{med[n]:.1f}" for n in forms) + f" | {ratio} | {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
