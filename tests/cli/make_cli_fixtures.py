#!/usr/bin/python3
"""Regenerates the fixtures of the qkv CLI tests (tests/data/cli); run with /usr/bin/python3
(needs numpy and torch). The files are checked in: the build and the tests never run Python.

  parity/<case>/   inputs of one `qkv attention` run (x.npy, wq.npy, ... as the flags are named)
                   and what PyTorch computes for them: expected_out.npy (float64) and, where
                   torch's weights are comparable, expected_weights.npy (float64)
  tutorial/        the tutorial's worked example, for the flag and error tests
  formats/         the tutorial's x in other .npy encodings qkv accepts
  float64/         float64 inputs beyond float32 (a -1e300 mask; x by 1e200, weights by 1e-200)
  bad/             files qkv must refuse

qkv's convention is the tutorial's, Q = X·Wq: torch.nn.MultiheadAttention computes x @ W.T, so
its in_proj_weight is [Wq.T; Wk.T; Wv.T] and its out_proj.weight is Wo.T. torch's boolean
attn_mask means "may NOT attend": it gets qkv's mask inverted. Where torch returns NaN (a row
that may attend to nothing) the expected values follow qkv's policy instead: zero weights and a
zero attention output, so the output row is bo (the output projection of zero).
"""
import io
import os
import shutil

import numpy as np
import torch
from numpy.lib import format as npformat

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "data", "cli")
rng = np.random.default_rng(20240611)


def save(path, arr, version=None):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    buf = io.BytesIO()
    if version is None:
        np.save(buf, arr)
    else:
        npformat.write_array(buf, arr, version=version)
    with open(path, "wb") as f:
        f.write(buf.getvalue())


def randn(*shape, scale=1.0, dtype=np.float32):
    return (rng.standard_normal(shape) * scale).astype(dtype)


# ---- A float64 reference in qkv's convention, for shapes torch's MHA cannot take ----------------
def reference(x, wq, wk, wv, heads, scale, bq=None, bk=None, bv=None, wo=None, bo=None, allowed=None,
              additive=None, causal=False):
    """x (B, N, d_in); allowed/additive (B, N, N) or None. Returns out (B, N, d), weights (B, H, N, N)."""
    x = x.astype(np.float64)
    f = lambda a: None if a is None else a.astype(np.float64)
    q = x @ f(wq) + (0 if bq is None else f(bq))
    k = x @ f(wk) + (0 if bk is None else f(bk))
    v = x @ f(wv) + (0 if bv is None else f(bv))
    B, N, _ = x.shape
    dkh, dvh = wq.shape[1] // heads, wv.shape[1] // heads
    ok = np.ones((B, N, N), dtype=bool) if allowed is None else allowed.copy()
    if causal:
        ok &= np.tril(np.ones((N, N), dtype=bool))
    weights = np.zeros((B, heads, N, N))
    concat = np.zeros((B, N, wv.shape[1]))
    for b in range(B):
        for h in range(heads):
            s = q[b, :, h * dkh:(h + 1) * dkh] @ k[b, :, h * dkh:(h + 1) * dkh].T * scale
            if additive is not None:
                s = s + f(additive[b])
            allow = ok[b] & (s != -np.inf)
            for i in range(N):
                if not allow[i].any():
                    continue  # fully masked: zero weights, zero output
                e = np.where(allow[i], np.exp(np.where(allow[i], s[i], 0) - s[i][allow[i]].max()), 0.0)
                weights[b, h, i] = e / e.sum()
            concat[b, :, h * dvh:(h + 1) * dvh] = weights[b, h] @ v[b, :, h * dvh:(h + 1) * dvh]
    out = concat if wo is None else concat @ f(wo) + (0 if bo is None else f(bo))
    return out, weights


