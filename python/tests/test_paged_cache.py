"""qkv.PagedKVCache, a pool of K/V pages kept on the device, through flash_attn_with_kvcache(cache=)
and qkv.paged_attention: pages read back as appended, the calls equal (bit for bit) to the same call
over the caller's arrays, rows written through a block table where FlashAttention writes them
(key j of sequence b is row j % page_size of page block_table[b][j // page_size]), and every bad
input refused with the documented exception, nothing written. Light: small pools."""

import gc

import numpy as np
import pytest
import torch

import qkv
from qkv.flash_attn import flash_attn_with_kvcache

from conftest import fa_reference, max_error, needs_vulkan, nmse

pytestmark = needs_vulkan


def pages(n, page, hkv, e, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, page, hkv, e, generator=g).to(dtype), torch.randn(n, page, hkv, e, generator=g).to(dtype))


def test_pages_read_back_as_appended():
    for dtype, name in ((torch.float32, "float32"), (torch.float16, "float16")):
        cache = qkv.PagedKVCache(5, 4, 2, 17, 9, dtype=name)
        assert (cache.num_pages, cache.page_size, cache.pages_held, cache.head_dim, cache.head_dim_v) == (5, 4, 0, 17, 9)
        k, _ = pages(3, 4, 2, 17, dtype, 1)
        _, v = pages(3, 4, 2, 9, dtype, 2)
        cache.append_pages(k, v)
        cache.append_pages(k[:1].numpy(), v[:1].numpy())
        assert cache.pages_held == 4
        got_k, got_v = cache.read_pages()
        assert got_k.dtype == np.float32 and got_k.shape == (4, 4, 2, 17) and got_v.shape == (4, 4, 2, 9)
        assert np.array_equal(got_k[:3], k.float().numpy()) and np.array_equal(got_v[3], v[0].float().numpy())
        with pytest.raises(qkv.LimitExceeded):  # 4 + 2 pages > 5: nothing appended
            cache.append_pages(k[:2], v[:2])
        assert cache.pages_held == 4
        with pytest.raises(qkv.InvalidArgument, match="pool holds 4 pages"):
            cache.read_pages(3, 2)
        cache.clear()
        assert cache.pages_held == 0


def test_bad_inputs_are_refused():
    with pytest.raises(qkv.InvalidArgument, match="dtype"):
        qkv.PagedKVCache(2, 4, 1, 8, dtype="int8")
    with pytest.raises(qkv.InvalidArgument, match="power of two"):
        qkv.PagedKVCache(2, 3, 1, 8)
    with pytest.raises(qkv.InvalidArgument, match="at least one page"):
        qkv.PagedKVCache(0, 4, 1, 8)
    with pytest.raises(qkv.InvalidArgument, match="not on \"cpu\""):
        qkv.PagedKVCache(2, 4, 1, 8, device="cpu")
    with pytest.raises(TypeError):
        qkv.PagedKVCache(2.0, 4, 1, 8)
    cache = qkv.PagedKVCache(2, 4, 1, 8, dtype="float32")
    k, v = pages(1, 4, 1, 8, torch.float32, 3)
    with pytest.raises(qkv.InvalidArgument, match="page_size"):  # pages of 2 rows into a pool of pages of 4
        cache.append_pages(k[:, :2], v[:, :2])
    with pytest.raises(qkv.InvalidArgument):
        cache.append_pages(k.to(torch.int32), v.to(torch.int32))
    with pytest.raises(qkv.InvalidArgument):
        cache.append_pages(k.bool(), v.bool())
    with pytest.raises(TypeError):
        cache.append_pages("k", "v")
    q = torch.randn(1, 1, 2, 8)
    table, lens = torch.tensor([[0]], dtype=torch.int32), torch.tensor([3], dtype=torch.int32)
    with pytest.raises(qkv.InvalidArgument, match="holds no pages"):
        qkv.paged_attention(q, cache, table, lens)
    cache.append_pages(k, v)
    with pytest.raises(qkv.InvalidArgument, match="block_table"):  # page 1 is not held
        qkv.paged_attention(q, cache, torch.tensor([[1]], dtype=torch.int32), lens)
    with pytest.raises(qkv.InvalidArgument, match="headdim"):
        qkv.paged_attention(torch.randn(1, 1, 2, 16), cache, table, lens)
    with pytest.raises(qkv.InvalidArgument):
        qkv.paged_attention(q.to(torch.int32), cache, table, lens)
    with pytest.raises(qkv.InvalidArgument, match="needs a block_table"):
        flash_attn_with_kvcache(q, cache=cache)
    with pytest.raises(qkv.InvalidArgument, match="k_cache and v_cache"):
        flash_attn_with_kvcache(q, cache, torch.zeros(1, 4, 1, 8), cache_seqlens=lens, block_table=table)
    with pytest.raises(qkv.InvalidArgument, match="own device"):
        flash_attn_with_kvcache(q, cache=cache, cache_seqlens=lens, block_table=table, device="cpu")
    with pytest.raises(qkv.InvalidArgument):  # an append past the sequence's one page
        qkv.paged_attention(q, cache, table, 3, k=torch.randn(1, 2, 1, 8), v=torch.randn(1, 2, 1, 8))
    got_k, _ = cache.read_pages()
    assert np.array_equal(got_k, k.numpy())  # nothing written by the refused calls


