"""qkv.flash_attn.flash_attn_with_kvcache against FlashAttention 2's documented semantics, on the
cases of FlashAttention's own test_flash_attn_kvcache (paged and not, new k and v appended,
rotary embedding interleaved and half-split, cache_seqlens, cache_batch_idx, cache_leftpad, GQA and
MQA, causal and local windows), by its rule: qkv's error against a float64 reference is at most
twice that of a reference computed in the inputs' dtype. The reference below follows the
documentation, not qkv's code: new keys and values (rotated at their positions) are written into a
copy of the cache at rows cache_seqlens[b] onward; sequence b attends to its cache's rows
cache_leftpad[b] to cache_seqlens[b] + seqlen_new as flash_attn_func does (fa_reference in
conftest.py), with q rotated at cache_seqlens[b] + i when causal or local, else at cache_seqlens[b];
rotary embedding as x * cos + rotate_half(x) * sin. Light: a handful of small cases."""

import numpy as np
import pytest
import torch

import qkv
from qkv.flash_attn import flash_attn_with_kvcache

from conftest import fa_reference, flash_rule, max_error, needs_vulkan


def rotary_reference(x, positions, cos, sin, interleaved):
    """x (n, h, d) turned at `positions` in float64: x * cos + rotate_half(x) * sin over the first
    rotary_dim features, cos and sin repeated to rotary_dim as pairs (interleaved) or halves."""
    x = x.double()
    rd = 2 * cos.shape[1]
    c, s = cos.double()[positions], sin.double()[positions]
    if interleaved:
        c, s = c.repeat_interleave(2, -1), s.repeat_interleave(2, -1)
        turned = torch.stack([-x[..., 1:rd:2], x[..., 0:rd:2]], -1).flatten(-2)
    else:
        c, s = torch.cat([c, c], -1), torch.cat([s, s], -1)
        turned = torch.cat([-x[..., rd // 2:rd], x[..., :rd // 2]], -1)
    return torch.cat([x[..., :rd] * c[:, None] + turned * s[:, None], x[..., rd:]], -1)


def reference(q, k_cache, v_cache, k, v, seqlens, *, cos=None, sin=None, interleaved=True, batch_idx=None,
              leftpad=None, causal=False, window_size=(-1, -1), dtype=torch.float64, **kw):
    """(out (b, sq, h, dv), the updated caches, rounded to q's dtype) of a contiguous cache."""
    B, L = q.shape[:2]
    new = 0 if k is None else k.shape[1]
    k_cache, v_cache = k_cache.clone(), v_cache.clone()
    rows = list(range(B)) if batch_idx is None else batch_idx
    starts = [0] * B if leftpad is None else leftpad
    local = causal or tuple(window_size) != (-1, -1)
    outs = []
    for b in range(B):
        qb = q[b]
        if new:
            kb = k[b]
            if cos is not None:
                kb = rotary_reference(kb, torch.arange(new) + seqlens[b], cos, sin, interleaved).to(q.dtype)
                at = torch.arange(L) + seqlens[b] if local else torch.full((L,), seqlens[b])
                qb = rotary_reference(qb, at, cos, sin, interleaved).to(q.dtype)
            k_cache[rows[b], seqlens[b]:seqlens[b] + new] = kb
            v_cache[rows[b], seqlens[b]:seqlens[b] + new] = v[b]
        end = seqlens[b] + new
        o, _ = fa_reference(qb[None], k_cache[None, rows[b], starts[b]:end], v_cache[None, rows[b], starts[b]:end],
                            causal=causal, window_size=window_size, dtype=dtype, **kw)
        outs.append(o[0])
    return torch.stack(outs), k_cache, v_cache


def paged(cache, page, seed):
    """A contiguous cache (b, s, h, d) as a pool of pages in shuffled order, two spare pages, and the
    block table (b, s / page) int32."""
    B, S = cache.shape[:2]
    per = S // page
    order = torch.randperm(B * per + 2, generator=torch.Generator().manual_seed(seed))
    pool = torch.randn(B * per + 2, page, *cache.shape[2:], generator=torch.Generator().manual_seed(seed)).to(cache.dtype)
    table = order[:B * per].view(B, per).to(torch.int32)
    for b in range(B):
        for j in range(per):
            pool[table[b, j]] = cache[b, j * page:(j + 1) * page]
    return pool, table


def unpaged(pool, table):
    return torch.stack([torch.cat([pool[i] for i in row.tolist()]) for row in table])


# FlashAttention's cases, each small: (paged page size or None, seqlen_q, seqlen_new, heads (Hq, Hkv),
# rotary (None, "interleaved", "half"), cache_batch_idx, leftpad, causal, window, dtype).
CASES = [
    dict(page=None, L=1, new=1, heads=(4, 2), rotary=None, batch_idx=False, leftpad=False, causal=True),
    dict(page=None, L=3, new=3, heads=(4, 2), rotary="interleaved", batch_idx=True, leftpad=False, causal=True),
    dict(page=None, L=2, new=2, heads=(2, 1), rotary="half", batch_idx=False, leftpad=True, causal=False),
    dict(page=None, L=1, new=0, heads=(4, 1), rotary=None, batch_idx=True, leftpad=True, window=(5, 0),
         dtype=torch.float16),
    dict(page=4, L=3, new=2, heads=(4, 2), rotary="half", causal=True, dtype=torch.float16),
    dict(page=16, L=1, new=0, heads=(2, 2), rotary=None, causal=True, window=(7, -1), softcap=4.0),
    dict(page=1, L=2, new=1, heads=(4, 2), rotary="interleaved", window=(3, 3), alibi=True),
]


@needs_vulkan
@pytest.mark.parametrize("case", CASES, ids=[str(i) for i in range(len(CASES))])
def test_flashattentions_kvcache_cases(case):
    dtype = case.get("dtype", torch.float32)
    B, E, S_max = 3, 32, 32
    hq, hkv = case["heads"]
    L, new, page = case["L"], case["new"], case["page"]
    g = torch.Generator().manual_seed(len(str(case)))
    q = torch.randn(B, L, hq, E, generator=g).to(dtype)
    cache_rows = B + 1 if case.get("batch_idx") else B  # a spare row the batch does not use
    k_cache = torch.randn(cache_rows, S_max, hkv, E, generator=g).to(dtype)
    v_cache = torch.randn(cache_rows, S_max, hkv, E, generator=g).to(dtype)
    k = torch.randn(B, new, hkv, E, generator=g).to(dtype) if new else None
    v = torch.randn(B, new, hkv, E, generator=g).to(dtype) if new else None
    seqlens = [5, 0, 17][:B] if not case.get("leftpad") else [5, 3, 17]
    batch_idx = [2, 0, 3] if case.get("batch_idx") else None
    leftpad = [2, 0, 9] if case.get("leftpad") else None
    cos = sin = None
    if case["rotary"]:
        angle = torch.rand(S_max, E // 4, generator=g, dtype=torch.float64) * 2 * np.pi  # rotary_dim = E / 2
        cos, sin = angle.cos().to(dtype), angle.sin().to(dtype)
    kw = dict(causal=case.get("causal", False), window_size=case.get("window", (-1, -1)),
              softcap=case.get("softcap", 0.0))
    if case.get("alibi"):
        kw["alibi_slopes"] = torch.rand(hq, generator=g) * 0.5
    ref = dict(cos=cos, sin=sin, interleaved=case["rotary"] != "half", batch_idx=batch_idx, leftpad=leftpad, **kw)
    want, want_k, want_v = reference(q, k_cache, v_cache, k, v, seqlens, **ref)
    same, _, _ = reference(q, k_cache, v_cache, k, v, seqlens, dtype=dtype, **ref)
    args = dict(k=k, v=v, rotary_cos=cos, rotary_sin=sin, cache_seqlens=torch.tensor(seqlens, dtype=torch.int32),
                rotary_interleaved=case["rotary"] != "half", return_softmax_lse=True, num_splits=0, **kw)
    if batch_idx:
        args["cache_batch_idx"] = torch.tensor(batch_idx, dtype=torch.int32)
    if leftpad:
        args["cache_leftpad"] = torch.tensor(leftpad, dtype=torch.int32)
    if page:
        pool_k, table = paged(k_cache, page, seed=1)
        pool_v, _ = paged(v_cache, page, seed=1)
        out, lse = flash_attn_with_kvcache(q, pool_k, pool_v, block_table=table, **args)
        got_k, got_v = unpaged(pool_k, table), unpaged(pool_v, table)
    else:
        got_k, got_v = k_cache, v_cache
        out, lse = flash_attn_with_kvcache(q, k_cache, v_cache, **args)
    assert out.shape == (B, L, hq, E) and out.dtype == dtype and lse.shape == (B, hq, L)
    flash_rule(out, want, same)
    tol = 2e-3 if dtype == torch.float16 else 1e-6  # the rotated rows: rounding of the angle's products
    assert max_error(got_k, want_k) <= tol * 8 and max_error(got_v, want_v) == 0


@needs_vulkan
def test_numpy_caches_are_updated_in_place_and_an_int_seqlen():
    rng = np.random.default_rng(4)
    q = rng.standard_normal((2, 1, 2, 16), dtype=np.float32)
    k_cache, v_cache = (rng.standard_normal((2, 8, 1, 16), dtype=np.float32) for _ in range(2))
    k, v = (rng.standard_normal((2, 1, 1, 16), dtype=np.float32) for _ in range(2))
    before = k_cache.copy()
    out = flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=3, causal=True)
    assert isinstance(out, np.ndarray) and out.shape == (2, 1, 2, 16)
    assert np.array_equal(k_cache[:, 3], k[:, 0]) and np.array_equal(v_cache[:, 3], v[:, 0])
    assert np.array_equal(k_cache[:, :3], before[:, :3]) and np.array_equal(k_cache[:, 4:], before[:, 4:])
    want, _, _ = reference(*(torch.from_numpy(x) for x in (q, before, v_cache, k, v)), [3, 3], causal=True)
    assert max_error(out, want) < 1e-5


def test_refusals_leave_the_cache_unwritten():
    q = torch.randn(2, 1, 2, 8)
    pool_k, pool_v = torch.randn(4, 4, 1, 8), torch.randn(4, 4, 1, 8)
    k, v = torch.randn(2, 1, 1, 8), torch.randn(2, 1, 1, 8)
    kept = pool_k.clone(), pool_v.clone()
    table = torch.tensor([[0, 1], [2, 4]], dtype=torch.int32)  # page 4 is past the pool of 4
    with pytest.raises(qkv.InvalidArgument, match=r"block_table\[1, 1\] = 4"):
        flash_attn_with_kvcache(q, pool_k, pool_v, k, v, cache_seqlens=torch.tensor([2, 4], dtype=torch.int32),
                                block_table=table, device="cpu")
    with pytest.raises(qkv.InvalidArgument, match="cache_seqlens"):
        flash_attn_with_kvcache(q, pool_k, pool_v, k, v, cache_seqlens=8, block_table=table, device="cpu")
    with pytest.raises(qkv.InvalidArgument, match="softcap"):  # refused by the library, after the checks here
        flash_attn_with_kvcache(q, pool_k, pool_v, k, v, cache_seqlens=1, softcap=-1.0,
                                block_table=torch.tensor([[0, 1], [2, 3]], dtype=torch.int32), device="cpu")
    assert torch.equal(pool_k, kept[0]) and torch.equal(pool_v, kept[1])
    with pytest.raises(NotImplementedError, match="no backward pass"):
        flash_attn_with_kvcache(q.requires_grad_(), pool_k, pool_v, cache_seqlens=1,
                                block_table=torch.tensor([[0, 1], [2, 3]], dtype=torch.int32), device="cpu")


def paged_pool(k_cache, v_cache, page, seed, shared_pages=0):
    """Contiguous caches (rows, s, h, d) as pools of pages in shuffled order with three spare pages,
    and the block table (rows, s / page) int32; with shared_pages > 0, table rows 0 and 1 list the
    same first pages (a common prompt: the caches' rows 0 and 1 are made equal there first)."""
    R, S = k_cache.shape[:2]
    per = S // page
    if shared_pages:
        k_cache[1, :shared_pages * page] = k_cache[0, :shared_pages * page]
        v_cache[1, :shared_pages * page] = v_cache[0, :shared_pages * page]
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(R * per + 3, generator=g)
    table = order[:R * per].view(R, per).to(torch.int32)
    if shared_pages:
        table[1, :shared_pages] = table[0, :shared_pages]
    pools = []
    for cache in (k_cache, v_cache):
        pool = torch.randn(R * per + 3, page, *cache.shape[2:], generator=g).to(cache.dtype)
        for r in range(R):
            for j in range(per):
                pool[table[r, j]] = cache[r, j * page:(j + 1) * page]
        pools.append(pool)
    return pools[0], pools[1], table


# The paged cases (FlashAttention's test_flash_attn_kvcache with paged_kv_block_size, on the library's
# device paged decode): page sizes 1, 16 and 256, shuffled pages, shared pages, appends crossing pages,
# rotary in both forms, cache_batch_idx and cache_leftpad with a block table (FlashAttention 3's
# semantics), GQA and MQA, windows, float16 by the 2x rule.
PAGED_CASES = [
    dict(page=1, L=1, new=3, heads=(4, 2), rotary="interleaved", causal=True),
    dict(page=16, L=2, new=17, heads=(4, 1), rotary="half", batch_idx=True, leftpad=True, causal=True),
    dict(page=16, L=1, new=1, heads=(8, 2), shared=2, causal=True, window=(20, 0), dtype=torch.float16),
    dict(page=256, L=3, new=2, heads=(2, 2), rotary="interleaved", dtype=torch.float16),
    dict(page=4, L=2, new=5, heads=(4, 2), rotary="half", leftpad=True, window=(5, 3), softcap=3.0, causal=True,
         dtype=torch.float16),
    dict(page=2, L=1, new=0, heads=(4, 4), batch_idx=True, alibi=True, causal=True),
    dict(page=8, L=1, new=2, heads=(4, 2), alibi="per_sequence", causal=True),
]


@needs_vulkan
@pytest.mark.parametrize("case", PAGED_CASES, ids=[str(i) for i in range(len(PAGED_CASES))])
def test_paged_cases_on_the_device_paged_path(case):
    dtype = case.get("dtype", torch.float32)
    B, E = 3, 32
    S_max = max(64, case["page"])
    hq, hkv = case["heads"]
    L, new, page = case["L"], case["new"], case["page"]
    g = torch.Generator().manual_seed(100 + len(str(case)))
    q = torch.randn(B, L, hq, E, generator=g).to(dtype)
    R = B + 1 if case.get("batch_idx") else B
    k_cache = torch.randn(R, S_max, hkv, E, generator=g).to(dtype)
    v_cache = torch.randn(R, S_max, hkv, E, generator=g).to(dtype)
    k = torch.randn(B, new, hkv, E, generator=g).to(dtype) if new else None
    v = torch.randn(B, new, hkv, E, generator=g).to(dtype) if new else None
    shared = case.get("shared", 0)
    seqlens = [37, 33, 17] if shared else [13, 0, 41]
    if case.get("leftpad"):
        seqlens = [13, 3, 41]
    batch_idx = [2, 0, 3] if case.get("batch_idx") else None
    leftpad = [2, 0, 19] if case.get("leftpad") else None
    if shared:  # sequences 0 and 1 read the shared pages of table rows 0 and 1
        batch_idx = None
    cos = sin = None
    if case.get("rotary"):
        angle = torch.rand(S_max, E // 4, generator=g, dtype=torch.float64) * 2 * np.pi
        cos, sin = angle.cos().to(dtype), angle.sin().to(dtype)
    kw = dict(causal=case.get("causal", False), window_size=case.get("window", (-1, -1)),
              softcap=case.get("softcap", 0.0))
    if case.get("alibi") == "per_sequence":
        kw["alibi_slopes"] = torch.rand(B, hq, generator=g) * 0.5
    elif case.get("alibi"):
        kw["alibi_slopes"] = torch.rand(hq, generator=g) * 0.5
    pool_k, pool_v, table = paged_pool(k_cache, v_cache, page, seed=7, shared_pages=shared)
    ref = dict(cos=cos, sin=sin, interleaved=case.get("rotary") != "half", batch_idx=batch_idx, leftpad=leftpad)
    ref_kw = dict(kw)
    slopes = ref_kw.pop("alibi_slopes", None)
    if slopes is not None and slopes.dim() == 2:  # per sequence: the reference of each with its own slopes
        want = torch.cat([reference(q[b:b + 1], *(c[b:b + 1] for c in (k_cache, v_cache)), *(None if x is None else
                                    x[b:b + 1] for x in (k, v)), seqlens[b:b + 1], alibi_slopes=slopes[b], **ref,
                                    **ref_kw)[0] for b in range(B)])
        same = torch.cat([reference(q[b:b + 1], *(c[b:b + 1] for c in (k_cache, v_cache)), *(None if x is None else
                                    x[b:b + 1] for x in (k, v)), seqlens[b:b + 1], alibi_slopes=slopes[b], dtype=dtype,
                                    **ref, **ref_kw)[0] for b in range(B)])
        _, want_k, want_v = reference(q, k_cache, v_cache, k, v, seqlens, **ref, **ref_kw)
    else:
        extra = {} if slopes is None else dict(alibi_slopes=slopes)
        want, want_k, want_v = reference(q, k_cache, v_cache, k, v, seqlens, **ref, **ref_kw, **extra)
        same, _, _ = reference(q, k_cache, v_cache, k, v, seqlens, dtype=dtype, **ref, **ref_kw, **extra)
    args = dict(k=k, v=v, rotary_cos=cos, rotary_sin=sin, cache_seqlens=torch.tensor(seqlens, dtype=torch.int32),
                rotary_interleaved=case.get("rotary") != "half", return_softmax_lse=True, block_table=table, **kw)
    if batch_idx:
        args["cache_batch_idx"] = torch.tensor(batch_idx, dtype=torch.int32)
    if leftpad:
        args["cache_leftpad"] = torch.tensor(leftpad, dtype=torch.int32)
    before_k, before_v = pool_k.clone(), pool_v.clone()
    out, lse = flash_attn_with_kvcache(q, pool_k, pool_v, **args)
    assert out.shape == (B, L, hq, E) and out.dtype == dtype and lse.shape == (B, hq, L)
    assert torch.isfinite(out).all()
    for b in range(B):  # a sequence without keys: lse +inf (FlashAttention's), else finite
        keys = seqlens[b] + new - (leftpad[b] if leftpad else 0)
        assert torch.isfinite(lse[b]).all() if keys else (lse[b] == float("inf")).all()
    flash_rule(out, want, same)
    tol = 2e-3 if dtype == torch.float16 else 1e-6  # the rotated rows: rounding of the angle's products
    assert max_error(unpaged(pool_k, table), want_k) <= tol * 8
    assert max_error(unpaged(pool_v, table), want_v) == 0
    spare = sorted(set(range(pool_k.shape[0])) - set(table.flatten().tolist()))
    assert torch.equal(pool_k[spare], before_k[spare]) and torch.equal(pool_v[spare], before_v[spare])
    # Equal inputs, equal bits (the pools as they were before the call).
    again_k, again_v = before_k.clone(), before_v.clone()
    out2, lse2 = flash_attn_with_kvcache(q, again_k, again_v, **args)
    assert torch.equal(out2, out) and torch.equal(lse2, lse)
    assert torch.equal(again_k, pool_k) and torch.equal(again_v, pool_v)


@needs_vulkan
def test_two_appends_into_one_pool_row_are_refused_in_the_callers_page_numbers():
    q = torch.randn(2, 1, 2, 8)
    pool_k, pool_v = torch.randn(6, 4, 1, 8), torch.randn(6, 4, 1, 8)
    kept = pool_k.clone()
    table = torch.tensor([[5, 1], [5, 2]], dtype=torch.int32)  # both sequences append into page 5, row 3
    with pytest.raises(qkv.InvalidArgument, match=r"page 5, row 3"):
        flash_attn_with_kvcache(q, pool_k, pool_v, torch.randn(2, 1, 1, 8), torch.randn(2, 1, 1, 8),
                                cache_seqlens=torch.tensor([3, 3], dtype=torch.int32), block_table=table)
    assert torch.equal(pool_k, kept)


@needs_vulkan
@pytest.mark.parametrize("seqlen_cache", [17, 2048])
def test_contiguous_caches_of_odd_and_long_rows_on_the_paged_path(seqlen_cache):
    """A contiguous cache runs as pages of the largest power of two dividing its rows (1 for 17, 1024
    for 2048): the same semantics, checked against the reference, appends crossing rows."""
    g = torch.Generator().manual_seed(seqlen_cache)
    B, hq, hkv, E = 2, 4, 2, 16
    q = torch.randn(B, 2, hq, E, generator=g)
    k_cache, v_cache = torch.randn(B + 1, seqlen_cache, hkv, E, generator=g), torch.randn(B + 1, seqlen_cache, hkv,
                                                                                          E, generator=g)
    k, v = torch.randn(B, 3, hkv, E, generator=g), torch.randn(B, 3, hkv, E, generator=g)
    seqlens = [seqlen_cache - 3, 5]
    want, want_k, want_v = reference(q, k_cache, v_cache, k, v, seqlens, batch_idx=[2, 0], causal=True)
    out = flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=torch.tensor(seqlens, dtype=torch.int32),
                                  cache_batch_idx=torch.tensor([2, 0], dtype=torch.int32), causal=True)
    assert max_error(out, want) < 1e-5
    assert torch.equal(k_cache, want_k.float()) and torch.equal(v_cache, want_v.float())
