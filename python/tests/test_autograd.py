"""Gradients through qkv's attention (qkv/_autograd.py): torch.autograd.gradcheck in float64 through
device="cpu" (the float64 reference), float32 gradients on Vulkan against float64 autograd of a
reference written from PyTorch's and FlashAttention's documented semantics (never from qkv's code)
over odd shapes, GQA and both causal alignments, the FlashAttention forms (plain and packed, their
layout), dropout drawn from torch's default generator (torch.manual_seed reproduces it;
return_attn_probs gives the mask back as negative probabilities, and the gradients follow it), and
identical gradients over runs. Small shapes: each new one is a pipeline lavapipe compiles."""

import pytest
import torch

import qkv
from qkv.flash_attn import flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func

from conftest import flash_rule, needs_vulkan


def reference(q, k, v, *, causal=False, bottom_right=False, scale=None, keep=None, p=0.0):
    """Scaled dot-product attention in float64 torch, differentiable: (..., Hq, L, E) q, (..., Hkv, S, E)
    k and v (K/V heads repeated for GQA), the causal rule j <= i (+ S - L bottom-right), softmax over
    the allowed keys (a row without any: zeros), dropout as a given keep mask (kept weights / (1 - p))."""
    hq, hkv = q.shape[-3], k.shape[-3]
    k, v = (x.repeat_interleave(hq // hkv, dim=-3) for x in (k, v))
    L, S = q.shape[-2], k.shape[-2]
    s = q @ k.transpose(-1, -2) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if causal:
        off = S - L if bottom_right else 0
        allowed = torch.arange(S)[None, :] <= torch.arange(L)[:, None] + off
        s = s.masked_fill(~allowed, float("-inf"))
    w = torch.softmax(s, dim=-1)
    w = torch.where(torch.isnan(w), torch.zeros_like(w), w)  # a row with no key
    if keep is not None:
        w = w * keep / (1 - p)
    return w @ v


def leaves(*xs, dtype=torch.float32):
    return [x.detach().to(dtype).requires_grad_(True) for x in xs]


def grads_of(fn, xs, d_out):
    out = fn(*xs)
    out.backward(d_out)
    return out.detach(), [x.grad.detach().clone() for x in xs]


def nmse(got, want):
    got, want = got.to(torch.float64), want.to(torch.float64)
    assert torch.isfinite(got).all()
    return float(((got - want) ** 2).sum() / max(float((want ** 2).sum()), 1e-300))


def make(shape_q, shape_k, shape_v, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g, dtype=torch.float64) for s in (shape_q, shape_k, shape_v)]


def test_gradcheck_float64_through_the_cpu_reference():
    q, k, v = leaves(*make((1, 2, 3, 4), (1, 1, 5, 4), (1, 1, 5, 3), seed=1), dtype=torch.float64)
    for causal in (False, True):
        assert torch.autograd.gradcheck(
            lambda a, b, c: qkv.scaled_dot_product_attention(a, b, c, is_causal=causal, enable_gqa=True, device="cpu"),
            (q, k, v))
    # FlashAttention's layout and bottom-right causal, through the permuted views.
    fq, fk, fv = leaves(*make((1, 3, 2, 4), (1, 5, 1, 4), (1, 5, 1, 4), seed=2), dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda a, b, c: flash_attn_func(a, b, c, causal=True, device="cpu"), (fq, fk, fv))


@needs_vulkan
@pytest.mark.parametrize("L,S,causal", [(1, 17, False), (3, 17, True), (17, 3, True), (113, 113, True)], ids=str)
def test_float32_gradients_on_vulkan(L, S, causal):
    q, k, v = make((2, 4, L, 16), (2, 2, S, 16), (2, 2, S, 8), seed=L * 100 + S)
    d_out = torch.randn(2, 4, L, 8, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    out, got = grads_of(lambda a, b, c: qkv.scaled_dot_product_attention(a, b, c, is_causal=causal, enable_gqa=True),
                        leaves(q, k, v), d_out.float())
    want_out, want = grads_of(lambda a, b, c: reference(a, b, c, causal=causal), leaves(q, k, v, dtype=torch.float64),
                              d_out)
    assert nmse(out, want_out) <= 1e-9
    for g, w in zip(got, want):
        assert g.dtype == torch.float32 and g.shape == w.shape
        assert nmse(g, w) <= 1e-9
    # The same inputs give the same bits.
    _, again = grads_of(lambda a, b, c: qkv.scaled_dot_product_attention(a, b, c, is_causal=causal, enable_gqa=True),
                        leaves(q, k, v), d_out.float())
    assert all(torch.equal(a, b) for a, b in zip(got, again))


@needs_vulkan
def test_flash_attn_forms_train():
    # (batch, seqlen, nheads, headdim), causal bottom-right (seqlen_q < seqlen_k), GQA 4:2.
    q, k, v = make((2, 5, 4, 16), (2, 9, 2, 16), (2, 9, 2, 16), seed=7)
    d_out = torch.randn(2, 5, 4, 16, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    swap = lambda x: x.transpose(1, 2)  # noqa: E731
    _, want = grads_of(lambda a, b, c: swap(reference(swap(a), swap(b), swap(c), causal=True, bottom_right=True)),
                       leaves(q, k, v, dtype=torch.float64), d_out)
    _, got = grads_of(lambda a, b, c: flash_attn_func(a, b, c, causal=True), leaves(q, k, v), d_out.float())
    for g, w in zip(got, want):
        assert nmse(g, w) <= 1e-9
    # kvpacked: the gradient of the packed tensor is dk and dv side by side.
    kv = torch.stack([k, v], dim=2).float().requires_grad_(True)
    qq = q.float().requires_grad_(True)
    flash_attn_kvpacked_func(qq, kv, causal=True).backward(d_out.float())
    assert nmse(qq.grad, want[0]) <= 1e-9
    assert nmse(kv.grad[:, :, 0], want[1]) <= 1e-9 and nmse(kv.grad[:, :, 1], want[2]) <= 1e-9
    # qkvpacked (self-attention, equal heads): one tensor, its three gradients.
    packed = torch.randn(1, 6, 3, 2, 8, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    d6 = torch.randn(1, 6, 2, 8, generator=torch.Generator().manual_seed(10), dtype=torch.float64)
    pk = packed.float().requires_grad_(True)
    flash_attn_qkvpacked_func(pk, causal=True).backward(d6.float())
    parts = leaves(*(packed[:, :, i] for i in range(3)), dtype=torch.float64)
    reference(*(swap(x) for x in parts), causal=True).transpose(1, 2).backward(d6)
    for i in range(3):
        assert nmse(pk.grad[:, :, i], parts[i].grad) <= 1e-9


@needs_vulkan
def test_dropout_from_torchs_generator():
    q, k, v = make((1, 2, 9, 16), (1, 2, 13, 16), (1, 2, 13, 16), seed=11)
    qf, kf, vf = (x.float().transpose(1, 2).contiguous() for x in (q, k, v))  # FlashAttention's layout
    torch.manual_seed(5)
    out1, _, probs = flash_attn_func(qf, kf, vf, dropout_p=0.3, return_attn_probs=True)
    torch.manual_seed(5)
    out2 = flash_attn_func(qf, kf, vf, dropout_p=0.3)
    assert torch.equal(out1, out2)  # manual_seed reproduces the mask
    out3 = flash_attn_func(qf, kf, vf, dropout_p=0.3)  # the generator moved on: another mask
    assert not torch.equal(out1, out3)
    # The mask back from the negative probabilities; the output and the gradients follow it.
    keep = (~torch.signbit(probs)).to(torch.float64)
    dropped = 1 - float(keep.mean())
    assert 0.15 < dropped < 0.45
    d_out = torch.randn(1, 9, 2, 16, generator=torch.Generator().manual_seed(12), dtype=torch.float64)
    swap = lambda x: x.transpose(1, 2)  # noqa: E731
    want_out, want = grads_of(lambda a, b, c: swap(reference(a, b, c, keep=keep, p=0.3)),
                              leaves(q, k, v, dtype=torch.float64), d_out)
    torch.manual_seed(5)
    got_out, got = grads_of(lambda a, b, c: flash_attn_func(a, b, c, dropout_p=0.3),
                            leaves(*(swap(x) for x in (q, k, v))), d_out.float())
    assert nmse(got_out, want_out) <= 1e-9
    for g, w in zip(got, want):
        assert nmse(swap(g), w) <= 1e-9


@needs_vulkan
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_half_gradients_by_flash_attentions_rule(dtype):
    # FlashAttention's rule for gradients: qkv's error against the float64 reference at most twice
    # that of the same computation in the inputs' dtype (torch autograd of the reference in bfloat16;
    # torch 1.13 has no float16 matmul on the CPU, so float16 is held to the bfloat16 reference's
    # error, which is larger).
    q, k, v = make((1, 2, 17, 32), (1, 2, 23, 32), (1, 2, 23, 32), seed=21)
    d_out = torch.randn(1, 2, 17, 32, generator=torch.Generator().manual_seed(22), dtype=torch.float64)
    rounded = [x.to(dtype).to(torch.float64) for x in (q, k, v)]
    d_rounded = d_out.to(dtype)
    _, want = grads_of(lambda a, b, c: reference(a, b, c, causal=True), leaves(*rounded, dtype=torch.float64),
                       d_rounded.to(torch.float64))
    _, same = grads_of(lambda a, b, c: reference(a, b, c, causal=True), leaves(*rounded, dtype=torch.bfloat16),
                       d_rounded.to(torch.bfloat16))
    _, got = grads_of(lambda a, b, c: qkv.scaled_dot_product_attention(a, b, c, is_causal=True),
                      leaves(*rounded, dtype=dtype), d_rounded)
    for g, w, t, name in zip(got, want, same, ("dq", "dk", "dv")):
        assert g.dtype == dtype
        flash_rule(g, w, t, what=name)


def reference_with_extras(q, k, v, mask, sinks, *, causal=False):
    """The reference above with an additive mask (added to the scaled scores, broadcast as PyTorch
    broadcasts attn_mask) and gpt-oss's sinks: one more logit σ_h per query head that joins each row's
    softmax denominator and is then dropped (its weight multiplies no value)."""
    hq, hkv = q.shape[-3], k.shape[-3]
    k, v = (x.repeat_interleave(hq // hkv, dim=-3) for x in (k, v))
    L, S = q.shape[-2], k.shape[-2]
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5 + mask
    if causal:
        s = s.masked_fill(torch.arange(S)[None, :] > torch.arange(L)[:, None], float("-inf"))
    sink = sinks.reshape(hq, 1, 1).expand(*s.shape[:-1], 1)
    w = torch.softmax(torch.cat([s, sink], dim=-1), dim=-1)[..., :S]
    return w @ v


def test_gradcheck_sinks_and_mask_float64_through_the_cpu_reference():
    # GQA 4:2, causal, a mask broadcast over the batch (1, Hq, L, S) with a -inf entry, sinks per head.
    q, k, v = leaves(*make((2, 4, 3, 4), (2, 2, 5, 4), (2, 2, 5, 3), seed=31), dtype=torch.float64)
    g = torch.Generator().manual_seed(32)
    mask = torch.randn(1, 4, 3, 5, generator=g, dtype=torch.float64)
    mask[0, 1, 2, 0] = float("-inf")
    mask.requires_grad_(True)
    sinks = torch.randn(4, generator=g, dtype=torch.float64).requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda a, b, c, m, s: qkv.scaled_dot_product_attention(a, b, c, m, is_causal=True, enable_gqa=True, sinks=s,
                                                               device="cpu"), (q, k, v, mask, sinks))
    # Two batch dimensions, the mask keeping the first and broadcast along the second and the heads.
    q, k, v = leaves(*make((2, 3, 2, 3, 4), (2, 3, 2, 4, 4), (2, 3, 2, 4, 4), seed=33), dtype=torch.float64)
    mask = torch.randn(2, 1, 1, 3, 4, generator=g, dtype=torch.float64).requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda a, b, c, m: qkv.scaled_dot_product_attention(a, b, c, m, device="cpu"), (q, k, v, mask))
    # Only the sinks require grad (query, key and value do not): still differentiated.
    x = torch.randn(1, 2, 3, 4, dtype=torch.float64)
    s2 = torch.randn(2, dtype=torch.float64).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda s: qkv.scaled_dot_product_attention(x, x, x, sinks=s, device="cpu"), (s2,))


@needs_vulkan
@pytest.mark.parametrize("L,S", [(3, 17), (17, 17)], ids=str)
def test_float32_sinks_and_mask_gradients_on_vulkan(L, S):
    q, k, v = make((2, 4, L, 16), (2, 2, S, 16), (2, 2, S, 8), seed=40 + L)
    g = torch.Generator().manual_seed(41)
    mask = torch.randn(4, L, S, generator=g, dtype=torch.float64)  # broadcast over the batch
    sinks = torch.randn(4, generator=g, dtype=torch.float64)
    d_out = torch.randn(2, 4, L, 8, generator=g, dtype=torch.float64)
    _, got = grads_of(lambda a, b, c, m, s: qkv.scaled_dot_product_attention(a, b, c, m, is_causal=True,
                                                                             enable_gqa=True, sinks=s),
                      leaves(q, k, v, mask, sinks), d_out.float())
    _, want = grads_of(lambda a, b, c, m, s: reference_with_extras(a, b, c, m, s, causal=True),
                       leaves(q, k, v, mask, sinks, dtype=torch.float64), d_out)
    for got_g, want_g, name in zip(got, want, ("dq", "dk", "dv", "d_mask", "d_sinks")):
        assert got_g.dtype == torch.float32 and got_g.shape == want_g.shape, name
        assert nmse(got_g, want_g) <= 1e-9, name
    # Masked keys (causal) get no gradient.
    assert torch.equal(torch.triu(got[3], diagonal=1), torch.zeros_like(got[3]))
