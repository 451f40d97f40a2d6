"""qkv.mpi over mpi4py, run under mpirun (CTest: python.mpi, 2 ranks): every rank holds its zigzag
slices of Q, K and V, qkv.mpi.sdpa gives each rank the rows of the whole call (against the float64
reference of the whole problem, computed on every rank), on the cpu backend and on Vulkan, in both
modes; a bad input on one rank raises the same error on every rank; the README's example runs.
Exits non-zero on failure."""

import sys

import numpy as np
from mpi4py import MPI

import qkv
import qkv.mpi

comm = MPI.COMM_WORLD
rank, ranks = comm.rank, comm.size
failures = []


def check(condition, what):
    if not condition:
        failures.append(what)


rng = np.random.default_rng(42)  # the same whole problem on every rank
B, Hq, Hkv, L, S, E = 1, 4, 2, 37, 53, 32
q = rng.standard_normal((B, Hq, L, E), dtype=np.float32)
k = rng.standard_normal((B, Hkv, S, E), dtype=np.float32)
v = rng.standard_normal((B, Hkv, S, E), dtype=np.float32)
sinks = np.array([0.5, -np.inf, 1.0, 2.0], dtype=np.float32)
options = dict(is_causal=True, causal_alignment="bottom_right", window=(20, 0), softcap=5.0)
whole, whole_lse = qkv.scaled_dot_product_attention(q, k, v, enable_gqa=True, sinks=sinks, return_lse=True,
                                                    device="cpu", **options)

mine_q = qkv.mpi.slice_of(L, ranks, rank)
mine_k = qkv.mpi.slice_of(S, ranks, rank)
q_mine, k_mine, v_mine = (qkv.mpi.take(x, 2, r) for x, r in ((q, mine_q), (k, mine_k), (v, mine_k)))
want, want_lse = (qkv.mpi.take(x, 2, mine_q) for x in (whole, whole_lse))

devices = ["cpu"] + (["vulkan"] if qkv.devices() else [])
for device in devices:
    for mode in ("ring", "allgather"):
        out, lse = qkv.mpi.sdpa(comm, q_mine, k_mine, v_mine, sinks=sinks, return_lse=True, mode=mode,
                                device="cpu" if device == "cpu" else None, **options)
        error = float(np.abs(out - want).max()) if out.size else 0.0
        check(out.shape == want.shape and error < 1e-5, f"{device} {mode}: output differs by {error}")
        lse_error = float(np.abs(lse - want_lse).max()) if lse.size else 0.0
        check(lse_error < 1e-4, f"{device} {mode}: lse differs by {lse_error}")

# A bad input on one rank: the same error on every rank, the rank named.
bad = q_mine[..., :16] if rank == ranks - 1 else q_mine
try:
    qkv.mpi.sdpa(comm, bad, k_mine, v_mine, device="cpu")
    check(False, "no error for a bad slice on one rank")
except qkv.InvalidArgument as e:
    check(f"rank {ranks - 1} of {ranks}" in str(e), f"the error does not name the rank: {e}")

# The README's example of qkv.mpi ("From Python"), as written.
import os
import re

readme = open(os.path.join(os.environ.get("QKV_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", "..")),
                           "README.md"), encoding="utf-8").read()
section = readme.split("## From Python", 1)[1].split("\n## ", 1)[0]
blocks = [b for b in re.findall(r"```python\n(.*?)```", section, re.S) if "mpi4py" in b]
check(len(blocks) == 1, "the README has no qkv.mpi example")
for block in blocks:
    scope = {}
    exec(compile(block, "README.md (From Python)", "exec"), scope)
    check(scope["out"].shape[2] == sum(len(r) for r in scope["mine"]), "the README's example: wrong rows")

counts = comm.gather(len(failures), root=0)
for f in failures:
    print(f"rank {rank}: {f}", file=sys.stderr)
if rank == 0:
    print(f"qkv.mpi on {ranks} ranks, {devices}: {'ok' if sum(counts) == 0 else 'FAILED'}")
sys.exit(1 if failures else 0)
