"""qkv.flash_attn's ragged (varlen) functions against FlashAttention 2's documented semantics:
flash_attn_varlen_func computes each sequence b, the rows cu_seqlens[b]:cu_seqlens[b+1] of the
packed q, k and v, as its own flash_attn_func problem (causal and windows aligned to the bottom
right of its L_b x S_b block, ALiBi distances likewise), with no attention across sequences. The
reference below is exactly that: fa_reference (conftest.py, written from FlashAttention's
documentation) per sequence, in float64 (and in the inputs' dtype for FlashAttention's rule).
Lengths 0, 1, 3, 17 and 113 mixed, GQA, every option, the packed and paged forms, numpy and
torch, fp32 and fp16 on Vulkan, gradients (gradcheck in float64 through device="cpu", float32 on
Vulkan against float64 autograd) and the refusals. Small shapes: each is a pipeline lavapipe
compiles."""

import numpy as np
import pytest
import torch

import qkv
from qkv.flash_attn import (flash_attn_varlen_func, flash_attn_varlen_kvpacked_func,
                            flash_attn_varlen_qkvpacked_func)

from conftest import fa_reference, flash_rule, max_error, needs_vulkan, nmse


def offsets(lengths):
    return torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32)


def make(lq, lk, h, hk, d, dv, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(lq), h, d, generator=g, dtype=torch.float64).to(dtype)
    k = torch.randn(sum(lk), hk, d, generator=g, dtype=torch.float64).to(dtype)
    v = torch.randn(sum(lk), hk, dv, generator=g, dtype=torch.float64).to(dtype)
    return q, k, v


def reference(q, k, v, lq, lk, dtype=torch.float64, alibi_slopes=None, **kw):
    """Each sequence as FlashAttention's flash_attn_func of batch 1 (fa_reference), packed again:
    out (total_q, h, dv), lse (h, total_q) (+inf for a row with no key). A sequence with queries
    and no keys: zeros and +inf (every row has no key)."""
    outs, lses = [], []
    cq, ck = offsets(lq).tolist(), offsets(lk).tolist()
    h, dv = q.shape[1], v.shape[2]
    for b in range(len(lq)):
        if lq[b] == 0:
            continue
        if lk[b] == 0:
            outs.append(torch.zeros(lq[b], h, dv, dtype=dtype))
            lses.append(torch.full((h, lq[b]), float("inf"), dtype=torch.float64))
            continue
        slopes = alibi_slopes
        if slopes is not None and torch.as_tensor(slopes).dim() == 2:
            slopes = torch.as_tensor(slopes)[b]
        o, lse = fa_reference(q[None, cq[b]:cq[b + 1]], k[None, ck[b]:ck[b + 1]], v[None, ck[b]:ck[b + 1]],
                              dtype=dtype, alibi_slopes=slopes, **kw)
        outs.append(o[0])
        lses.append(lse[0])
    return torch.cat(outs), torch.cat(lses, dim=1)


LENGTHS = [([0, 1, 3, 17, 113], [5, 1, 3, 113, 17]),  # L < S, L = S, L > S, an empty sequence
           ([3, 17, 1], [0, 17, 113])]  # a sequence with queries and no keys


@pytest.mark.parametrize("lq,lk", LENGTHS)
@pytest.mark.parametrize("kw", [dict(), dict(causal=True), dict(window_size=(4, 2)),
                                dict(causal=True, window_size=(5, -1), softcap=2.0),
                                dict(alibi_slopes="per-head", softmax_scale=0.25),  # options are float32: 0.25 exactly
                                dict(causal=True, alibi_slopes="per-sequence")])
def test_float64_reference_path_matches_the_documented_semantics(lq, lk, kw):
    # device="cpu": qkv's float64 reference, so the agreement is to rounding.
    q, k, v = make(lq, lk, 4, 2, 8, 6, torch.float64, seed=len(lq) + len(kw))
    kw = dict(kw)
    if kw.get("alibi_slopes") == "per-head":
        kw["alibi_slopes"] = torch.tensor([0.5, 0.25, 0.125, 0.0625])
    elif kw.get("alibi_slopes") == "per-sequence":
        kw["alibi_slopes"] = torch.rand(len(lq), 4, generator=torch.Generator().manual_seed(3))
    out, lse, probs = flash_attn_varlen_func(q, k, v, offsets(lq), offsets(lk), max(lq), max(lk),
                                             return_attn_probs=True, device="cpu", **kw)
    want, want_lse = reference(q, k, v, lq, lk, **kw)
    assert probs is None and out.dtype == torch.float64 and out.shape == want.shape
    assert max_error(out, want) < 1e-12
    assert lse.dtype == torch.float32 and lse.shape == (4, sum(lq))
    assert max_error(lse, want_lse) < 1e-5


