#!/usr/bin/python3
"""A float64 reference of qkv's scaled dot-product attention, forward and backward, in PyTorch: the
forward written from the semantics qkv documents (README, "scaled_dot_product_attention"; PyTorch's
F.scaled_dot_product_attention and FlashAttention's window_size, softcap and ALiBi), the gradients
from torch.autograd, never from qkv's formulas. Used by tests/compile/gen_sdpa_backward_reference.py
(the constexpr core's proofs) and tests/data/sdpa/make_backward_fixtures.py (the CPU reference's
fixtures); run with /usr/bin/python3 (numpy, torch).

Semantics, for query i and key j of query head h (B, Hq, L, E / B, Hkv, S, E / B, Hkv, S, Ev):
  K/V head h // (Hq // Hkv) (repeat_interleave); off = position_offset, else S - L (bottom_right)
  or 0 (top_left); pos = i + off
  s = scale * q.k (scale 1/sqrt(E) unless given); s = C tanh(s / C) (softcap C > 0);
  s -= slope_h |pos - j| (ALiBi: ggml's slopes of alibi_max_bias, or slopes given);
  s += additive mask (broadcast; -inf masks)
  allowed: bool mask and causal (j <= pos) and window (pos - left <= j <= pos + right, -1
  unbounded) and s != -inf
  P = softmax over the allowed keys with the head's sink sigma_h in the denominator
  dropout: z = the keep mask of qkv/dropout.hpp (Philox4x32-10, below), out = (P z / (1 - p)) @ v
  lse = log sum_j e^(s_j) over the allowed keys (no sink); a row with no key: P = 0, out = 0,
  lse = -inf (qkv's policy; PyTorch gives NaN)
  weights returned: P, a dropped one negated (FlashAttention's return_attn_probs encoding)
Gradients: of loss = sum(out * d_out) with respect to q, k, v, the sinks (summed over batch and
rows), the additive mask (summed over its broadcast dimensions) and every logit s (d_scores).
"""
import math

import numpy as np
import torch

MASK32 = 0xFFFFFFFF
# Philox4x32's constants (Random123: PHILOX_M4x32_0/1, PHILOX_W32_0/1).
PHILOX_M0, PHILOX_M1, PHILOX_W0, PHILOX_W1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85

# Random123's kat_vectors (philox4x32, 7 and 10 rounds): counter, key, expected output.
KAT = [
    (7, [0, 0, 0, 0], [0, 0], [0x5f6fb709, 0x0d893f64, 0x4f121f81, 0x4f730a48]),
    (7, [MASK32] * 4, [MASK32] * 2, [0x5207ddc2, 0x45165e59, 0x4d8ee751, 0x8c52f662]),
    (7, [0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344], [0xa4093822, 0x299f31d0],
     [0x4dfccaba, 0x190a87f0, 0xc47362ba, 0xb6b5242a]),
    (10, [0, 0, 0, 0], [0, 0], [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]),
    (10, [MASK32] * 4, [MASK32] * 2, [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]),
    (10, [0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344], [0xa4093822, 0x299f31d0],
     [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]),
]


def philox4x32(counter, key, rounds=10):
    """Philox4x32 on numpy uint64 arrays holding 32-bit words: counter a (4, n) array, key (2,)."""
    c = [np.asarray(w, dtype=np.uint64) & MASK32 for w in counter]
    k0, k1 = int(key[0]) & MASK32, int(key[1]) & MASK32
    for r in range(rounds):
        if r:
            k0, k1 = (k0 + PHILOX_W0) & MASK32, (k1 + PHILOX_W1) & MASK32
        p0 = np.uint64(PHILOX_M0) * c[0]  # < 2^64: no overflow
        p1 = np.uint64(PHILOX_M1) * c[2]
        c = [((p1 >> np.uint64(32)) ^ c[1] ^ np.uint64(k0)) & np.uint64(MASK32), p1 & np.uint64(MASK32),
             ((p0 >> np.uint64(32)) ^ c[3] ^ np.uint64(k1)) & np.uint64(MASK32), p0 & np.uint64(MASK32)]
    return c


for rounds, ctr, key, want in KAT:
    got = [int(w[0]) for w in philox4x32([[w] for w in ctr], key, rounds)]
    assert got == want, (rounds, ctr, key, got, want)