def test_the_cache_equals_the_array_pool_and_takes_its_appends():
    """fp16 pages of 16 rows, GQA, rotary (half-split), appends crossing a page, a shared page,
    cache_batch_idx and a leftpad: the same bits as the call over the caller's arrays, and the same
    rows written."""
    B, hq, hkv, E, page = 3, 4, 2, 32, 16
    k_pool, v_pool = pages(9, page, hkv, E, torch.float16, 5)
    table = torch.tensor([[4, 1, 7], [4, 0, 2], [8, 3, 6], [5, 5, 5]], dtype=torch.int32)  # row 3 unused
    batch_idx = torch.tensor([2, 0, 1], dtype=torch.int32)
    seqlens = torch.tensor([14, 16, 20], dtype=torch.int32)  # rows 0 and 1 share page 4 (16 rows)
    leftpad = torch.tensor([3, 0, 0], dtype=torch.int32)
    g = torch.Generator().manual_seed(6)
    q = torch.randn(B, 2, hq, E, generator=g).half()
    k, v = torch.randn(B, 5, hkv, E, generator=g).half(), torch.randn(B, 5, hkv, E, generator=g).half()
    angle = torch.rand(64, 8, generator=g, dtype=torch.float64) * 6.28
    kw = dict(k=k, v=v, rotary_cos=angle.cos().half(), rotary_sin=angle.sin().half(), rotary_interleaved=False,
              cache_seqlens=seqlens, cache_batch_idx=batch_idx, cache_leftpad=leftpad, block_table=table,
              causal=True, window_size=(24, 0), return_softmax_lse=True)
    cache = qkv.PagedKVCache(9, page, hkv, E, dtype="float16")
    cache.append_pages(k_pool, v_pool)
    want_out, want_lse = flash_attn_with_kvcache(q, k_pool, v_pool, **kw)
    out, lse = flash_attn_with_kvcache(q, cache=cache, **kw)
    assert out.dtype == torch.float16 and torch.equal(out, want_out) and torch.equal(lse, want_lse)
    got_k, got_v = cache.read_pages()
    assert np.array_equal(got_k, k_pool.float().numpy()) and np.array_equal(got_v, v_pool.float().numpy())
    # the next step through paged_attention: one new row each, the lengths advanced
    q1 = torch.randn(B, 1, hq, E, generator=g).half()
    k1, v1 = torch.randn(B, 1, hkv, E, generator=g).half(), torch.randn(B, 1, hkv, E, generator=g).half()
    step = dict(cache_seqlens=seqlens + 5, cache_batch_idx=batch_idx, causal=True)
    want = flash_attn_with_kvcache(q1, k_pool, v_pool, k1, v1, block_table=table, **step)
    got = qkv.paged_attention(q1, cache, table, k=k1, v=v1, **step)
    assert torch.equal(got, want)
    assert np.array_equal(cache.read_pages()[0], k_pool.float().numpy())