@needs_vulkan
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kw", [dict(causal=True), dict(window_size=(6, 0), softcap=3.0,
                                                         alibi_slopes=[0.3, 0.1, 0.2, 0.05])])
def test_vulkan_by_flashattentions_rule(dtype, kw):
    lq, lk = LENGTHS[0]
    q, k, v = make(lq, lk, 4, 2, 16, 16, dtype, seed=7)
    out, lse, _ = flash_attn_varlen_func(q, k, v, offsets(lq), offsets(lk), 113, 113, return_attn_probs=True, **kw)
    want, want_lse = reference(q, k, v, lq, lk, **kw)
    same, _ = reference(q, k, v, lq, lk, dtype=dtype, **kw)
    assert out.dtype == dtype
    flash_rule(out, want, same)
    assert max_error(lse, want_lse) < 1e-3


@needs_vulkan
def test_numpy_in_numpy_out_and_the_packed_forms():
    lq = [3, 17, 1]
    q, k, v = make(lq, lq, 2, 2, 16, 16, torch.float32, seed=9)
    cu = offsets(lq)
    out = flash_attn_varlen_func(q, k, v, cu, cu, 17, 17, causal=True)
    got = flash_attn_varlen_func(q.numpy(), k.numpy(), v.numpy(), cu.numpy(), cu.numpy(), 17, 17, causal=True)
    assert isinstance(got, np.ndarray) and np.array_equal(got, out.numpy())
    packed = flash_attn_varlen_qkvpacked_func(torch.stack([q, k, v], 1), cu, 17, causal=True)
    assert torch.equal(packed, out)
    kv = flash_attn_varlen_kvpacked_func(q, torch.stack([k, v], 1), cu, cu, 17, 17, causal=True)
    assert torch.equal(kv, out)
    flash_rule(out, reference(q, k, v, lq, lq, causal=True)[0],
               reference(q, k, v, lq, lq, dtype=torch.float32, causal=True)[0])


def test_paged_keys_through_a_block_table():
    # FlashAttention's paged varlen: k and v are pools of pages, cu_seqlens_k the lengths; pages in
    # shuffled order, a partial last page, a sequence of no keys.
    lq, lk, page = [2, 3, 1], [5, 0, 9], 4
    q, k, v = make(lq, lk, 2, 1, 8, 8, torch.float64, seed=5)
    table = torch.tensor([[3, 0, 0], [1, 1, 1], [5, 2, 4]], dtype=torch.int32)
    pool_k = torch.randn(6, page, 1, 8, dtype=torch.float64)
    pool_v = torch.randn(6, page, 1, 8, dtype=torch.float64)
    rows = [(3, 0), (3, 1), (3, 2), (3, 3), (0, 0)] + [(5, 0), (5, 1), (5, 2), (5, 3), (2, 0), (2, 1), (2, 2),
                                                        (2, 3), (4, 0)]
    for (p, r), i in zip(rows, range(len(rows))):
        pool_k[p, r], pool_v[p, r] = k[i], v[i]
    out = flash_attn_varlen_func(q, pool_k, pool_v, offsets(lq), offsets(lk), 3, 9, causal=True, block_table=table,
                                 device="cpu")
    assert max_error(out, reference(q, k, v, lq, lk, causal=True)[0]) < 1e-12
    with pytest.raises(qkv.InvalidArgument, match=r"block_table\[2, 1\] = 6"):
        flash_attn_varlen_func(q, pool_k, pool_v, offsets(lq), offsets(lk), 3, 9, device="cpu",
                               block_table=torch.tensor([[3, 0, 0], [1, 1, 1], [5, 6, 4]], dtype=torch.int32))