# ---- PyTorch ----------------------------------------------------------------------------------
def torch_mha(x, wq, wk, wv, wo, heads, bq=None, bk=None, bv=None, bo=None, attn_mask=None):
    """torch.nn.MultiheadAttention in float64 with qkv's weights (d_in = d_k = d_v = d_out = E).
    x is (N, E) or (B, N, E); attn_mask in torch's convention. Returns out, per-head weights."""
    E = x.shape[-1]
    has_bias = bq is not None
    mha = torch.nn.MultiheadAttention(E, heads, bias=has_bias, batch_first=True, dtype=torch.float64)
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a, dtype=np.float64))
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.cat([t(wq).T, t(wk).T, t(wv).T]))
        mha.out_proj.weight.copy_(t(wo).T)
        if has_bias:
            mha.in_proj_bias.copy_(torch.cat([t(bq), t(bk), t(bv)]))
            mha.out_proj.bias.copy_(t(bo))
        xt = t(x)
        out, w = mha(xt, xt, xt, attn_mask=attn_mask, need_weights=True, average_attn_weights=False)
    return out.numpy(), w.numpy()


def torch_bool_mask(allowed, heads):
    """qkv's (N, N) or (B, N, N) 'may attend' -> torch's 'may not attend', (B*H, N, N) if batched."""
    m = torch.from_numpy(~allowed)
    return m if m.dim() == 2 else m.repeat_interleave(heads, dim=0)


def torch_float_mask(additive, heads):
    m = torch.from_numpy(additive.astype(np.float64))
    return m if m.dim() == 2 else m.repeat_interleave(heads, dim=0)


def follow_qkv_policy(out, weights, bo):
    """Rows torch left NaN (fully masked) become what qkv computes: weights 0, output bo."""
    out, weights = out.copy(), weights.copy()
    rows = np.isnan(out).any(axis=-1)
    out[rows] = 0.0 if bo is None else bo.astype(np.float64)
    weights[np.isnan(weights)] = 0.0
    return out, weights


