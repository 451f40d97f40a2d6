"""qkv.PagedKVCache: a pool of K/V pages kept on a Vulkan device (qkv::vulkan::kv_cache of batch 1,
whose rows are the pages' rows, page after page), for flash_attn_with_kvcache(cache=...) and
qkv.paged_attention."""

import numbers

from . import _arrays, _devices, _qkv, _sdpa
from ._errors import InvalidArgument

# The dtype names PagedKVCache takes, as the library's storage types.
_STORAGE = {"float32": "f32", "float16": "f16", "q8_0": "q8_0", "q4_0": "q4_0"}


def _size(value, name):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int (it is a {type(value).__name__})")
    if value < 0:
        raise InvalidArgument(f"{name} is {value}: it must not be negative")
    return int(value)


class PagedKVCache:
    """A pool of `num_pages` pages of `page_size` rows of keys and values kept on a device: the
    k_cache / v_cache of FlashAttention's paged flash_attn_with_kvcache, without copying them
    from the host on every call.

    PagedKVCache(num_pages, page_size, kv_heads, head_dim, head_dim_v=None, dtype="float16",
    device=None): page_size a power of two from 1 to 1024; dtype "float16", "float32", "q8_0" or
    "q4_0" (ggml's blocks, quantized on the host as pages are appended; head dims multiples of 32);
    device as the calls' device= (a Vulkan device: not "cpu"). The device memory for every page is
    allocated here; the pool holds no page until append_pages() fills them, in order.

    Page n is what flash_attn_with_kvcache's pool k_cache[n] is: row r of page n is key
    n * page_size + r of the pool. Pass the cache as flash_attn_with_kvcache(q, cache, cache, ...)
    (or cache=cache) or to qkv.paged_attention with a block_table and cache_seqlens: the new k and v
    of a call are written into the pages on the device (float16 and float32 pools; a quantized
    pool's pages are written by append_pages only).

    The cache keeps its device alive (its Context) for as long as it exists. Errors are the calls':
    InvalidArgument for shapes, dtypes and page indices that do not fit (a page index past the
    pages held included; nothing is written), LimitExceeded past the device's limits or the pool's
    pages, OutOfMemory, Unavailable (a float16 pool on a device without 16-bit storage), DeviceLost.
    """

    def __init__(self, num_pages, page_size, kv_heads, head_dim, head_dim_v=None, dtype="float16", *, device=None):
        sizes = [_size(n, name) for n, name in ((num_pages, "num_pages"), (page_size, "page_size"),
                                                (kv_heads, "kv_heads"), (head_dim, "head_dim"))]
        head_dim_v = sizes[3] if head_dim_v is None else _size(head_dim_v, "head_dim_v")
        if not isinstance(dtype, str) or dtype not in _STORAGE:
            raise InvalidArgument(f"dtype is {dtype!r}: a PagedKVCache stores \"float16\", \"float32\", \"q8_0\" or "
                                  "\"q4_0\"")
        ctx = _devices.resolve(device)
        if ctx is None:
            raise InvalidArgument("device: a PagedKVCache lives on a Vulkan device, not on \"cpu\"")
        self._pool = _qkv._PagedPool(ctx, *sizes, head_dim_v, _STORAGE[dtype])
        self._dtype = dtype

    def append_pages(self, k, v):
        """Fills the next pages: k (n, page_size, kv_heads, head_dim) and v (n, page_size, kv_heads,
        head_dim_v), host arrays (float32, float16 or bfloat16). Past num_pages raises
        qkv.LimitExceeded and appends nothing."""
        self._pool.append_pages(_arrays.host_view(k, "k"), _arrays.host_view(v, "v"))

    def write(self, k, v, block_table, cache_seqlens, cache_batch_idx=None):
        """Writes rows through a block table, as flash_attn_with_kvcache's new k and v (without the
        attention): k (batch, n, kv_heads, head_dim) and v (batch, n, kv_heads, head_dim_v) of one
        float dtype become keys cache_seqlens[b] ... cache_seqlens[b] + n - 1 of sequence b, in the
        pages of its row of block_table (int32 (batch, max_pages); with cache_batch_idx int32
        (batch,), row cache_batch_idx[b] of a table of any number of rows). Into pages held only; a
        q8_0 / q4_0 pool's rows are quantized on the host as append_pages quantizes them (a value
        that cannot be quantized, NaN or infinite: qkv.InvalidArgument). Everything is checked
        first: nothing is written when a check fails. The table is a host array here (a qkv.Tensor
        table is read by the calls, paged_attention and flash_attn_with_kvcache: InvalidArgument)."""
        from .flash_attn import _bshd, _block_table, _int32s

        if isinstance(block_table, _qkv.Tensor):
            raise InvalidArgument("write takes block_table as an int32 host array; a qkv.Tensor table is read by the "
                                  "calls (paged_attention, flash_attn_with_kvcache with k and v)")

        k, v = _bshd(_arrays.host_view(k, "k"), "k"), _bshd(_arrays.host_view(v, "v"), "v")
        batch = _arrays.shape_of(k)[0]
        table = _block_table(block_table, None if cache_batch_idx is not None else batch)
        rows = [] if cache_batch_idx is None else _int32s(cache_batch_idx, "cache_batch_idx", batch)
        q = _arrays.select_range(k, 1, 0, 0)  # no queries: only the append runs
        _qkv._paged(q, None, None, self._pool, [i for row in table for i in row], len(table[0]),
                    _int32s(cache_seqlens, "cache_seqlens", batch), k, v, None, None, True, rows, [],
                    alibi_slopes=None, options=_sdpa.options(causal=True, alignment=_sdpa.BOTTOM_RIGHT),
                    context=self._pool.context)

    def read_pages(self, first=0, count=None):
        """Pages [first, first + count) of those held (count None: all from first on), read back
        from the device as float32 numpy arrays (count, page_size, kv_heads, head_dim) and
        (..., head_dim_v): for tests and inspection (a float16 pool's values are exact in float32).
        A q8_0 / q4_0 pool's blocks are not readable (qkv.Unavailable)."""
        first = _size(first, "first")
        count = max(self.pages_held - first, 0) if count is None else _size(count, "count")
        k, v = self._pool.read_pages(first, count)
        return _arrays.wrap(k, _arrays.NUMPY), _arrays.wrap(v, _arrays.NUMPY)

    def clear(self):
        """Forgets every page held (the memory is kept): append_pages starts again at page 0."""
        self._pool.clear()

    @property
    def num_pages(self):
        return self._pool.num_pages

    @property
    def page_size(self):
        return self._pool.page_size

    @property
    def pages_held(self):
        """Pages appended so far: the block tables of the calls may name pages 0 to pages_held - 1."""
        return self._pool.pages_held

    @property
    def kv_heads(self):
        return self._pool.kv_heads

    @property
    def head_dim(self):
        return self._pool.d_qk

    @property
    def head_dim_v(self):
        return self._pool.d_v

    @property
    def dtype(self):
        return self._dtype

    @property
    def context(self):
        return self._pool.context

    def __repr__(self):
        return (f"qkv.PagedKVCache(num_pages={self.num_pages}, page_size={self.page_size}, kv_heads={self.kv_heads}, "
                f"head_dim={self.head_dim}, head_dim_v={self.head_dim_v}, dtype={self.dtype!r}, "
                f"pages_held={self.pages_held})")