def keep_mask(B, Hq, L, S, p, seed, offset):
    """qkv/dropout.hpp's mask: (B, Hq, L, S) bool, True = kept. Row r = (b Hq + h) L + i; counter
    (lo c, hi c, lo r, hi r) with c = offset + j // 4 (mod 2^64); key (lo seed, hi seed); the draw
    is word j % 4; kept when draw >= ceil(p 2^32)."""
    threshold = math.ceil(p * 2.0 ** 32)
    rows = np.arange(B * Hq * L, dtype=np.uint64)[:, None]
    j = np.arange(S, dtype=np.uint64)[None, :]
    c = (np.uint64(offset) + j // np.uint64(4)) & np.uint64(2 ** 64 - 1)  # numpy wraps uint64
    rows, c = np.broadcast_arrays(rows, c)
    words = philox4x32([c & np.uint64(MASK32), c >> np.uint64(32), rows & np.uint64(MASK32), rows >> np.uint64(32)],
                       [seed & MASK32, seed >> 32])
    draw = np.choose((j % np.uint64(4)).astype(np.int64) + np.zeros_like(rows, dtype=np.int64), words)
    return (draw >= threshold).reshape(B, Hq, L, S)


def alibi_slope(max_bias, h, heads):
    """ggml's ALiBi slope of query head h of `heads`."""
    n = 2 ** int(math.floor(math.log2(heads)))
    m0, m1 = 2.0 ** (-max_bias / n), 2.0 ** (-max_bias / (2 * n))
    return m0 ** (h + 1) if h < n else m1 ** (2 * (h - n) + 1)


def attention(q, k, v, *, additive=None, sinks=None, scale=None, causal=False, alignment="top_left",
              position_offset=None, window=(-1, -1), softcap=0.0, alibi_max_bias=0.0, alibi_slopes=None,
              mask=None, dropout_p=0.0, seed=0, offset=0):
    """The forward pass on torch tensors of one floating type (float64 for the reference) (B, Hq, L, E) etc., differentiable in q, k, v, the
    additive mask and the sinks. Returns (out, weights FA-encoded, lse, d_scores_leaf): add
    d_scores_leaf's grad to get each logit's gradient."""
    B, Hq, L, E = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    group = Hq // Hkv
    dtype = q.dtype
    kk = k.repeat_interleave(group, dim=1)
    vv = v.repeat_interleave(group, dim=1)
    scale = 1.0 / math.sqrt(E) if scale is None else float(scale)
    s = (q @ kk.transpose(-1, -2)) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    off = position_offset if position_offset is not None else (S - L if alignment == "bottom_right" else 0)
    pos = torch.arange(L, dtype=dtype)[:, None] + off
    jj = torch.arange(S, dtype=dtype)[None, :]
    if alibi_max_bias or alibi_slopes is not None:
        slopes = alibi_slopes if alibi_slopes is not None else [alibi_slope(alibi_max_bias, h, Hq) for h in range(Hq)]
        s = s - torch.tensor(slopes, dtype=dtype)[None, :, None, None] * (pos - jj).abs()
    if additive is not None:
        s = s + additive
    d_scores_leaf = torch.zeros(B, Hq, L, S, dtype=dtype, requires_grad=True)
    s = s + d_scores_leaf
    with torch.no_grad():
        allowed = torch.ones(B, Hq, L, S, dtype=torch.bool)
        if causal:
            allowed &= jj <= pos
        left, right = window
        if left >= 0:
            allowed &= jj >= pos - left
        if right >= 0:
            allowed &= jj <= pos + right
        if mask is not None:
            allowed &= torch.as_tensor(mask, dtype=torch.bool)
        allowed &= s != -math.inf
        any_key = allowed.any(-1, keepdim=True)
    s_m = s.masked_fill(~allowed, -math.inf)
    s_m = torch.where(any_key, s_m, torch.zeros_like(s_m))  # a row with no key: no NaN, zeroed below
    if sinks is not None:
        sigma = sinks[None, :, None, None].expand(B, Hq, L, 1)
        p = torch.softmax(torch.cat([s_m, sigma], -1), -1)[..., :S]
    else:
        p = torch.softmax(s_m, -1)
    p = p * any_key
    with torch.no_grad():
        lse = torch.where(any_key[..., 0], torch.logsumexp(s_m, -1), torch.full((B, Hq, L), -math.inf, dtype=dtype))
    if dropout_p:
        z = torch.as_tensor(keep_mask(B, Hq, L, S, dropout_p, seed, offset))
        out = (p * z / (1.0 - dropout_p)) @ vv
        with torch.no_grad():
            weights = torch.where(allowed & ~z, -p, p)
    else:
        out = p @ vv
        weights = p.detach()
    return out, weights, lse, d_scores_leaf


def gradients(q, k, v, d_out, *, additive=None, sinks=None, dtype=np.float64, **options):
    """numpy in (4-D), numpy out: a dict of out, weights, lse, dq, dk, dv, d_scores (B, Hq, L, S),
    d_sinks (Hq,), d_additive (the additive mask's shape), computed in `dtype` (float64: the
    reference; float32: how far a float32 evaluation lands)."""
    leaf = lambda a: torch.tensor(np.asarray(a, dtype=dtype), requires_grad=True)
    tq, tk, tv = leaf(q), leaf(k), leaf(v)
    ta = leaf(additive) if additive is not None else None
    ts = leaf(sinks) if sinks is not None else None
    out, weights, lse, ds = attention(tq, tk, tv, additive=ta, sinks=ts, **options)
    (out * torch.as_tensor(np.asarray(d_out, dtype=dtype))).sum().backward()
    r = dict(out=out.detach().numpy(), weights=weights.numpy(), lse=lse.numpy(), dq=tq.grad.numpy(),
             dk=tk.grad.numpy(), dv=tv.grad.numpy(), d_scores=ds.grad.numpy())
    if ts is not None:
        r["d_sinks"] = ts.grad.numpy()
    if ta is not None:
        r["d_additive"] = ta.grad.numpy()
    for name, a in r.items():
        if name not in ("lse", "weights"):
            assert np.isfinite(a).all(), name
    return r
