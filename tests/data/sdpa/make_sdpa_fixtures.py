#!/usr/bin/python3
"""Regenerates the scaled-dot-product-attention fixtures (tests/data/sdpa); run with /usr/bin/python3
(needs numpy; torch, if present, cross-checks the reference). The files are checked in: the build
and the tests never run Python. Used by tests/cpu_sdpa_test.cpp and the `qkv sdpa` CLI tests.

  <case>/q.npy, k.npy, v.npy   the inputs (float32, or float64 in float64/)
  <case>/mask.npy              optional: bool (True = may attend) or float (added to the scores)
  <case>/args.txt              the `qkv sdpa` flags of the case besides the files, one line
  <case>/expected_out.npy      float64, q's leading dimensions and Ev columns
  <case>/expected_weights.npy  float64 (…, L, S), where the case checks the weights too

The reference follows PyTorch's documented F.scaled_dot_product_attention(q, k, v, attn_mask,
is_causal, scale, enable_gqa=True): K and V repeat_interleave'd over the query heads, scores scaled
q·kᵀ, a bool mask keeps True, a float mask is added, is_causal keeps tril(ones(L, S)) (top-left),
the KV-cache alignment tril(ones(L, S), S - L) (bottom-right). Where PyTorch returns NaN (a row that
may attend to nothing) the expected values follow qkv's policy: zero weights and a zero output.
"""
import io
import os
import shutil

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
rng = np.random.default_rng(20261123)


def save(path, arr):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    buf = io.BytesIO()
    np.save(buf, arr)
    with open(path, "wb") as f:
        f.write(buf.getvalue())


def randn(*shape, scale=1.0, dtype=np.float32):
    return (rng.standard_normal(shape) * scale).astype(dtype)


def as4(a):
    """(·,·) and (H,·,·) are batch 1 (and one head)."""
    while a.ndim < 4:
        a = a[np.newaxis]
    return a


