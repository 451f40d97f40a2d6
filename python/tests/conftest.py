"""Shared by the qkv Python tests: float64 references written from the documented semantics
(PyTorch's scaled_dot_product_attention and FlashAttention 2's flash_attn_func, with qkv's
documented options beyond them), never from qkv's own code; the error measures; and a check that
the Vulkan validation layer stayed silent (CTest sets QKV_VALIDATION=1, so every Context the tests
make runs with the Khronos validation layer and synchronisation validation)."""

import math
import os

import numpy as np
import pytest
import torch

import qkv

SOURCE_DIR = os.environ.get("QKV_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))


def have_vulkan():
    return bool(qkv.devices())


needs_vulkan = pytest.mark.skipif(not have_vulkan(), reason="no Vulkan device")


@pytest.fixture(autouse=True)
def validation_is_silent():
    """Fails a test after which a Context made with validation has messages."""
    yield
    from qkv import _devices

    for ctx in list(_devices._contexts.values()):
        messages = ctx.take_validation_messages()
        assert messages == [], "\n".join(messages)


@pytest.fixture
def rng():
    return np.random.default_rng(20261201)


# ---- references ---------------------------------------------------------------------------------


def f64(x):
    if isinstance(x, torch.Tensor):
        return x.detach().to(torch.float64).numpy()
    return np.asarray(x, dtype=np.float64)


def sdpa_reference(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False, *, window=None,
                   softcap=0.0, alibi_slopes=None, sinks=None, alignment="top_left", return_lse=False):
    """PyTorch's documented scaled_dot_product_attention in float64 NumPy (its reference code: the
    scaled scores, a bool mask that removes keys or a float mask that is added, tril(ones(L, S)) for
    is_causal, softmax over the keys, times V; enable_gqa repeats K and V along dimension -3), with
    qkv's documented options: softcap C * tanh(s / C) first, then ALiBi - slope_h * |i + off - j|,
    the window i + off - left <= j <= i + off + right, the causal diagonal at off (0, or S - L for
    bottom_right), sinks joining each row's denominator, and a row with no key: zeros, lse -inf."""
    q, k, v = f64(q), f64(k), f64(v)
    L, S, E = q.shape[-2], k.shape[-2], q.shape[-1]
    if q.ndim >= 3 and k.shape[-3] != q.shape[-3]:
        assert enable_gqa
        g = q.shape[-3] // k.shape[-3]
        k = np.repeat(k, g, axis=-3)
        v = np.repeat(v, g, axis=-3)
    scale = 1.0 / math.sqrt(E) if scale is None else scale
    s = np.matmul(q, np.swapaxes(k, -1, -2)) * scale
    if softcap:
        s = softcap * np.tanh(s / softcap)
    off = S - L if alignment == "bottom_right" else 0
    i = np.arange(L)[:, None] + off
    j = np.arange(S)[None, :]
    if alibi_slopes is not None:
        slopes = f64(alibi_slopes)
        s = s - slopes.reshape(slopes.shape + (1, 1)) * np.abs(i - j)
    allowed = np.ones(s.shape, dtype=bool)
    if attn_mask is not None:
        m = attn_mask.numpy() if isinstance(attn_mask, torch.Tensor) and attn_mask.dtype == torch.bool else attn_mask
        if np.asarray(m).dtype == bool:
            allowed = allowed & np.broadcast_to(np.asarray(m), s.shape)
        else:
            s = s + np.broadcast_to(f64(m), s.shape)
    if is_causal:
        allowed = allowed & (j <= i)
    if window is not None:
        left, right = window
        if left >= 0:
            allowed = allowed & (j >= i - left)
        if right >= 0:
            allowed = allowed & (j <= i + right)
    allowed = allowed & (s != -np.inf)
    s = np.where(allowed, s, -np.inf)
    any_key = allowed.any(axis=-1, keepdims=True)
    m = np.where(any_key, s.max(axis=-1, keepdims=True, initial=-np.inf), 0.0)
    e = np.where(allowed, np.exp(s - m), 0.0)
    denominator = e.sum(axis=-1, keepdims=True)
    lse = np.where(any_key, m + np.log(np.where(any_key, denominator, 1.0)), -np.inf)[..., 0]
    if sinks is not None:
        sink = f64(sinks).reshape(-1, 1, 1)
        big = np.maximum(m, sink)
        e = np.where(allowed, np.exp(s - big), 0.0)
        denominator = e.sum(axis=-1, keepdims=True) + np.exp(sink - big)
    weights = np.where(any_key, e / np.where(denominator > 0, denominator, 1.0), 0.0)
    out = np.matmul(weights, v)
    return (out, lse, weights) if return_lse else out


def fa_reference(q, k, v, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, softmax_scale=None,
                 dtype=torch.float64):
    """FlashAttention 2's documented flash_attn_func, as explicit torch ops in `dtype`, each op's
    result rounded to `dtype` (so float16 and bfloat16 behave as a same-dtype reference on a GPU,
    whose products accumulate in float32 and are rounded once; torch 1.13's CPU has no float16
    matmul). q (b, sq, h, d), k and v (b, sk, hk, d): keys repeat over the query heads they serve;
    causal and the window are aligned to the bottom-right corner (query i sits at key
    i + sk - sq); ALiBi adds -slope * |i + sk - sq - j|; softcap caps the scaled score.
    Returns out (b, sq, h, dv) and lse (b, h, sq) (+inf for a row with no key, as FlashAttention)."""

    def r(x):  # one op's result in dtype
        return x.to(dtype) if dtype != torch.float64 else x

    def up(x):
        return x.to(torch.float32) if dtype != torch.float64 else x.to(torch.float64)

    q, k, v = (torch.as_tensor(x).to(dtype) for x in (q, k, v))
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    k = k.repeat_interleave(h // hk, dim=2)
    v = v.repeat_interleave(h // hk, dim=2)
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else softmax_scale
    scores = r(torch.einsum("bthd,bshd->bhts", up(r(up(q) * scale)), up(k)))
    if softcap > 0:
        scores = r(torch.tanh(up(scores) / softcap) * softcap)
    i = torch.arange(sq).view(sq, 1) + (sk - sq)
    j = torch.arange(sk).view(1, sk)
    if alibi_slopes is not None:
        slopes = torch.as_tensor(alibi_slopes, dtype=torch.float64)
        slopes = slopes.view(1, h, 1, 1) if slopes.dim() == 1 else slopes.view(b, h, 1, 1)
        scores = r(up(scores) - (slopes * (i - j).abs()).to(up(scores).dtype))
    keep = torch.ones(sq, sk, dtype=torch.bool)
    left, right = window_size
    if causal:
        right = 0 if right < 0 else min(right, 0)
    if left >= 0:
        keep &= j >= i - left
    if right >= 0:
        keep &= j <= i + right
    scores = scores.masked_fill(~keep, float("-inf"))
    any_key = keep.any(dim=-1).view(1, 1, sq, 1)
    probs = r(torch.softmax(up(scores), dim=-1))
    probs = probs.masked_fill(~any_key, 0.0)
    out = r(torch.einsum("bhts,bshd->bthd", up(probs), up(v)))
    lse = torch.logsumexp(up(scores).to(torch.float64), dim=-1)
    lse = lse.masked_fill(~any_key[..., 0], float("inf"))
    return out, lse


def max_error(got, want):
    got, want = f64(got), f64(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    finite = np.isfinite(want)
    assert np.array_equal(np.isfinite(got), finite), "non-finite values where the reference has finite ones"
    assert np.array_equal(got[~finite], want[~finite]), "the reference's infinities differ"
    return float(np.abs(got[finite] - want[finite]).max(initial=0.0))


def nmse(got, want):
    got, want = f64(got), f64(want)
    assert np.isfinite(got).all() and np.isfinite(want).all()
    return float(((got - want) ** 2).sum() / max((want ** 2).sum(), 1e-300))


def flash_rule(got, want64, same_dtype, what="output"):
    """FlashAttention's tolerance rule: the error of qkv's result against the float64 reference is
    at most twice the error of a reference computed in the inputs' dtype."""
    mine = max_error(got, want64)
    theirs = max_error(same_dtype, want64)
    assert mine <= 2 * theirs + 1e-7, f"{what}: qkv's error {mine} > 2 x the same-dtype reference's {theirs}"
    return mine, theirs
