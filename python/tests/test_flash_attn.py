"""qkv.flash_attn against FlashAttention 2's documented semantics, by FlashAttention's own tolerance
rule: the error of qkv's result against a float64 reference is at most twice the error of a
reference computed in the inputs' dtype (fa_reference in conftest.py). On Vulkan (lavapipe in CI),
over odd shapes, GQA and MQA, both causal alignments (seqlen_q < and > seqlen_k), windows, ALiBi
of shape (nheads,) and (batch, nheads), softcap, the packed forms, and every return value."""

import numpy as np
import pytest
import torch

import qkv
from qkv.flash_attn import (flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func,
                            flash_attn_varlen_func, flash_attn_varlen_kvpacked_func,
                            flash_attn_varlen_qkvpacked_func, flash_attn_with_kvcache)

from conftest import fa_reference, flash_rule, max_error, needs_vulkan

pytestmark = needs_vulkan

DTYPES = [torch.float16, torch.bfloat16, torch.float32]


def make(b, sq, sk, h, hk, d, dtype, seed, dv=None):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, sq, h, d, generator=g).to(dtype)
    k = torch.randn(b, sk, hk, d, generator=g).to(dtype)
    v = torch.randn(b, sk, hk, dv or d, generator=g).to(dtype)
    return q, k, v


def check(out, q, k, v, **kw):
    want, _ = fa_reference(q, k, v, **kw)
    same, _ = fa_reference(q, k, v, dtype=q.dtype, **kw)
    assert out.dtype == q.dtype and out.shape == want.shape and out.is_contiguous()
    flash_rule(out, want, same)


# Every odd shape with and without causal, the dtypes taken in turn: each new shape or flag is a
# pipeline lavapipe compiles (seconds on a fresh machine), so not the whole product.
SHAPES = [(sq, sk, causal, DTYPES[(i + causal) % 3])
          for i, (sq, sk) in enumerate([(1, 113), (3, 17), (17, 3), (113, 113), (17, 1)]) for causal in (False, True)]


@pytest.mark.parametrize("sq,sk,causal,dtype", SHAPES, ids=str)
def test_odd_shapes_gqa_and_causal(sq, sk, causal, dtype):
    # GQA 4:2; causal bottom-right when sq != sk (sq > sk leaves rows without keys: zeros)
    q, k, v = make(2, sq, sk, 4, 2, 32, dtype, seed=sq * 1000 + sk + causal)
    check(flash_attn_func(q, k, v, causal=causal), q, k, v, causal=causal)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)  # FlashAttention's dtypes
def test_window_softcap_alibi_scale(dtype):
    q, k, v = make(1, 17, 113, 6, 1, 32, dtype, seed=5)  # MQA
    slopes = torch.tensor(qkv.alibi_slopes(6), dtype=torch.float32)
    for kw in ({"window_size": (8, 0), "causal": True}, {"window_size": (5, 3)}, {"window_size": (-1, 4)},
               {"softcap": 2.0, "softmax_scale": 0.7}, {"alibi_slopes": slopes, "causal": True},
               {"alibi_slopes": slopes, "window_size": (20, 20), "softcap": 5.0}):
        check(flash_attn_func(q, k, v, **kw), q, k, v, **kw)


def test_alibi_per_batch_and_head():
    # (batch, nheads) slopes that differ between batch elements
    q, k, v = make(3, 5, 40, 4, 2, 32, torch.bfloat16, seed=6)
    slopes = torch.rand(3, 4, generator=torch.Generator().manual_seed(1))
    check(flash_attn_func(q, k, v, alibi_slopes=slopes, causal=True), q, k, v, alibi_slopes=slopes, causal=True)
    same = slopes[:1].expand(3, 4)  # equal rows: one call
    check(flash_attn_func(q, k, v, alibi_slopes=same), q, k, v, alibi_slopes=same)


def test_head_widths_differ():
    q, k, v = make(1, 17, 33, 2, 2, 80, torch.float16, seed=7, dv=48)
    check(flash_attn_func(q, k, v, causal=True), q, k, v, causal=True)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_return_attn_probs(dtype):
    # sq > sk with causal: the first rows see no key (zeros, lse +inf, as FlashAttention 2)
    q, k, v = make(2, 9, 5, 4, 4, 32, dtype, seed=8)
    out, lse, probs = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    want, want_lse = fa_reference(q, k, v, causal=True)
    same, _ = fa_reference(q, k, v, causal=True, dtype=dtype)
    flash_rule(out, want, same)
    assert probs is None
    assert lse.dtype == torch.float32 and lse.shape == (2, 4, 9)
    assert torch.isinf(lse[:, :, :4]).all() and (lse[:, :, :4] > 0).all()
    assert (out[:, :4] == 0).all()
    assert max_error(lse, want_lse) < 1e-5


def test_packed_forms_are_views_of_the_same_call():
    q, k, v = make(2, 17, 17, 4, 4, 32, torch.float16, seed=9)
    packed = torch.stack([q, k, v], dim=2)  # (b, s, 3, h, d)
    kv = torch.stack([k, v], dim=2)
    direct = flash_attn_func(q, k, v, causal=True)
    assert torch.equal(flash_attn_qkvpacked_func(packed, causal=True), direct)
    assert torch.equal(flash_attn_kvpacked_func(q, kv, causal=True), direct)
    out, lse, _ = flash_attn_qkvpacked_func(packed, return_attn_probs=True)
    assert lse.shape == (2, 4, 17)


def test_numpy_float16_and_strided_views():
    q, k, v = make(1, 17, 17, 2, 2, 32, torch.float16, seed=10)
    got = flash_attn_func(q.numpy(), k.numpy(), v.numpy())
    assert isinstance(got, np.ndarray) and got.dtype == np.float16
    assert np.array_equal(got, flash_attn_func(q, k, v).numpy())
    # a view with a step and a transposed memory order gives what its contiguous copy gives
    big = torch.randn(1, 34, 2, 32).half()
    view = big[:, ::2]
    assert torch.equal(flash_attn_func(view, k, v), flash_attn_func(view.contiguous(), k, v))


def test_no_graph_under_no_grad_and_slopes_without_gradient():
    q, k, v = make(1, 3, 3, 1, 1, 32, torch.float16, seed=11)
    with torch.no_grad():  # no graph would be recorded: computed, no gradient kept
        assert not flash_attn_func(q.float().requires_grad_(), k.float(), v.float()).requires_grad
    # slopes that require grad: no gradient flows to them, refused naming them
    with pytest.raises(NotImplementedError, match="alibi_slopes.requires_grad"):
        flash_attn_func(q.float(), k.float(), v.float(), alibi_slopes=torch.ones(1, requires_grad=True))


def test_layout_and_shape_errors():
    q, k, v = make(1, 3, 3, 2, 2, 32, torch.float16, seed=12)
    with pytest.raises(qkv.InvalidArgument, match="batch, seqlen, nheads, headdim"):
        flash_attn_func(q[0], k[0], v[0])
    with pytest.raises(qkv.InvalidArgument, match="heads"):
        flash_attn_func(q, k[:, :, :1].expand(1, 3, 3, 32), v)  # 3 key heads do not divide 2
    with pytest.raises(qkv.InvalidArgument, match="qkv has shape"):
        flash_attn_qkvpacked_func(torch.stack([q, k], 2))