def reference(q, k, v, mask=None, causal=False, align="top-left", scale=None):
    """float64 SDPA with PyTorch's semantics; returns (out, weights) with q's leading dimensions."""
    lead = q.shape[:-1]
    q4, k4, v4 = (as4(a.astype(np.float64)) for a in (q, k, v))
    B, Hq, L, E = q4.shape
    Hkv, S = k4.shape[1], k4.shape[2]
    assert Hq % Hkv == 0
    k4 = np.repeat(k4, Hq // Hkv, axis=1)  # = torch.repeat_interleave(k, Hq // Hkv, dim=1)
    v4 = np.repeat(v4, Hq // Hkv, axis=1)
    scale = 1.0 / np.sqrt(E) if scale is None else float(np.float32(scale))
    s = (q4 @ np.swapaxes(k4, -1, -2)) * scale
    allowed = np.ones((B, Hq, L, S), dtype=bool)
    if mask is not None:
        if mask.dtype == np.bool_:
            allowed &= np.broadcast_to(mask, (B, Hq, L, S))
        else:
            s = s + np.broadcast_to(mask.astype(np.float64), (B, Hq, L, S))
    if causal:
        allowed &= np.tril(np.ones((L, S), dtype=bool), 0 if align == "top-left" else S - L)
    allowed &= s != -np.inf
    s = np.where(allowed, s, -np.inf)
    any_row = allowed.any(axis=-1, keepdims=True)
    m = np.where(any_row, s.max(axis=-1, keepdims=True), 0.0)
    e = np.where(allowed, np.exp(s - m), 0.0)
    w = np.where(any_row, e / np.where(any_row, e.sum(axis=-1, keepdims=True), 1.0), 0.0)
    out = w @ v4
    return out.reshape(lead + (out.shape[-1],)), w.reshape(lead + (S,))


def torch_check(q, k, v, mask, causal, out, weights):
    """Where torch 1.13's private SDPA can take the case (no GQA, bool mask, top-left), agree with it."""
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return
    if not hasattr(F, "_scaled_dot_product_attention"):
        return
    t = lambda a: torch.from_numpy(as4(a.astype(np.float64)).copy())
    m = None if mask is None else torch.from_numpy(np.broadcast_to(mask, as4(weights).shape).copy())
    o, w = F._scaled_dot_product_attention(t(q), t(k), t(v), m, 0.0, True, causal)
    assert np.allclose(o.numpy().reshape(out.shape), out, rtol=1e-12, atol=1e-12), "torch disagrees"
    assert np.allclose(w.numpy().reshape(weights.shape), weights, rtol=1e-12, atol=1e-12), "torch disagrees"
    print("   torch agrees")


def case(name, q, k, v, mask=None, causal=False, align="top-left", scale=None, weights=False, torch_ok=False):
    d = os.path.join(HERE, name)
    shutil.rmtree(d, ignore_errors=True)
    save(os.path.join(d, "q.npy"), q)
    save(os.path.join(d, "k.npy"), k)
    save(os.path.join(d, "v.npy"), v)
    args = []
    if mask is not None:
        save(os.path.join(d, "mask.npy"), mask)
    if causal:
        args += ["--causal", "--causal-align", align]
    if scale is not None:
        args += ["--scale", repr(scale)]
    out, w = reference(q, k, v, mask, causal, align, scale)
    save(os.path.join(d, "expected_out.npy"), out)
    if weights:
        save(os.path.join(d, "expected_weights.npy"), w)
    with open(os.path.join(d, "args.txt"), "w") as f:
        f.write(" ".join(args) + "\n")
    print(name, q.shape, k.shape, v.shape, None if mask is None else (mask.dtype, mask.shape), args)
    if torch_ok:
        torch_check(q, k, v, mask, causal, out, w)


def main():
    # Cross-attention, 2-D: L != S, E != Ev.
    case("plain_2d", randn(3, 16), randn(300, 16), randn(300, 24), weights=True, torch_ok=True)
    # GQA 4-D (Hq 4, Hkv 2), E = 64, an explicit scale.
    case("gqa_4d_scale", randn(2, 4, 37, 64), randn(2, 2, 300, 64), randn(2, 2, 300, 8), scale=0.2)
    # Causal, top-left, 3-D, L < S, with weights.
    case("causal_top_left_3d", randn(3, 37, 16), randn(3, 300, 16), randn(3, 300, 16), causal=True,
         weights=True, torch_ok=True)
    # Causal, bottom-right, GQA 3-D (Hq 4, Hkv 2), E = Ev = 80.
    case("causal_bottom_right_gqa", randn(4, 37, 80), randn(2, 300, 80), randn(2, 300, 80), causal=True,
         align="bottom-right")
    # L > S = 1: top-left, every row sees key 0; bottom-right, only the last row sees anything.
    q, k, v = randn(37, 16), randn(1, 16), randn(1, 16)
    case("causal_top_left_s1", q, k, v, causal=True, weights=True, torch_ok=True)
    case("causal_bottom_right_s1", q, k, v, causal=True, align="bottom-right", weights=True)
    # A key-padding bool mask (B, 1, 1, S) over GQA.
    keep = rng.random((2, 1, 1, 300)) < 0.7
    case("bool_mask_key_padding", randn(2, 4, 3, 16), randn(2, 2, 300, 16), randn(2, 2, 300, 24), mask=keep,
         weights=True)
    # An L x S bool mask with one row fully masked: that row is zero.
    keep = rng.random((3, 300)) < 0.5
    keep[1, :] = False
    case("bool_mask_empty_row", randn(3, 16), randn(300, 16), randn(300, 16), mask=keep, weights=True)
    # An additive (Hq, 1, S) mask with -inf entries, combined with bottom-right causal, L = 37, GQA 4:1.
    add = randn(4, 1, 300)
    add[rng.random(add.shape) < 0.2] = -np.inf
    case("additive_mask_causal", randn(2, 4, 37, 16), randn(2, 1, 300, 16), randn(2, 1, 300, 16), mask=add,
         causal=True, align="bottom-right")
    # Decode: one query per head, S = 5000, GQA 4:1, a (1, S) bool mask and bottom-right causal.
    keep = rng.random((1, 5000)) < 0.9
    case("decode_5000", randn(1, 4, 1, 16), randn(1, 1, 5000, 16), randn(1, 1, 5000, 8), mask=keep, causal=True,
         align="bottom-right", weights=True)
    # L = S = 1.
    case("single", randn(1, 16), randn(1, 16), randn(1, 16), weights=True)
    # float64 beyond float32: q by 1e100, k by 1e-100 (scores of order 1), an additive -1e300.
    add = randn(2, 3, 300, dtype=np.float64)
    add[:, :, ::7] = -1e300
    case("float64", randn(2, 3, 16, dtype=np.float64, scale=1e100), randn(2, 300, 16, dtype=np.float64, scale=1e-100),
         randn(2, 300, 16, dtype=np.float64), mask=add, weights=True)
    # Any finite scale, as PyTorch: a negative one (GQA, a key-padding mask, bottom-right causal) and
    # zero (every allowed key gets the same weight).
    keep = rng.random((2, 1, 1, 113)) < 0.8
    case("scale_negative", randn(2, 4, 17, 32), randn(2, 2, 113, 32), randn(2, 2, 113, 24), mask=keep, causal=True,
         align="bottom-right", scale=-0.35, weights=True)
    case("scale_zero", randn(3, 17, 16), randn(3, 113, 16), randn(3, 113, 8), causal=True, scale=0.0, weights=True)


if __name__ == "__main__":
    main()