def test_non_finite_float16_pages_as_the_cache_takes_them():
    """float16 pages go to the call's device pool as their bits: infinities and NaNs (a signalling
    one too) in the pages a call reads give the bits of the same call against a PagedKVCache, whose
    pages are appended as float32 values (the arrays' former route); none is refused."""
    B, hq, hkv, E, page = 2, 4, 2, 17, 4
    k_pool, v_pool = pages(6, page, hkv, E, torch.float16, 9)
    table = torch.tensor([[3, 1], [0, 5]], dtype=torch.int32)
    kw = dict(cache_seqlens=torch.tensor([7, 5], dtype=torch.int32), block_table=table, return_softmax_lse=True)
    q = torch.randn(B, 1, hq, E, generator=torch.Generator().manual_seed(10)).half()
    for where, index, bits in [("k", (3, 2, 1, 5), 0x7C00), ("v", (0, 1, 0, 3), 0xFC00), ("k", (1, 0, 1, 0), 0x7E00),
                               ("k", (3, 0, 0, 16), 0x7C01), ("v", (5, 0, 1, 2), 0x7D55), ("k", (2, 0, 0, 0), 0x7C00)]:
        k, v = k_pool.clone(), v_pool.clone()
        (k if where == "k" else v).view(torch.int16)[index] = bits - 0x10000 if bits >= 0x8000 else bits
        cache = qkv.PagedKVCache(6, page, hkv, E, dtype="float16")
        cache.append_pages(k, v)
        want_out, want_lse = flash_attn_with_kvcache(q, cache=cache, **kw)
        out, lse = flash_attn_with_kvcache(q, k, v, **kw)
        assert torch.equal(out.view(torch.int16), want_out.view(torch.int16)), (where, index, hex(bits))
        assert torch.equal(lse.view(torch.int32), want_lse.view(torch.int32)), (where, index, hex(bits))
        if index[0] != 2:  # page 2 is not read
            assert not torch.isfinite(out.float()).all() or not torch.isfinite(lse).all(), (where, index)


def test_write_through_a_block_table():
    cache = qkv.PagedKVCache(4, 2, 1, 8, dtype="float32")
    k_pool, v_pool = pages(4, 2, 1, 8, torch.float32, 7)
    cache.append_pages(k_pool, v_pool)
    table = np.array([[0, 1], [3, 2]], dtype=np.int32)
    k = np.random.default_rng(8).standard_normal((2, 2, 1, 8), dtype=np.float32)
    cache.write(k, k + 1, table, np.array([1, 2], dtype=np.int32))  # sequence 0: keys 1, 2; sequence 1: 2, 3
    got_k, got_v = cache.read_pages()
    want = k_pool.numpy().copy()
    want[0, 1], want[1, 0], want[2, 0], want[2, 1] = k[0, 0], k[0, 1], k[1, 0], k[1, 1]
    assert np.array_equal(got_k, want) and np.array_equal(got_v[2, 1], k[1, 1] + 1)
    with pytest.raises(qkv.InvalidArgument):  # two sequences writing the same pool row: nothing written
        cache.write(k, k, np.array([[0, 1], [0, 1]], dtype=np.int32), np.array([0, 0], dtype=np.int32))
    with pytest.raises(qkv.InvalidArgument):  # a page past the pool
        cache.write(k, k, np.array([[0, 1], [4, 2]], dtype=np.int32), np.array([0, 0], dtype=np.int32))
    assert np.array_equal(cache.read_pages()[0], want)


def test_a_q8_0_pool_decodes_and_takes_writes():
    B, hq, hkv, E, page = 2, 4, 2, 32, 16
    k_pool, v_pool = pages(4, page, hkv, E, torch.float32, 9)
    cache = qkv.PagedKVCache(4, page, hkv, E, dtype="q8_0")
    cache.append_pages(k_pool, v_pool)
    table = torch.tensor([[2, 0], [3, 1]], dtype=torch.int32)
    seqlens = torch.tensor([17, 31], dtype=torch.int32)
    q = torch.randn(B, 1, hq, E, generator=torch.Generator().manual_seed(10))
    out = qkv.paged_attention(q, cache, table, seqlens, causal=True)
    for b in range(B):
        rows = torch.cat([k_pool[i] for i in table[b].tolist()])[:seqlens[b]], \
            torch.cat([v_pool[i] for i in table[b].tolist()])[:seqlens[b]]
        want, _ = fa_reference(q[b:b + 1], rows[0][None], rows[1][None], causal=True)
        assert nmse(out[b:b + 1], want) < 1e-3  # q8_0's rounding of K and V
    # A write quantizes the new rows into their pages (as append_pages quantizes); the next step reads them.
    k_new = torch.randn(B, 1, hkv, E, generator=torch.Generator().manual_seed(13))
    v_new = torch.randn(B, 1, hkv, E, generator=torch.Generator().manual_seed(14))
    cache.write(k_new, v_new, table, seqlens)
    out = qkv.paged_attention(q, cache, table, seqlens + 1, causal=True)
    for b in range(B):
        rows = [torch.cat([x[i] for i in table[b].tolist()])[:seqlens[b]] for x in (k_pool, v_pool)]
        want, _ = fa_reference(q[b:b + 1], torch.cat([rows[0], k_new[b]])[None], torch.cat([rows[1], v_new[b]])[None],
                               causal=True)
        assert nmse(out[b:b + 1], want) < 1e-3
    with pytest.raises(qkv.Unavailable):
        cache.read_pages()


