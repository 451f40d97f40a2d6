#!/usr/bin/env python3
"""What calling qkv from Python adds to a decode step: L = 1 query row, S = 4096 keys, Hq = 32
query heads over Hkv = 8 K/V heads, d = 128, float32 (a Llama-3-8B-shaped layer), on the default
Vulkan device.

Two forms of the step:
  cache   qkv.KVCache.decode(q): K/V resident on the device, q uploaded (context::sdpa(problem, cache))
  host    qkv.scaled_dot_product_attention(q, k, v, enable_gqa=True): K and V from the host each call
          (context::sdpa(problem), which packs them into the device's buffers)

For each call, the time the Python call took (time.perf_counter around it) beside the time the C++
call itself took, as the library measured it inside (Context.last_call()["host_ms"]): the same call,
the same process, so their ratio is what Python adds (reading the arrays, the options, the result as
an array). Rounds alternate the two forms; medians per round. With --tool build/gcc/bin/qkv, each
round also runs `qkv bench` for the same step in its own process (the C++ program's own medians).

    /usr/bin/python3 bench/python_overhead.py [--rounds 5] [--calls 30] [--tool build/gcc/bin/qkv]

Numbers: bench/RESULTS.md, "Python overhead".
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import qkv

L, S, HQ, HKV, D = 1, 4096, 32, 8, 128


def load():
    try:
        return open("/proc/loadavg").read().split()[:3]
    except OSError:
        return ["?"] * 3


def bench_tool(tool, decode):
    """The same step timed by `qkv bench` in its own process: its median call_ms."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "bench.json")
        cmd = [tool, "bench", "--seq", str(L), "--kv-seq", str(S), "--heads", str(HQ), "--kv-heads", str(HKV),
               "--dim", str(D), "--causal", "no", "--precision", "fp32", "--no-ceiling", "--repeat", "30",
               "--warmup", "3", "--json", out]
        if decode:
            cmd += ["--decode", "--split", "on"]
        subprocess.run(cmd, check=True, capture_output=True)
        rows = json.load(open(out))["results"]
        return rows[0]["call_ms"]["median"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--tool", help="the qkv tool, to also time the step with `qkv bench`")
    args = parser.parse_args()

    ctx = qkv.Context()
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, HQ, L, D), dtype=np.float32)
    k = rng.standard_normal((1, HKV, S, D), dtype=np.float32)
    v = rng.standard_normal((1, HKV, S, D), dtype=np.float32)
    cache = qkv.KVCache(ctx, 1, HKV, S, D, D)
    cache.append(k, v)
    forms = {
        "cache": lambda: cache.decode(q),
        "host": lambda: qkv.scaled_dot_product_attention(q, k, v, enable_gqa=True, device=ctx),
    }
    for f in forms.values():  # pipelines built, buffers allocated
        for _ in range(3):
            f()

    print(f"# {ctx.device.name}; L={L} S={S} Hq={HQ} Hkv={HKV} d={D} fp32; {args.rounds} rounds x {args.calls} calls;"
          f" load average before {' '.join(load())}")
    print("round  form   python_ms  cpp_ms  ratio" + ("  qkv_bench_ms" if args.tool else ""))
    ratios = {name: [] for name in forms}
    for r in range(args.rounds):
        for name, f in forms.items():
            wall, cpp = [], []
            for _ in range(args.calls):
                start = time.perf_counter()
                f()
                wall.append((time.perf_counter() - start) * 1e3)
                cpp.append(ctx.last_call()["host_ms"])
            w, c = statistics.median(wall), statistics.median(cpp)
            ratios[name].append(w / c)
            line = f"{r:5d}  {name:5s}  {w:9.3f}  {c:6.3f}  {w / c:5.3f}"
            if args.tool:
                line += f"  {bench_tool(args.tool, name == 'cache'):12.3f}"
            print(line, flush=True)
    print(f"# load average after {' '.join(load())}")
    for name, rs in ratios.items():
        print(f"# {name}: python / C++ median ratio {statistics.median(rs):.3f} (rounds {min(rs):.3f}-{max(rs):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
