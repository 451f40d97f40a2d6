#!/usr/bin/python3
"""Regenerates the ragged-batch fixture of `qkv sdpa --cu-seqlens-q/--cu-seqlens-k`
(tests/data/sdpa/varlen); run with /usr/bin/python3 (needs numpy). The files are checked in: the
build and the tests never run Python.

  varlen/q.npy (total_q, Hq, E), k.npy (total_k, Hkv, E), v.npy (total_k, Hkv, Ev)   float32
  varlen/args.txt           the flags besides the files, one line (the offsets among them)
  varlen/cu_seqlens_q.npy, cu_seqlens_k.npy   int32 (B + 1,): the same offsets as files
  varlen/expected_out.npy   float64 (total_q, Hq, Ev)
  varlen/expected_lse.npy   float64 (Hq, total_q), FlashAttention's softmax_lse layout

The reference follows FlashAttention's documented flash_attn_varlen_func: sequence b's queries are
the rows cu_seqlens_q[b]:cu_seqlens_q[b+1] of q, its keys and values those of cu_seqlens_k in k and
v; K/V head h // (Hq // Hkv) serves query head h; scores softmax_scale·q·kᵀ, capped by
softcap·tanh(s / softcap); causal keeps key j for query i when j <= i + S_b - L_b (aligned to the
bottom right of the sequence's block), and window_size (left, right) keeps
i + S_b - L_b - left <= j <= i + S_b - L_b + right. A query with no key left gets a zero output and
lse -inf (qkv's policy; the softmax of nothing).
"""
import os

import numpy as np

from make_sdpa_fixtures import save

HERE = os.path.dirname(os.path.abspath(__file__))
rng = np.random.default_rng(20261127)


def varlen_reference(q, k, v, cu_q, cu_k, softcap, window_left):
    total_q, hq, e = q.shape
    hkv, ev = k.shape[1], v.shape[2]
    out = np.zeros((total_q, hq, ev))
    lse = np.full((hq, total_q), -np.inf)
    scale = 1.0 / np.sqrt(e)
    for b in range(len(cu_q) - 1):
        qs, ks = q[cu_q[b]:cu_q[b + 1]].astype(np.float64), k[cu_k[b]:cu_k[b + 1]].astype(np.float64)
        vs = v[cu_k[b]:cu_k[b + 1]].astype(np.float64)
        length_q, length_k = qs.shape[0], ks.shape[0]
        for h in range(hq):
            g = h // (hq // hkv)
            s = scale * qs[:, h, :] @ ks[:, g, :].T
            s = softcap * np.tanh(s / softcap)
            i = np.arange(length_q)[:, None] + length_k - length_q
            j = np.arange(length_k)[None, :]
            keep = (j <= i) & (j >= i - window_left)
            for r in range(length_q):
                if not keep[r].any():
                    continue
                row = s[r][keep[r]]
                m = row.max()
                w = np.exp(row - m)
                out[cu_q[b] + r, h] = (w / w.sum()) @ vs[keep[r], g, :]
                lse[h, cu_q[b] + r] = m + np.log(w.sum())
    return out, lse


def main():
    lengths_q = [1, 3, 17, 0, 113, 9]
    lengths_k = [1, 17, 5, 4, 113, 3]  # the 17-query sequence has 5 keys: its first rows see none
    cu_q = np.concatenate([[0], np.cumsum(lengths_q)]).astype(int)
    cu_k = np.concatenate([[0], np.cumsum(lengths_k)]).astype(int)
    hq, hkv, e, ev = 4, 2, 16, 24
    q = rng.standard_normal((cu_q[-1], hq, e)).astype(np.float32)
    k = rng.standard_normal((cu_k[-1], hkv, e)).astype(np.float32)
    v = rng.standard_normal((cu_k[-1], hkv, ev)).astype(np.float32)
    softcap, window_left = 3.0, 7
    out, lse = varlen_reference(q, k, v, cu_q, cu_k, softcap, window_left)
    d = os.path.join(HERE, "varlen")
    save(os.path.join(d, "q.npy"), q)
    save(os.path.join(d, "k.npy"), k)
    save(os.path.join(d, "v.npy"), v)
    save(os.path.join(d, "expected_out.npy"), out)
    save(os.path.join(d, "expected_lse.npy"), lse)
    save(os.path.join(d, "cu_seqlens_q.npy"), cu_q.astype(np.int32))
    save(os.path.join(d, "cu_seqlens_k.npy"), cu_k.astype(np.int32))
    with open(os.path.join(d, "args.txt"), "w") as f:
        f.write("--cu-seqlens-q %s --cu-seqlens-k %s --causal --causal-align bottom-right --softcap %g --window %d,0\n"
                % (",".join(map(str, cu_q)), ",".join(map(str, cu_k)), softcap, window_left))


if __name__ == "__main__":
    main()