def test_the_cache_keeps_its_device():
    ctx = qkv.Context(0)
    cache = qkv.PagedKVCache(2, 4, 1, 8, dtype="float32", device=ctx)
    assert cache.context is ctx
    del ctx  # the cache holds it
    gc.collect()
    k, v = pages(2, 4, 1, 8, torch.float32, 11)
    cache.append_pages(k, v)
    q = torch.randn(1, 1, 1, 8, generator=torch.Generator().manual_seed(12))
    out = qkv.paged_attention(q, cache, torch.tensor([[1, 0]], dtype=torch.int32), 6)
    want, _ = fa_reference(q, *(torch.cat([x[1], x[0]])[None, :6] for x in (k, v)))
    assert max_error(out, want) < 1e-5
    assert cache.context.take_validation_messages() == []


def test_slopes_as_a_list_and_float64_tables_on_the_paged_path():
    g = torch.Generator().manual_seed(13)
    q = torch.randn(2, 1, 4, 16, generator=g)
    k_pool, v_pool = pages(4, 4, 2, 16, torch.float32, 14)
    table = torch.tensor([[1, 0], [3, 2]], dtype=torch.int32)
    slopes = [0.5, 0.25, 0.125, 0.0625]
    args = dict(cache_seqlens=torch.tensor([7, 5], dtype=torch.int32), block_table=table, causal=True)
    by_list = flash_attn_with_kvcache(q, k_pool, v_pool, alibi_slopes=slopes, **args)
    by_tensor = flash_attn_with_kvcache(q, k_pool, v_pool, alibi_slopes=torch.tensor(slopes), **args)
    assert torch.equal(by_list, by_tensor)
    angle = torch.rand(16, 4, generator=g, dtype=torch.float64)
    k, v = torch.randn(2, 1, 2, 16, generator=g), torch.randn(2, 1, 2, 16, generator=g)
    wide = flash_attn_with_kvcache(q, k_pool.clone(), v_pool.clone(), k, v, rotary_cos=angle.cos(),
                                   rotary_sin=angle.sin(), **args)
    narrow = flash_attn_with_kvcache(q, k_pool.clone(), v_pool.clone(), k, v, rotary_cos=angle.cos().float(),
                                     rotary_sin=angle.sin().float(), **args)
    assert torch.equal(wide, narrow)