def check_against_reference(out, weights, x, heads, allowed=None, additive=None, causal=False, **w):
    """Our numpy reference must agree with torch wherever it is used in place of torch."""
    x3 = x if x.ndim == 3 else x[None]
    a3 = None if allowed is None else (allowed if allowed.ndim == 3 else allowed[None])
    m3 = None if additive is None else (additive if additive.ndim == 3 else additive[None])
    ref_out, ref_w = reference(x3, heads=heads, allowed=a3, additive=m3, causal=causal,
                               scale=1 / np.sqrt(w["wq"].shape[1] // heads), **w)
    np.testing.assert_allclose(ref_out.reshape(out.shape), out, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ref_w.reshape(weights.shape), weights, rtol=1e-10, atol=1e-12)


def write_case(name, inputs, out, weights=None):
    d = os.path.join(DATA, "parity", name)
    for key, arr in inputs.items():
        save(os.path.join(d, key + ".npy"), arr)
    save(os.path.join(d, "expected_out.npy"), out.astype(np.float64))
    if weights is not None:
        save(os.path.join(d, "expected_weights.npy"), weights.astype(np.float64))


def projections(d_in, d_k, d_v, d_out, biases=True, dtype=np.float32):
    w = {"wq": randn(d_in, d_k, scale=d_in ** -0.5, dtype=dtype),
         "wk": randn(d_in, d_k, scale=d_in ** -0.5, dtype=dtype),
         "wv": randn(d_in, d_v, scale=d_in ** -0.5, dtype=dtype),
         "wo": randn(d_v, d_out, scale=d_v ** -0.5, dtype=dtype)}
    if biases:
        w.update(bq=randn(d_k, scale=0.1, dtype=dtype), bk=randn(d_k, scale=0.1, dtype=dtype),
                 bv=randn(d_v, scale=0.1, dtype=dtype), bo=randn(d_out, scale=0.1, dtype=dtype))
    return w


def random_allowed(shape, keep=0.6, full_rows=()):
    """A boolean 'may attend' mask; every row keeps at least its diagonal, except full_rows."""
    allowed = rng.random(shape) < keep
    n = shape[-1]
    allowed[..., np.arange(n), np.arange(n)] = True
    for r in full_rows:
        allowed[..., r, :] = False
    return allowed


def parity_cases():
    # Multi-head with all biases and the output projection.
    E, H = 8, 2
    w = projections(E, E, E, E)
    x = randn(5, E)
    out, weights = torch_mha(x, heads=H, **w)
    check_against_reference(out, weights, x, H, **w)
    write_case("mha", dict(x=x, **w), out, weights)

    # Causal, no biases, no output projection (torch's out_proj is the identity).
    E, H = 8, 2
    w = projections(E, E, E, E, biases=False)
    x = randn(6, E)
    causal = torch.triu(torch.ones(6, 6, dtype=torch.bool), diagonal=1)
    out, weights = torch_mha(x, w["wq"], w["wk"], w["wv"], np.eye(E), H, attn_mask=causal)
    del w["wo"]
    write_case("causal", dict(x=x, **w), out, weights)

    # Boolean mask, three heads.
    E, H = 6, 3
    w = projections(E, E, E, E)
    x = randn(7, E)
    allowed = random_allowed((7, 7))
    out, weights = torch_mha(x, heads=H, attn_mask=torch_bool_mask(allowed, H), **w)
    check_against_reference(out, weights, x, H, allowed=allowed, **w)
    write_case("bool_mask", dict(x=x, mask=allowed, **w), out, weights)

    # Float mask with some -inf, every input float64.
    E, H = 8, 4
    w = projections(E, E, E, E, dtype=np.float64)
    x = randn(6, E, dtype=np.float64)
    additive = rng.standard_normal((6, 6))
    additive[rng.random((6, 6)) < 0.3] = -np.inf
    additive[np.arange(6), np.arange(6)] = 0.5
    out, weights = torch_mha(x, heads=H, attn_mask=torch_float_mask(additive, H), **w)
    write_case("float_mask", dict(x=x, mask=additive, **w), out, weights)

    # Batch: 3-D x with a per-batch boolean mask, and --causal on top.
    B, N, E, H = 3, 5, 8, 2
    w = projections(E, E, E, E)
    x = randn(B, N, E)
    allowed = random_allowed((B, N, N))
    both = allowed & np.tril(np.ones((N, N), dtype=bool))
    out, weights = torch_mha(x, heads=H, attn_mask=torch_bool_mask(both, H), **w)
    check_against_reference(out, weights, x, H, allowed=allowed, causal=True, **w)
    write_case("batch", dict(x=x, mask=allowed, **w), out, weights)

    # Fully masked rows (torch: NaN; qkv: zero attention output, then + bo), boolean mask.
    E, H = 8, 2
    w = projections(E, E, E, E)
    x = randn(6, E)
    allowed = random_allowed((6, 6), full_rows=(0, 3))
    out, weights = torch_mha(x, heads=H, attn_mask=torch_bool_mask(allowed, H), **w)
    assert np.isnan(out[[0, 3]]).all()
    out, weights = follow_qkv_policy(out, weights, w["bo"])
    check_against_reference(out, weights, x, H, allowed=allowed, **w)
    write_case("masked_rows", dict(x=x, mask=allowed, **w), out, weights)

    # Fully masked rows through a batched float mask (a whole row of -inf).
    B, N, E, H = 2, 4, 8, 2
    w = projections(E, E, E, E)
    x = randn(B, N, E)
    additive = rng.standard_normal((B, N, N)).astype(np.float32)
    additive[1, 2, :] = -np.inf
    out, weights = torch_mha(x, heads=H, attn_mask=torch_float_mask(additive, H), **w)
    assert np.isnan(out[1, 2]).all()
    out, weights = follow_qkv_policy(out, weights, w["bo"])
    write_case("masked_rows_float", dict(x=x, mask=additive, **w), out, weights)

    # Long sequence: N = 1024, d = 64, four heads (no weights fixture: it would be 16 MiB).
    N, E, H = 1024, 64, 4
    w = projections(E, E, E, E)
    x = randn(N, E)
    out, _ = torch_mha(x, heads=H, **w)
    write_case("long", dict(x=x, **w), out)

    # d_k != d_v != d_in != d_out, --scale 0.3, bq absent, bo absent: our float64 reference.
    N, d_in, d_k, d_v, d_out, H = 5, 6, 4, 8, 5, 2
    w = projections(d_in, d_k, d_v, d_out)
    del w["bq"], w["bo"]
    x = randn(N, d_in)
    out, weights = reference(x[None], heads=H, scale=0.3, **w)
    write_case("dk_ne_dv", dict(x=x, **w), out[0], weights[0])


# ---- The tutorial, other encodings, and files qkv must refuse ------------------------------------
TUTORIAL_X = np.array([[1, 0, 1, 0], [0, 2, 0, 2], [1, 1, 1, 1]], dtype=np.float32)
TUTORIAL_WK = np.array([[0, 0, 1], [1, 1, 0], [0, 1, 0], [1, 1, 0]], dtype=np.float32)
TUTORIAL_WQ = np.array([[1, 0, 1], [1, 0, 0], [0, 0, 1], [0, 1, 1]], dtype=np.float32)
TUTORIAL_WV = np.array([[0, 2, 0], [0, 3, 0], [1, 0, 3], [1, 1, 0]], dtype=np.float32)


def tutorial_files():
    d = os.path.join(DATA, "tutorial")
    save(os.path.join(d, "x.npy"), TUTORIAL_X)
    save(os.path.join(d, "wq.npy"), TUTORIAL_WQ)
    save(os.path.join(d, "wk.npy"), TUTORIAL_WK)
    save(os.path.join(d, "wv.npy"), TUTORIAL_WV)
    out, weights = reference(TUTORIAL_X[None], TUTORIAL_WQ, TUTORIAL_WK, TUTORIAL_WV, heads=1, scale=1.0)
    save(os.path.join(d, "expected_plain.npy"), out[0])          # --scale 1: the tutorial's outputs
    save(os.path.join(d, "expected_plain_weights.npy"), weights[0])
    out, _ = reference(TUTORIAL_X[None], TUTORIAL_WQ, TUTORIAL_WK, TUTORIAL_WV, heads=1, scale=1 / np.sqrt(3))
    save(os.path.join(d, "expected_scaled.npy"), out[0])         # the default scale
    out, _ = reference(TUTORIAL_X[None], TUTORIAL_WQ, TUTORIAL_WK, TUTORIAL_WV, heads=1, scale=1.0, causal=True)
    save(os.path.join(d, "expected_plain_causal.npy"), out[0])

    f = os.path.join(DATA, "formats")
    save(os.path.join(f, "x_v2.npy"), TUTORIAL_X, version=(2, 0))
    save(os.path.join(f, "x_v3.npy"), TUTORIAL_X, version=(3, 0))
    save(os.path.join(f, "x_f8.npy"), TUTORIAL_X.astype("<f8"))
    save(os.path.join(f, "x_f8_big_endian.npy"), TUTORIAL_X.astype(">f8"))
    save(os.path.join(f, "x_f4_big_endian.npy"), TUTORIAL_X.astype(">f4"))

    b = os.path.join(DATA, "bad")
    save(os.path.join(b, "x_fortran.npy"), np.asfortranarray(TUTORIAL_X))
    save(os.path.join(b, "x_int32.npy"), TUTORIAL_X.astype("<i4"))
    save(os.path.join(b, "x_float16.npy"), TUTORIAL_X.astype("<f2"))
    save(os.path.join(b, "x_bool.npy"), TUTORIAL_X != 0)
    save(os.path.join(b, "x_1d.npy"), TUTORIAL_X[0])
    save(os.path.join(b, "x_4d.npy"), TUTORIAL_X[None, None])
    save(os.path.join(b, "x_empty.npy"), np.zeros((0, 4), dtype=np.float32))
    whole = io.BytesIO()
    np.save(whole, TUTORIAL_X)
    raw = whole.getvalue()
    with open(os.path.join(b, "x_truncated.npy"), "wb") as fh:
        fh.write(raw[:-5])                                        # data cut short
    with open(os.path.join(b, "x_bad_magic.npy"), "wb") as fh:
        fh.write(b"\x93NUMPX" + raw[6:])
    with open(os.path.join(b, "x_bad_header.npy"), "wb") as fh:  # header dict without 'shape'
        header = b"{'descr': '<f4', 'fortran_order': False, }"
        header += b" " * (64 - 10 - len(header) - 1) + b"\n"
        fh.write(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + raw[-48:])
    save(os.path.join(b, "wq_5x3.npy"), np.zeros((5, 3), dtype=np.float32))   # d_in is 4
    save(os.path.join(b, "wk_4x2.npy"), np.zeros((4, 2), dtype=np.float32))   # d_k is 3
    save(os.path.join(b, "wv_3x3.npy"), np.zeros((3, 3), dtype=np.float32))   # d_in is 4
    save(os.path.join(b, "wv_bool.npy"), TUTORIAL_WV != 0)
    save(os.path.join(b, "bq_2.npy"), np.zeros(2, dtype=np.float32))          # d_k is 3
    save(os.path.join(b, "bv_3x1.npy"), np.zeros((3, 1), dtype=np.float32))   # must be 1-D
    save(os.path.join(b, "wo_2x3.npy"), np.zeros((2, 3), dtype=np.float32))   # d_v is 3
    save(os.path.join(b, "wo_3x2.npy"), np.eye(3, 2, dtype=np.float32))       # fine: d_out = 2
    save(os.path.join(b, "bo_3.npy"), np.zeros(3, dtype=np.float32))          # d_out is 2
    save(os.path.join(b, "mask_3x4.npy"), np.ones((3, 4), dtype=bool))        # N is 3
    save(os.path.join(b, "mask_2x3x3.npy"), np.ones((2, 3, 3), dtype=bool))   # B is 1
    save(os.path.join(b, "mask_int8.npy"), np.ones((3, 3), dtype=np.int8))
    mask = io.BytesIO()
    np.save(mask, np.ones((3, 3), dtype=bool))
    with open(os.path.join(b, "mask_bad_bool.npy"), "wb") as fh:            # a bool byte of 2
        fh.write(mask.getvalue()[:-1] + b"\x02")


def float64_files():
    """float64 inputs the CPU backend must not narrow to float32 (and Vulkan must refuse)."""
    d = os.path.join(DATA, "float64")
    x = TUTORIAL_X[None].astype(np.float64)
    mask = np.zeros((3, 3))
    mask[0] = -1e300            # row 0: every key penalised alike, so uniform weights (-inf: a zero row)
    save(os.path.join(d, "mask_1e300.npy"), mask)
    out, weights = reference(x, TUTORIAL_WQ, TUTORIAL_WK, TUTORIAL_WV, heads=1, scale=1.0, additive=mask[None])
    save(os.path.join(d, "expected_mask_1e300.npy"), out[0])
    save(os.path.join(d, "expected_mask_1e300_weights.npy"), weights[0])
    big = x * 1e200             # beyond float32, cancelled by the weights: Q, K, V as the tutorial's
    small = [w.astype(np.float64) * 1e-200 for w in (TUTORIAL_WQ, TUTORIAL_WK, TUTORIAL_WV)]
    save(os.path.join(d, "x_1e200.npy"), big[0])
    for name, w in zip(("wq", "wk", "wv"), small):
        save(os.path.join(d, name + "_1e-200.npy"), w)
    out, _ = reference(big, *small, heads=1, scale=1.0)
    save(os.path.join(d, "expected_1e200.npy"), out[0])


def main():
    shutil.rmtree(DATA, ignore_errors=True)
    torch.manual_seed(0)
    parity_cases()
    tutorial_files()
    float64_files()


if __name__ == "__main__":
    main()