def paged_numpy_reference(q, pool_k, pool_v, table, lq, lk, causal=False, window_size=(-1, -1), softcap=0.0,
                          alibi_slopes=None, softmax_scale=None):
    """FlashAttention's paged flash_attn_varlen_func in float64 numpy, from its documentation: key j
    of sequence b is row j % page_block_size of page block_table[b, j // page_block_size] (j below
    cu_seqlens_k[b + 1] - cu_seqlens_k[b]); query i of sequence b sits at key i + S_b - L_b (causal
    and windows aligned bottom-right); query head h reads K/V head h // (nheads // nheads_k); ALiBi
    adds -slope * |i + S_b - L_b - j|; softcap caps each scaled score. Returns out (total_q, h, dv)
    and lse (h, total_q), a row with no key: zeros and +inf (FlashAttention 2's lse)."""
    q, pool_k, pool_v = (np.asarray(x, dtype=np.float64) for x in (q, pool_k, pool_v))
    page, hk = pool_k.shape[1], pool_k.shape[2]
    total, h, d = q.shape
    scale = 1.0 / np.sqrt(d) if softmax_scale is None else softmax_scale
    out = np.zeros((total, h, pool_v.shape[3]))
    lse = np.full((h, total), np.inf)
    start = 0
    for b, (n_q, n_k) in enumerate(zip(lq, lk)):
        keys = np.array([pool_k[table[b][j // page], j % page] for j in range(n_k)]).reshape(n_k, hk, d)
        values = np.array([pool_v[table[b][j // page], j % page] for j in range(n_k)]).reshape(n_k, hk, -1)
        for head in range(h):
            kv = head // (h // hk)
            s = q[start:start + n_q, head] @ keys[:, kv].T * scale
            if softcap > 0:
                s = softcap * np.tanh(s / softcap)
            i = np.arange(n_q)[:, None] + n_k - n_q
            j = np.arange(n_k)[None, :]
            if alibi_slopes is not None:
                s = s - float(alibi_slopes[head]) * np.abs(i - j)
            left, right = window_size
            right = (0 if right < 0 else min(right, 0)) if causal else right
            keep = np.ones_like(s, dtype=bool)
            if left >= 0:
                keep &= j >= i - left
            if right >= 0:
                keep &= j <= i + right
            s = np.where(keep, s, -np.inf)
            for r in range(n_q):
                if keep[r].any():
                    m = s[r].max()
                    w = np.exp(s[r] - m)
                    out[start + r, head] = w @ values[:, kv] / w.sum()
                    lse[head, start + r] = m + np.log(w.sum())
        start += n_q
    return out, lse


def paged_pools(lk, page, hk, d, dv, dtype, seed, spare=3):
    """Pools holding each sequence's keys in pages listed in shuffled order (spare pages of other
    data among them), the table of int32 (batch, max_pages), and the packed keys and values."""
    g = torch.Generator().manual_seed(seed)
    need = [-(-n // page) for n in lk]
    blocks = sum(need) + spare
    pool_k = torch.randn(blocks, page, hk, d, generator=g, dtype=torch.float64).to(dtype)
    pool_v = torch.randn(blocks, page, hk, dv, generator=g, dtype=torch.float64).to(dtype)
    order = torch.randperm(blocks, generator=g).tolist()
    width = max(max(need), 1)
    table = torch.zeros(len(lk), width, dtype=torch.int32)
    for b, n in enumerate(need):
        for j in range(n):
            table[b, j] = order.pop()
        table[b, n:] = blocks + 7  # past the pool: never read (past the pages the length needs)
    return pool_k, pool_v, table


PAGED_CASES = [dict(causal=True), dict(window_size=(5, 2), softcap=2.0),
               dict(causal=True, alibi_slopes=[0.5, 0.25, 0.125, 0.0625])]


@needs_vulkan
@pytest.mark.parametrize("page", [1, 16])
@pytest.mark.parametrize("kw", PAGED_CASES)
def test_paged_on_the_device_matches_a_float64_numpy_reference(page, kw, monkeypatch):
    # GQA 4:2, q lengths 1 and 17 (and 3 queries over 2 keys: a row with no key under causal). The
    # pages go to the device's paged call as they are: the host gather is not used.
    def no_gather(*args):
        raise AssertionError("the pages were gathered on the host")

    monkeypatch.setattr(qkv.flash_attn, "_paged_rows", no_gather)
    lq, lk = [1, 17, 3, 17], [37, 17, 2, 1]
    pool_k, pool_v, table = paged_pools(lk, page, 2, 16, 8, torch.float32, seed=page + len(kw))
    q = torch.randn(sum(lq), 4, 16, generator=torch.Generator().manual_seed(4))
    out, lse, _ = flash_attn_varlen_func(q, pool_k, pool_v, offsets(lq), offsets(lk), max(lq), max(lk),
                                         block_table=table, return_attn_probs=True, **kw)
    want, want_lse = paged_numpy_reference(q, pool_k, pool_v, table.tolist(), lq, lk, **kw)
    assert out.dtype == torch.float32 and out.shape == want.shape and lse.shape == want_lse.shape
    assert nmse(out, want) < 1e-10
    assert max_error(lse, want_lse) < 1e-4
    # numpy in, numpy out, the same bits.
    got = flash_attn_varlen_func(q.numpy(), pool_k.numpy(), pool_v.numpy(), offsets(lq).numpy(),
                                 offsets(lk).numpy(), max(lq), max(lk), block_table=table.numpy(), **kw)
    assert isinstance(got, np.ndarray) and np.array_equal(got, out.numpy())


@needs_vulkan
def test_paged_float16_on_the_device_by_flashattentions_rule():
    lq, lk, page = [17, 1, 17], [40, 17, 17], 16
    pool_k, pool_v, table = paged_pools(lk, page, 2, 16, 16, torch.float16, seed=11)
    unused = sorted(set(range(pool_k.shape[0])) - set(table[table < pool_k.shape[0]].tolist()))
    assert unused
    pool_k[unused], pool_v[unused] = float("nan"), float("inf")  # pages no sequence reads: never read
    q = torch.randn(sum(lq), 4, 16, generator=torch.Generator().manual_seed(12)).half()
    kw = dict(causal=True, softcap=3.0)
    out = flash_attn_varlen_func(q, pool_k, pool_v, offsets(lq), offsets(lk), 17, 40, block_table=table, **kw)
    want, _ = paged_numpy_reference(q, pool_k, pool_v, table.tolist(), lq, lk, **kw)
    # The same-dtype reference: the gathered rows through FlashAttention's float16 ops (fa_reference).
    keys = torch.cat([pool_k[table[b, j // page].item(), j % page][None] for b, n in enumerate(lk) for j in range(n)])
    vals = torch.cat([pool_v[table[b, j // page].item(), j % page][None] for b, n in enumerate(lk) for j in range(n)])
    same, _ = reference(q, keys, vals, lq, lk, dtype=torch.float16, **kw)
    assert out.dtype == torch.float16
    flash_rule(out, torch.from_numpy(want), same)


def test_paged_bad_block_index_is_refused_before_anything_runs():
    lq, lk = [1, 17], [5, 20]
    pool_k, pool_v, table = paged_pools(lk, 16, 1, 8, 8, torch.float32, seed=2, spare=0)
    q = torch.randn(18, 2, 8)
    before = [x.clone() for x in (q, pool_k, pool_v, table)]
    bad = table.clone()
    bad[1, 1] = pool_k.shape[0]  # sequence 1's second page: past the pool
    for device in ("cpu", None):
        with pytest.raises(qkv.InvalidArgument, match=rf"block_table\[1, 1\] = {pool_k.shape[0]}"):
            flash_attn_varlen_func(q, pool_k, pool_v, offsets(lq), offsets(lk), 17, 20, block_table=bad,
                                   device=device)
        bad[1, 1] = -1
        with pytest.raises(qkv.InvalidArgument, match=r"block_table\[1, 1\] = -1"):
            flash_attn_varlen_func(q, pool_k, pool_v, offsets(lq), offsets(lk), 17, 20, block_table=bad,
                                   device=device)
        bad[1, 1] = pool_k.shape[0]
        with pytest.raises(qkv.InvalidArgument, match="max_seqlen"):
            flash_attn_varlen_func(q, pool_k, pool_v, offsets(lq), offsets(lk), 17, 19, block_table=table,
                                   device=device)
    for x, y in zip(before, (q, pool_k, pool_v, table)):
        assert torch.equal(x, y)


def test_paged_float64_reference_and_gradients_keep_the_gathered_route():
    # device="cpu" (float64) computes the paged problem; inputs that record gradients take the
    # gathered route and get the same values, and their gradients reach the pools.
    lq, lk = [3, 1], [9, 4]
    pool_k, pool_v, table = paged_pools(lk, 4, 1, 8, 8, torch.float64, seed=3)
    q = torch.randn(4, 2, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    kw = dict(causal=True, window_size=(4, -1), alibi_slopes=[0.3, 0.6])
    out = flash_attn_varlen_func(q, pool_k, pool_v, offsets(lq), offsets(lk), 3, 9, block_table=table,
                                 device="cpu", **kw)
    assert max_error(out, paged_numpy_reference(q, pool_k, pool_v, table.tolist(), lq, lk, **kw)[0]) < 1e-12
    pool_k.requires_grad_()
    graded = flash_attn_varlen_func(q, pool_k, pool_v, offsets(lq), offsets(lk), 3, 9, block_table=table,
                                    device="cpu", **kw)
    assert max_error(graded.detach(), out) < 1e-12
    graded.sum().backward()
    assert pool_k.grad is not None and pool_k.grad.abs().sum() > 0


def test_gradcheck_float64_through_the_cpu_reference():
    lq, lk = [2, 0, 3, 1], [3, 2, 4, 0]
    q, k, v = (x.requires_grad_() for x in make(lq, lk, 2, 1, 3, 2, torch.float64, seed=1))
    for kw in (dict(causal=True), dict(window_size=(1, 1), softcap=1.5, alibi_slopes=[0.2, 0.4])):
        assert torch.autograd.gradcheck(
            lambda q, k, v: flash_attn_varlen_func(q, k, v, offsets(lq), offsets(lk), 3, 4, device="cpu", **kw),
            (q, k, v))
    # the packed form's gradient reaches the packed tensor
    packed = torch.randn(5, 3, 2, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(8))
    assert torch.autograd.gradcheck(
        lambda x: flash_attn_varlen_qkvpacked_func(x, offsets([2, 3]), 3, causal=True, device="cpu"),
        (packed.requires_grad_(),))


@needs_vulkan
def test_float32_gradients_on_vulkan_against_float64_autograd():
    lq, lk = [3, 17, 1], [17, 1, 5]
    base = make(lq, lk, 4, 2, 16, 16, torch.float32, seed=4)
    q, k, v = (x.clone().requires_grad_() for x in base)
    out = flash_attn_varlen_func(q, k, v, offsets(lq), offsets(lk), 17, 17, causal=True)
    d_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(2))
    out.backward(d_out)
    r = [x.detach().double().requires_grad_() for x in base]
    reference(*r, lq, lk, causal=True)[0].backward(d_out.double())
    for got, want in zip((q.grad, k.grad, v.grad), (x.grad for x in r)):
        assert torch.isfinite(got).all() and got.dtype == torch.float32
        assert max_error(got, want) < 1e-4 * max(1.0, float(want.abs().max()))


def test_refusals_name_what_is_wrong():
    lq = [3, 2]
    q, k, v = make(lq, lq, 2, 2, 8, 8, torch.float64, seed=6)
    cu = offsets(lq)
    with pytest.raises(qkv.InvalidArgument, match="int32"):
        flash_attn_varlen_func(q, k, v, cu.long(), cu, 3, 3, device="cpu")
    with pytest.raises(qkv.InvalidArgument, match="cu_seqlens_q ends at 4 but q has 5 rows"):
        flash_attn_varlen_func(q, k, v, torch.tensor([0, 3, 4], dtype=torch.int32), cu, 3, 3, device="cpu")
    with pytest.raises(qkv.InvalidArgument, match="nondecreasing"):
        flash_attn_varlen_func(q, k, v, torch.tensor([0, 4, 3, 5], dtype=torch.int32),
                               torch.tensor([0, 1, 2, 5], dtype=torch.int32), 3, 3, device="cpu")
    with pytest.raises(qkv.InvalidArgument, match="max_seqlen_k"):
        flash_attn_varlen_func(q, k, v, cu, cu, 3, 2, device="cpu")
    with pytest.raises(qkv.InvalidArgument, match="dropout"):
        flash_attn_varlen_func(q, k, v, cu, cu, 3, 3, dropout_p=0.1, device="cpu")
    with pytest.raises(qkv.InvalidArgument, match="total_q, nheads, headdim"):
        flash_attn_varlen_func(q[None], k, v, cu, cu, 3, 3, device="cpu")
    with pytest.raises(qkv.InvalidArgument, match=r"\(batch, nheads\) = \(2, 2\)"):
        flash_attn_varlen_func(q, k, v, cu, cu, 3, 3, alibi_slopes=torch.ones(3, 2), device="cpu")