def paged_reference(q, k_pool, v_pool, table, seqlens, causal):
    """FlashAttention's paged attention from its documented semantics, in float64: key j of sequence
    b is row j % page_size of page table[b][j // page_size]; each sequence attends its
    seqlens[b] keys (fa_reference: bottom-right causal alignment)."""
    page = k_pool.shape[1]
    outs = []
    for b, n in enumerate(seqlens):
        if n == 0:  # no key: a zero output (FlashAttention 2's, and the module's documented rule)
            outs.append(np.zeros((1, *q.shape[1:3], v_pool.shape[3])))
            continue
        rows = [(int(table[b][j // page]), j % page) for j in range(n)]
        keys = np.stack([k_pool[p, r] for p, r in rows])[None]
        values = np.stack([v_pool[p, r] for p, r in rows])[None]
        outs.append(fa_reference(q[b:b + 1], keys, values, causal=causal)[0].numpy())
    return np.concatenate(outs)


def test_a_block_table_on_the_device():
    """block_table as an int32 qkv.Tensor (never read back): the same output as the numpy table, by
    the float64 reference; appends through it; a table changed on the device between two calls
    takes effect; a bad entry is InvalidArgument after the run."""
    B, hq, hkv, E, page = 3, 4, 2, 17, 4
    g = torch.Generator().manual_seed(31)
    k_pool, v_pool = (torch.randn(9, page, hkv, E, generator=g) for _ in range(2))
    table = np.array([[4, 1, 7, 0, 0], [4, 0, 2, 6, 8], [8, 3, 6, 5, 2]], dtype=np.int32)  # page 4 shared
    seqlens = np.array([1, 3, 17], dtype=np.int32)
    q = torch.randn(B, 1, hq, E, generator=g)
    cache = qkv.PagedKVCache(9, page, hkv, E, dtype="float32")
    cache.append_pages(k_pool, v_pool)
    device_table = qkv.tensor(table, cache.context)
    assert device_table.dtype == "int32"
    want64 = paged_reference(q.numpy(), k_pool.numpy(), v_pool.numpy(), table, seqlens, True)
    host = qkv.paged_attention(q, cache, table, seqlens, causal=True)
    got, lse = qkv.paged_attention(q, cache, device_table, seqlens, causal=True, return_softmax_lse=True)
    _, host_lse = qkv.paged_attention(q, cache, table, seqlens, causal=True, return_softmax_lse=True)
    assert nmse(got, want64) <= 1e-10 and nmse(host, want64) <= 1e-10
    assert nmse(got, host) <= 1e-12 and np.abs(lse.numpy() - host_lse.numpy()).max() < 1e-5
    # numpy's default int64 makes the same table
    assert torch.equal(qkv.paged_attention(q, cache, qkv.tensor(table.astype(np.int64), cache.context), seqlens,
                                           causal=True), got)
    # the table changed on the device between two calls: the second call reads the new one
    moved = table[:, [1, 2, 3, 4, 0]].copy()
    moved[0, 0] = 5
    device_table.upload(moved)
    got2 = qkv.paged_attention(q, cache, device_table, seqlens, causal=True)
    want2 = paged_reference(q.numpy(), k_pool.numpy(), v_pool.numpy(), moved, seqlens, True)
    assert nmse(got2, want2) <= 1e-10 and nmse(got2, want64) > 1e-4
    # appends through the device table: the rows land where the numpy table puts them
    twin = qkv.PagedKVCache(9, page, hkv, E, dtype="float32")
    twin.append_pages(k_pool, v_pool)
    kn, vn = torch.randn(B, 2, hkv, E, generator=g), torch.randn(B, 2, hkv, E, generator=g)
    step = dict(k=kn, v=vn, causal=True)
    rows = np.array([[0, 1, 2, 3, 4], [5, 6, 7, 8, 0], [8, 3, 6, 7, 2]], dtype=np.int32)  # no row written twice
    lens = np.array([1, 3, 15], dtype=np.int32)
    device_table.upload(rows)
    out_dev = qkv.paged_attention(q, cache, device_table, lens, **step)
    out_host = qkv.paged_attention(q, twin, rows, lens, **step)
    assert nmse(out_dev, out_host) <= 1e-12
    assert np.array_equal(cache.read_pages()[0], twin.read_pages()[0])
    assert np.array_equal(cache.read_pages()[1], twin.read_pages()[1])
    k_after, v_after = cache.read_pages()
    want3 = paged_reference(q.numpy(), k_after, v_after, rows, lens + 2, True)
    assert nmse(out_dev, want3) <= 1e-10
    # cache_batch_idx: a device table of any number of rows
    idx = np.array([2, 0, 1], dtype=np.int32)
    four = qkv.tensor(np.concatenate([table, table[:1]]), cache.context)
    by_idx = qkv.paged_attention(q, cache, four, seqlens, cache_batch_idx=idx, causal=True)
    assert nmse(by_idx, qkv.paged_attention(q, cache, table[idx], seqlens, causal=True)) <= 1e-12
    # a bad entry on the device: InvalidArgument after the run, naming the block table
    bad = table.copy()
    bad[2, 4] = 9  # sequence 2's fifth page: past the 9 pages held
    device_table.upload(bad)
    with pytest.raises(qkv.InvalidArgument, match="block table|block_table"):
        qkv.paged_attention(q, cache, device_table, seqlens, causal=True)
    bad[2, 4] = -1
    device_table.upload(bad)
    with pytest.raises(qkv.InvalidArgument, match="block table|block_table"):
        qkv.paged_attention(q, cache, device_table, seqlens, causal=True)
    device_table.upload(table)  # and the next call runs again (over the pages as the appends left them)
    again = paged_reference(q.numpy(), k_after, v_after, table, seqlens, True)
    assert nmse(qkv.paged_attention(q, cache, device_table, seqlens, causal=True), again) <= 1e-10


def test_two_appends_into_one_pool_row_through_a_device_table():
    """Two sequences whose tables name one page as their second, their new rows meeting at one row of
    it: refused with the numpy table (before the run) and with the device table (after it, found on
    the device), InvalidArgument both, nothing written; new rows at other rows of that page run, as
    the numpy table's call and the float64 reference say."""
    B, hq, hkv, E, page = 2, 4, 2, 9, 4
    g = torch.Generator().manual_seed(53)
    k_pool, v_pool = (torch.randn(4, page, hkv, E, generator=g) for _ in range(2))
    table = np.array([[0, 1], [2, 1]], dtype=np.int32)  # page 1 is both sequences' second page
    q = torch.randn(B, 1, hq, E, generator=g)
    kn, vn = torch.randn(B, 2, hkv, E, generator=g), torch.randn(B, 2, hkv, E, generator=g)
    cache = qkv.PagedKVCache(4, page, hkv, E, dtype="float32")
    cache.append_pages(k_pool, v_pool)
    device_table = qkv.tensor(table, cache.context)
    meet = np.array([5, 6], dtype=np.int32)  # keys 5, 6 and 6, 7: rows 1, 2 and 2, 3 of page 1
    with pytest.raises(qkv.InvalidArgument, match="same row of the pool"):
        qkv.paged_attention(q, cache, table, meet, k=kn, v=vn, causal=True)
    with pytest.raises(qkv.InvalidArgument, match="same row of the pool.*page 1, row 2"):
        qkv.paged_attention(q, cache, device_table, meet, k=kn, v=vn, causal=True)
    k_held, v_held = cache.read_pages()
    assert np.array_equal(k_held, k_pool.numpy()) and np.array_equal(v_held, v_pool.numpy())
    apart = np.array([4, 6], dtype=np.int32)  # rows 0, 1 and 2, 3 of page 1: sequence 1 reads all four
    twin = qkv.PagedKVCache(4, page, hkv, E, dtype="float32")
    twin.append_pages(k_pool, v_pool)
    out_dev = qkv.paged_attention(q, cache, device_table, apart, k=kn, v=vn, causal=True)
    out_host = qkv.paged_attention(q, twin, table, apart, k=kn, v=vn, causal=True)
    assert nmse(out_dev, out_host) <= 1e-12
    k_after, v_after = cache.read_pages()
    assert np.array_equal(k_after, twin.read_pages()[0]) and np.array_equal(v_after, twin.read_pages()[1])
    assert nmse(out_dev, paged_reference(q.numpy(), k_after, v_after, table, apart + 2, True)) <= 1e-10


def test_a_device_block_table_is_refused_where_it_cannot_be_read():
    cache = qkv.PagedKVCache(4, 4, 1, 8, dtype="float32")
    k_pool, v_pool = pages(4, 4, 1, 8, torch.float32, 41)
    cache.append_pages(k_pool, v_pool)
    q, lens = torch.randn(2, 1, 2, 8), np.array([3, 5], dtype=np.int32)
    table = qkv.tensor(np.array([[0, 1], [2, 3]], dtype=np.int32), cache.context)
    with pytest.raises(qkv.InvalidArgument, match="PagedKVCache"):  # array pools: the pages are on the host
        flash_attn_with_kvcache(q, k_pool, v_pool, cache_seqlens=lens, block_table=table)
    with pytest.raises(qkv.InvalidArgument, match="PagedKVCache"):
        qkv.flash_attn.flash_attn_varlen_func(q[:, 0], k_pool, v_pool, torch.tensor([0, 1, 2], dtype=torch.int32),
                                              torch.tensor([0, 3, 8], dtype=torch.int32), 1, 5, block_table=table)
    with pytest.raises(qkv.InvalidArgument, match="int32"):
        qkv.paged_attention(q, cache, qkv.tensor(np.zeros((2, 2), dtype=np.float32), cache.context), lens)
    with pytest.raises(qkv.InvalidArgument, match="int32"):  # one row for two sequences
        qkv.paged_attention(q, cache, qkv.tensor(np.zeros((1, 2), dtype=np.int32), cache.context), lens)
    with pytest.raises(qkv.InvalidArgument):  # more keys than the table's columns hold
        qkv.paged_attention(q, cache, table, np.array([3, 9], dtype=np.int32))
    with pytest.raises(qkv.InvalidArgument, match="host array"):
        cache.write(torch.randn(2, 1, 1, 8), torch.randn(2, 1, 1, 8), table, lens)
    q8 = qkv.PagedKVCache(4, 4, 1, 32, dtype="q8_0")
    q8.append_pages(*pages(4, 4, 1, 32, torch.float32, 42))
    new = torch.randn(2, 1, 1, 32)
    with pytest.raises(qkv.InvalidArgument, match="q8_0"):  # appends into quantized pages take a host table
        qkv.paged_attention(torch.randn(2, 1, 2, 32), q8, table, lens, k=new, v=new)
    assert q8.pages_held == 4


def test_cache_seqlens_on_the_device():
    """cache_seqlens as an int32 qkv.Tensor (never read back), with a numpy or a device table: the
    same output as numpy lengths, by the float64 reference; lengths 0, 1 and 17; lengths changed by
    Tensor.upload between two calls take effect; appends (with rotary embedding) land where numpy
    lengths put them; a bad length is InvalidArgument after the run, nothing written, and the next
    good call runs."""
    B, hq, hkv, E, page = 3, 4, 2, 17, 4
    g = torch.Generator().manual_seed(67)
    k_pool, v_pool = (torch.randn(9, page, hkv, E, generator=g) for _ in range(2))
    table = np.array([[4, 1, 7, 0, 3], [4, 0, 2, 6, 8], [8, 3, 6, 5, 2]], dtype=np.int32)  # 20 keys a row
    seqlens = np.array([0, 1, 17], dtype=np.int32)
    q = torch.randn(B, 1, hq, E, generator=g)
    cache = qkv.PagedKVCache(9, page, hkv, E, dtype="float32")
    cache.append_pages(k_pool, v_pool)
    lens = qkv.tensor(seqlens, cache.context)
    device_table = qkv.tensor(table, cache.context)
    want64 = paged_reference(q.numpy(), k_pool.numpy(), v_pool.numpy(), table, seqlens, True)
    host, host_lse = qkv.paged_attention(q, cache, table, seqlens, causal=True, return_softmax_lse=True)
    for t in (table, device_table):
        got, lse = qkv.paged_attention(q, cache, t, lens, causal=True, return_softmax_lse=True)
        assert nmse(got, want64) <= 1e-10 and nmse(got, host) <= 1e-10
        assert max_error(lse, host_lse) < 1e-5  # sequence 0's rows have no key: +inf in both
        via_fa = flash_attn_with_kvcache(q, cache=cache, cache_seqlens=lens, block_table=t, causal=True)
        assert torch.equal(via_fa, got)
    # lengths changed on the device between two calls: the second call reads them
    lens.upload(np.array([5, 17, 2], dtype=np.int32))
    want2 = paged_reference(q.numpy(), k_pool.numpy(), v_pool.numpy(), table, [5, 17, 2], True)
    assert nmse(qkv.paged_attention(q, cache, table, lens, causal=True), want2) <= 1e-10
    assert nmse(qkv.paged_attention(q, cache, device_table, lens, causal=True), want2) <= 1e-10
    # appends through device lengths, rotary embedding included: the rows land where numpy lengths
    # put them, turned at the same positions
    twin = qkv.PagedKVCache(9, page, hkv, E, dtype="float32")
    twin.append_pages(k_pool, v_pool)
    rows = np.array([[0, 1, 2, 3, 4], [5, 6, 7, 8, 0], [8, 3, 6, 7, 2]], dtype=np.int32)  # no row written twice
    start = np.array([0, 1, 15], dtype=np.int32)
    kn, vn = torch.randn(B, 2, hkv, E, generator=g), torch.randn(B, 2, hkv, E, generator=g)
    angles = torch.arange(20, dtype=torch.float64)[:, None] / 10.0 ** (torch.arange(4, dtype=torch.float64) / 4)
    step = dict(k=kn, v=vn, causal=True, rotary_cos=angles.cos().float(), rotary_sin=angles.sin().float())
    lens.upload(start)
    out_dev = qkv.paged_attention(q, cache, qkv.tensor(rows, cache.context), lens, **step)
    out_host = qkv.paged_attention(q, twin, rows, start, **step)
    assert nmse(out_dev, out_host) <= 1e-10
    k_after, v_after = cache.read_pages()
    assert np.abs(k_after - twin.read_pages()[0]).max() < 1e-5 and np.array_equal(v_after, twin.read_pages()[1])
    unturned = qkv.paged_attention(q, twin, rows, start, k=kn, v=vn, causal=True)  # the same rows, not turned
    assert nmse(out_dev, unturned) > 1e-6  # the embedding turned q and the keys
    # a bad length (negative; past the 20 - 2 keys a row leaves for 2 new rows): after the run,
    # nothing appended, and the next good call runs
    for bad in ([0, -1, 3], [0, 1, 19]):
        lens.upload(np.array(bad, dtype=np.int32))
        for t in (rows, qkv.tensor(rows, cache.context)):
            with pytest.raises(qkv.InvalidArgument, match="cache_seqlens"):
                qkv.paged_attention(q, cache, t, lens, k=kn, v=vn, causal=True)
            held_k, held_v = cache.read_pages()
            assert np.array_equal(held_k, k_after) and np.array_equal(held_v, v_after)
    lens.upload(seqlens)
    want3 = paged_reference(q.numpy(), k_after, v_after, table, seqlens, True)
    assert nmse(qkv.paged_attention(q, cache, table, lens, causal=True), want3) <= 1e-10


def test_device_lengths_are_refused_where_they_cannot_be_read():
    cache = qkv.PagedKVCache(4, 4, 1, 32, dtype="float32")
    k_pool, v_pool = pages(4, 4, 1, 32, torch.float32, 71)
    cache.append_pages(k_pool, v_pool)
    q, table = torch.randn(2, 1, 2, 32), np.array([[0, 1], [2, 3]], dtype=np.int32)
    lens = qkv.tensor(np.array([3, 5], dtype=np.int32), cache.context)
    with pytest.raises(qkv.InvalidArgument, match="PagedKVCache"):  # array pools: read on the host
        flash_attn_with_kvcache(q, k_pool, v_pool, cache_seqlens=lens, block_table=table)
    with pytest.raises(qkv.InvalidArgument, match="PagedKVCache"):
        flash_attn_with_kvcache(q, k_pool.reshape(2, 8, 1, 32), v_pool.reshape(2, 8, 1, 32),
                                cache_seqlens=lens)
    with pytest.raises(qkv.InvalidArgument, match="int32 array"):
        cache.write(torch.randn(2, 1, 1, 32), torch.randn(2, 1, 1, 32), table, lens)
    with pytest.raises(qkv.InvalidArgument, match="int32"):
        qkv.paged_attention(q, cache, table, qkv.tensor(np.array([3.0, 5.0], dtype=np.float32), cache.context))
    with pytest.raises(qkv.InvalidArgument, match="int32"):  # one length for two sequences
        qkv.paged_attention(q, cache, table, qkv.tensor(np.array([3], dtype=np.int32), cache.context))
    new = torch.randn(2, 1, 1, 32)
    with pytest.raises(qkv.InvalidArgument, match="cache_batch_idx"):  # one table row twice, with appends
        qkv.paged_attention(q, cache, table, lens, k=new, v=new, cache_batch_idx=np.array([1, 1], dtype=np.int32))
    q8 = qkv.PagedKVCache(4, 4, 1, 32, dtype="q8_0")
    q8.append_pages(k_pool, v_pool)
    with pytest.raises(qkv.InvalidArgument, match="q8_0"):  # appends into quantized pages take host lengths
        qkv.paged_attention(q, q8, table, qkv.tensor(np.array([3, 5], dtype=np.int32), q8.context), k=new, v=new)
    assert q8.pages_held == 4 and np.array_equal(cache.read_pages()[0], k_pool.numpy())
