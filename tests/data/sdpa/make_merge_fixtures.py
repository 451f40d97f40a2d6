#!/usr/bin/python3
"""Regenerates the fixtures of `qkv merge` (tests/data/sdpa/merge); run with /usr/bin/python3 (needs
numpy). The files are checked in: the build and the tests never run Python. Used by the CLI tests
(tests/cli/sdpa_features_cli.cmake).

  merge/<case>/o<p>.npy, lse<p>.npy   part p: attention over a disjoint subset of the keys, computed
                                      WITHOUT sinks (float32: the float64 reference rounded once)
  merge/<case>/sinks.npy              optional: float32 (Hq,)
  merge/<case>/expected_out.npy       float64: the whole call over every key, sinks included
  merge/<case>/expected_lse.npy       float64: its log-sum-exp (sinks not included)

The parts and the whole come from make_feature_fixtures.py's float64 reference (the semantics of
qkv/runtime/sdpa.hpp as NumPy formulas); a part's keys are the whole call's keys restricted to its
subset, its mask the whole call's allowed keys there (so rows with no key in a part, lse -inf, and
rows with no key at all occur).
"""
import os
import shutil

import numpy as np

from make_feature_fixtures import reference, save

HERE = os.path.dirname(os.path.abspath(__file__))
rng = np.random.default_rng(20261126)
f32 = np.float32


def randn(*shape):
    return rng.standard_normal(shape).astype(f32)


def merge_case(name, q, k, v, keep, subsets, softcap=0.0, sinks=None):
    """keep: bool, q's leading dimensions and S: the whole call's allowed keys; subsets: lists of key
    indices."""
    d = os.path.join(HERE, "merge", name)
    shutil.rmtree(d, ignore_errors=True)
    out, _, lse = reference(q, k, v, mask=keep, softcap=softcap, sinks=sinks)
    save(os.path.join(d, "expected_out.npy"), out)
    save(os.path.join(d, "expected_lse.npy"), lse)
    for p, keys in enumerate(subsets, start=1):
        o_p, _, lse_p = reference(q, k[..., keys, :], v[..., keys, :], mask=keep[..., keys], softcap=softcap)
        save(os.path.join(d, "o%d.npy" % p), o_p.astype(f32))
        save(os.path.join(d, "lse%d.npy" % p), lse_p.astype(f32))
    if sinks is not None:
        save(os.path.join(d, "sinks.npy"), sinks)
    print(name, q.shape, k.shape, [len(s) for s in subsets], "sinks" if sinks is not None else "")


def main():
    shutil.rmtree(os.path.join(HERE, "merge"), ignore_errors=True)
    # Two contiguous halves, GQA 4:2, causal bottom-right with a key-padding mask, softcap and sinks;
    # row 0 of batch 1 attends nothing, early rows see no key of the second half.
    B, Hq, Hkv, L, S = 2, 4, 2, 5, 80
    q, k, v = randn(B, Hq, L, 32), randn(B, Hkv, S, 32), randn(B, Hkv, S, 24)
    i, j = np.arange(L)[:, None], np.arange(S)[None, :]
    keep = np.broadcast_to(j <= i + S - L - 40, (B, Hq, L, S)).copy()
    keep &= rng.random((B, 1, 1, S)) < 0.8
    keep[1, :, 0, :] = False
    sinks = (randn(Hq) * 2).astype(f32)
    sinks[1] = -np.inf
    merge_case("halves_sinks", q, k, v, keep, [list(range(0, 30)), list(range(30, S))], softcap=10.0, sinks=sinks)
    # Three interleaved key sets, 2-D (L, Ev), no sinks.
    L, S = 7, 45
    q, k, v = randn(L, 32), randn(S, 32), randn(S, 16)
    keep = np.ones((L, S), dtype=bool)
    merge_case("interleaved_three", q, k, v, keep, [list(range(0, S, 3)), list(range(1, S, 3)), list(range(2, S, 3))])


if __name__ == "__main__":
    main()
