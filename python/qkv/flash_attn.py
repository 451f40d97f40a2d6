"""FlashAttention's Python interface (flash_attn 2.x), computed by qkv on any Vulkan device:

    from qkv.flash_attn import flash_attn_func       # in place of: from flash_attn import flash_attn_func
    out = flash_attn_func(q, k, v, causal=True)      # q (batch, seqlen, nheads, headdim)

The layout, the flags and the return values are FlashAttention's:
  - q (batch, seqlen_q, nheads, headdim), k and v (batch, seqlen_k, nheads_k, headdim[_v]),
    nheads_k dividing nheads (MQA/GQA: query head h reads K/V head h // (nheads // nheads_k));
    output (batch, seqlen_q, nheads, headdim_v), of the inputs' kind and dtype;
  - causal is aligned to the bottom-right corner when seqlen_q != seqlen_k (query i sees keys
    j <= i + seqlen_k - seqlen_q); window_size=(left, right) keeps keys with
    i + seqlen_k - seqlen_q - left <= j <= i + seqlen_k - seqlen_q + right (-1: unbounded), with or
    without causal; alibi_slopes (nheads,) or (batch, nheads) add -slope * |i + seqlen_k - seqlen_q - j|;
    softcap > 0 caps each scaled score s to softcap * tanh(s / softcap);
  - return_attn_probs=True returns (out, softmax_lse, S_dmask): softmax_lse float32
    (batch, nheads, seqlen_q), the log-sum-exp of each row of the scaled scores, and S_dmask: None
    when dropout_p == 0, as FlashAttention returns it; with dropout (batch, nheads, seqlen_q,
    seqlen_k), the probabilities with each dropped one negated (FlashAttention's encoding of the
    dropout pattern); for the probabilities without dropout use
    qkv.scaled_dot_product_attention(..., return_weights=True);
  - dropout_p > 0: its Philox seed is drawn from torch's default generator, so torch.manual_seed(s)
    before a call reproduces its mask, and the backward pass uses the same one;
  - inputs that require grad: .backward() gives q, k, v (and the packed qkv, kv) their gradients
    through qkv's backward pass on the same device (a torch.autograd.Function).

Where it differs: float32 inputs are accepted too (FlashAttention takes float16 and bfloat16 only),
any head width up to the device's limit (576 on the fused kernels); a row with no key (a window or
the causal rule leaving none) gets a zero output and softmax_lse +inf, as FlashAttention 2 stores
it. `deterministic` is accepted and changes nothing (qkv's forward and backward passes are
deterministic).

The variable-length functions (flash_attn_varlen_func and its packed forms) compute a ragged
batch in one call of the library's varlen attention (qkv/runtime/varlen.hpp): each sequence is its
own problem, causal and windows aligned to its own bottom-right corner, softmax_lse
(nheads, total_q); their gradients run each sequence's backward pass. With a block_table (paged
k and v) flash_attn_varlen_func runs the library's paged call instead, as flash_attn_with_kvcache
does (the rows gathered into the varlen call only for gradients and per-sequence ALiBi slopes). dropout_p > 0 is refused
there (InvalidArgument): the library draws dropout's mask per row of a (batch, nheads, seqlen)
batch, which a ragged one does not have. flash_attn_with_kvcache appends to a cache the caller holds
(arrays, updated in place; contiguous or paged) or to a qkv.PagedKVCache kept on the device, and
runs the library's batched paged decode (the pages it uses uploaded into a device pool for the
call; a contiguous cache taken as pages), or, for ALiBi slopes that differ per sequence, the same
varlen call over each sequence's visible rows.
Every function's call goes through _forward or _varlen
below to _autograd.run, the one place where the backward pass (a torch.autograd.Function) plugs in.

Extra keyword arguments (qkv's): device= and precision=, as qkv.scaled_dot_product_attention's.
"""

import numbers

from . import _arrays, _autograd, _devices, _qkv
from ._errors import InvalidArgument
from ._paged import PagedKVCache
from ._sdpa import BOTTOM_RIGHT, Attention, _flag, check_dtypes, dropout_options, options, same_kind, small

__all__ = ["flash_attn_func", "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func", "flash_attn_varlen_func",
           "flash_attn_varlen_qkvpacked_func", "flash_attn_varlen_kvpacked_func", "flash_attn_with_kvcache"]

# FlashAttention's (batch, seqlen, nheads, headdim) as a view of qkv's (batch, nheads, seqlen, headdim),
# and back: the same permutation both ways.
_SWAP = (0, 2, 1, 3)


def _bshd(x, name):
    x = _arrays.host_array(x, name)
    if _arrays.rank(x) != 4:
        raise InvalidArgument(f"{name} has shape {_arrays.shape_of(x)}: FlashAttention's layout is "
                              "(batch, seqlen, nheads, headdim)")
    return x


def _unpacked(x, name, layout):
    """The arrays packed in x along the one numbered axis of `layout` (x's axes by name, the packed one
    by its count: ("batch", "seqlen", 3, "nheads", "headdim")), as views, not copies."""
    packed = _arrays.host_array(x, name)
    shape = _arrays.shape_of(packed)
    axis = next(i for i, a in enumerate(layout) if isinstance(a, int))
    if len(shape) != len(layout) or shape[axis] != layout[axis]:
        raise InvalidArgument(f"{name} has shape {shape}: it must be ({', '.join(map(str, layout))})")
    return tuple(_arrays.select(packed, axis, i) for i in range(layout[axis]))


def _flash_lse(lse, kind):
    """FlashAttention's softmax_lse from the call's: a copy (the backward pass keeps the original;
    C-ordered for numpy), +inf for a row with no key (FlashAttention 2 stores +inf there; the library -inf)."""
    lse = lse.copy() if kind != _arrays.TORCH else lse.clone()
    lse[lse == float("-inf")] = float("inf")
    return lse


def _forward(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, return_softmax, device,
             precision, names=("q", "k", "v")):
    """out (and softmax_lse) of flash attention over (batch, seqlen, nheads, headdim) arrays (views
    of the arguments `names`, not detached: _autograd.run decides about gradients)."""
    dropout = dropout_options(dropout_p)
    kind = same_kind((q, k, v), names)
    check_dtypes(q, k, v)
    if window_size is None:
        window_size = (-1, -1)
    if softcap is None:  # callers pass None for "off" as often as FlashAttention's 0.0
        softcap = 0.0
    opts = options(scale=softmax_scale, causal=causal, alignment=BOTTOM_RIGHT, window=window_size, softcap=softcap,
                   return_lse=return_softmax, return_weights=bool(return_softmax and dropout), precision=precision)
    opts.update(dropout)
    call = Attention(*(_arrays.permute(x, _SWAP) for x in (q, k, v)), names, kind, mask=None, mask_is_bool=False,
                     sinks=None, alibi_slopes=small(alibi_slopes, "alibi_slopes"), options=opts,
                     context=_devices.resolve(device), out_perm=_SWAP)
    out, lse, weights = _autograd.run(call)
    if not return_softmax:
        return out
    return out, _flash_lse(lse, kind), weights


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False, *, device=None,
                    precision=None):
    """FlashAttention's flash_attn_func.

    q: (batch, seqlen_q, nheads, headdim); k: (batch, seqlen_k, nheads_k, headdim);
    v: (batch, seqlen_k, nheads_k, headdim_v); nheads_k divides nheads.
    Returns out (batch, seqlen_q, nheads, headdim_v); with return_attn_probs=True,
    (out, softmax_lse (batch, nheads, seqlen_q) float32, None). See the module's docstring for the
    causal, window, ALiBi and softcap conventions (FlashAttention's).
    """
    return _forward(_bshd(q, "q"), _bshd(k, "k"), _bshd(v, "v"), dropout_p, softmax_scale, causal, window_size,
                    softcap, alibi_slopes, return_attn_probs, device, precision)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                              softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False, *,
                              device=None, precision=None):
    """FlashAttention's flash_attn_qkvpacked_func: qkv (batch, seqlen, 3, nheads, headdim), q, k and v
    packed along dimension 2 (read as views, not copied). Returns as flash_attn_func."""
    q, k, v = _unpacked(qkv, "qkv", ("batch", "seqlen", 3, "nheads", "headdim"))
    return _forward(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, return_attn_probs,
                    device, precision, names=("qkv",) * 3)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                             softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False, *,
                             device=None, precision=None):
    """FlashAttention's flash_attn_kvpacked_func: q (batch, seqlen_q, nheads, headdim), kv
    (batch, seqlen_k, 2, nheads_k, headdim), k and v packed along dimension 2. Returns as
    flash_attn_func."""
    k, v = _unpacked(kv, "kv", ("batch", "seqlen_k", 2, "nheads_k", "headdim"))
    return _forward(_bshd(q, "q"), k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                    return_attn_probs, device, precision, names=("q", "kv", "kv"))


def _offsets(x, name):
    """cu_seqlens (or a block table, cache_seqlens...): a 1-D int32 numpy array or torch tensor, as
    FlashAttention takes them, read as a list of ints (they are B + 1 small numbers)."""
    x = _arrays.host_view(x, name)
    dtype = _arrays.dtype_name(x)
    if dtype != "int32":
        raise InvalidArgument(f"{name} is {dtype or type(x).__name__}: FlashAttention's offsets are int32 "
                              "(torch.int32 or numpy.int32)")
    if _arrays.rank(x) != 1:
        raise InvalidArgument(f"{name} has shape {_arrays.shape_of(x)}: it must be (batch + 1,)")
    return [int(i) for i in x.tolist()]


def _count(value, name):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int (it is a {type(value).__name__})")
    if value < 0:
        raise InvalidArgument(f"{name} is {value}: it must be at least 0")
    return int(value)


def _packed_rows(x, name, what):
    x = _arrays.host_array(x, name)
    if _arrays.rank(x) != 3:
        raise InvalidArgument(f"{name} has shape {_arrays.shape_of(x)}: a ragged batch's {name} is {what}")
    return x


class _Ragged:
    """One ragged (varlen) call, as _autograd.run takes a call: query, key and value (total, H, E)
    as the caller passed them (views of packed inputs, with their autograd history), the offsets,
    and run() / gradients() on the C++ side's one varlen call and its backward pass."""

    def __init__(self, q, k, v, names, kind, cu_q, cu_k, max_q, max_k, alibi_slopes, options, context):
        self.query, self.key, self.value = q, k, v
        self.names, self.kind = names, kind
        self.cu_q, self.cu_k, self.max_q, self.max_k = cu_q, cu_k, max_q, max_k
        self.alibi_slopes, self.options, self.context = alibi_slopes, options, context

    def _inputs(self):
        return (*(_arrays.detached(x) for x in (self.query, self.key, self.value)), self.cu_q, self.cu_k, self.max_q,
                self.max_k)

    def run(self, **options):
        out, lse = _qkv._varlen(*self._inputs(), alibi_slopes=self.alibi_slopes,
                                options=dict(self.options, **options), context=self.context)
        return _arrays.wrap(out, self.kind), _arrays.wrap(lse, self.kind), None

    def gradients(self, grad_output, output, lse):
        grads = _qkv._varlen_backward(*self._inputs(), grad_output.detach(), output.detach(), lse.detach(),
                                      alibi_slopes=self.alibi_slopes, options=self.options, context=self.context)
        return tuple(_arrays.wrap(g, _arrays.TORCH) for g in grads)


def _pages_read(pool, name, block_table, lengths):
    """The pages each sequence b reads for its keys [0, lengths[b]), as (b, j, page index) in order,
    every index checked against the pool (num_blocks, page_size, H, D) before anything is read."""
    shape = _arrays.shape_of(pool)
    if len(shape) != 4:
        raise InvalidArgument(f"{name} has shape {shape}: with a block_table it is (num_blocks, page_block_size, "
                              "nheads_k, headdim)")
    blocks, page = shape[0], shape[1]
    used = []
    for b, n in enumerate(lengths):
        pages = -(-n // page) if page else 0
        if pages > len(block_table[b]):
            raise InvalidArgument(f"block_table row {b} has {len(block_table[b])} pages, sequence {b} needs {pages} "
                                  f"of {page} rows for its {n} keys")
        for j in range(pages):
            index = block_table[b][j]
            if not 0 <= index < blocks:
                raise InvalidArgument(f"block_table[{b}, {j}] = {index}: the pool {name} has {blocks} pages "
                                      f"(0 to {blocks - 1})")
            used.append((b, j, index))
    return used


def _paged_rows(pool, used, lengths):
    """The rows of each sequence b, [0, lengths[b]), read from a pool (num_blocks, page_size, H, D)
    through the pages `used` that _pages_read checked and listed for it, packed along one token
    axis: FlashAttention's paged K/V gathered (a copy; torch indexing keeps the gradient's path to
    the pool)."""
    shape = _arrays.shape_of(pool)
    page = shape[1]
    rows = []
    for b, j, index in used:
        rows.extend(range(index * page, index * page + min(page, lengths[b] - j * page)))
    blocks = shape[0]
    flat = pool.reshape(blocks * page, shape[2], shape[3])
    if _arrays.kind_of(pool) == _arrays.TORCH:
        return flat[_arrays._torch().tensor(rows, dtype=_arrays._torch().int64)]
    import numpy

    return flat[numpy.asarray(rows, dtype=numpy.int64)]


def _block_table(x, batch):
    """A block table as rows of ints: int32 (batch, max_num_blocks_per_seq), or with batch None
    (a cache_batch_idx names each sequence's row) any number of rows, at least one. A table on the
    device (a qkv.Tensor) is refused here: only a PagedKVCache's call reads one (_with_pool)."""
    if isinstance(x, _qkv.Tensor):
        raise InvalidArgument("block_table is a qkv.Tensor: a table on the device is read there, with the pages it "
                              "names: pass the pool as a qkv.PagedKVCache (cache=), or the table as an int32 array")
    x = _arrays.host_view(x, "block_table")
    dtype = _arrays.dtype_name(x)
    shape = _arrays.shape_of(x)
    if dtype != "int32" or len(shape) != 2 or (shape[0] != batch if batch is not None else shape[0] < 1):
        raise InvalidArgument(f"block_table is {dtype} {shape}: it must be int32 (batch, max_num_blocks_per_seq) "
                              + (f"with batch = {batch}" if batch is not None else "with at least one row"))
    return [[int(i) for i in row] for row in x.tolist()]


def _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
            window_size, softcap, alibi_slopes, return_attn_probs, device, precision, names=("q", "k", "v"),
            block_table=None):
    """out (and softmax_lse (nheads, total_q), None) of a ragged batch: one call of the library's
    varlen attention, through _autograd.run (gradients where q, k or v require them)."""
    kind = same_kind((q, k, v), names)
    check_dtypes(q, k, v)
    cu_q, cu_k = _offsets(cu_seqlens_q, "cu_seqlens_q"), _offsets(cu_seqlens_k, "cu_seqlens_k")
    max_q, max_k = _count(max_seqlen_q, "max_seqlen_q"), _count(max_seqlen_k, "max_seqlen_k")
    if window_size is None:
        window_size = (-1, -1)
    if softcap is None:
        softcap = 0.0
    opts = options(scale=softmax_scale, causal=causal, alignment=BOTTOM_RIGHT, window=window_size, softcap=softcap,
                   return_lse=bool(return_attn_probs), precision=precision)
    dropout = dropout_options(dropout_p)
    opts.update(dropout)  # refused by the library's capability table (its message says why)
    slopes = small(alibi_slopes, "alibi_slopes")
    if block_table is not None:  # FlashAttention's paged varlen: k and v are pools, cu_seqlens_k the lengths
        if len(cu_k) < 2 or any(b < a for a, b in zip(cu_k, cu_k[1:])):
            raise InvalidArgument(f"cu_seqlens_k {cu_k}: it must be nondecreasing batch + 1 offsets")
        lengths = [b - a for a, b in zip(cu_k, cu_k[1:])]
        table = _block_table(block_table, len(lengths))
        # every page index checked before anything is read
        used = [_pages_read(pool, name, table, lengths) for pool, name in ((k, names[1]), (v, names[2]))]
        uniform_slopes, uniform = _uniform_slopes(slopes)
        if uniform and not dropout and not _autograd.records(q, k, v):
            return _paged_varlen(q, k, v, kind, cu_q, lengths, table, max_q, max_k, uniform_slopes, opts, device,
                                 return_attn_probs)
        # Gradients (the library's paged call has no backward pass), ALiBi slopes that differ per
        # sequence and dropout's refusal: each sequence's rows gathered (a copy), one ragged call.
        k, v = _paged_rows(k, used[0], lengths), _paged_rows(v, used[1], lengths)
        cu_k = [0]
        for n in lengths:
            cu_k.append(cu_k[-1] + n)
    call = _Ragged(q, k, v, names, kind, cu_q, cu_k, max_q, max_k, slopes, opts, _devices.resolve(device))
    out, lse, _ = _autograd.run(call)
    if not return_attn_probs:
        return out
    return out, _flash_lse(lse, kind), None


def _paged_varlen(q, k_pool, v_pool, kind, cu_q, lengths, table, max_q, max_k, slopes, opts, device, with_lse):
    """flash_attn_varlen_func with a block_table on the library's paged call: the ragged q as the
    paged problem's cu_seqlens_q, cache_seqlens the keys of each sequence; on a Vulkan device the
    pages the batch reads are uploaded once each into a device pool for the call."""
    if len(cu_q) != len(lengths) + 1:
        raise InvalidArgument(f"cu_seqlens_q has {len(cu_q)} offsets and cu_seqlens_k {len(lengths) + 1}: one "
                              "batch + 1 each")
    longest_q = max((b - a for a, b in zip(cu_q, cu_q[1:])), default=0)
    if max_q < longest_q or max_k < max(lengths, default=0):
        raise InvalidArgument(f"max_seqlen_q = {max_q} and max_seqlen_k = {max_k}: the longest sequence has "
                              f"{longest_q} queries and {max(lengths, default=0)} keys")
    out, lse, _, _ = _qkv._paged(
        _arrays.detached(q), _arrays.detached(k_pool), _arrays.detached(v_pool), None,
        [i for row in table for i in row], len(table[0]) if table else 0, lengths, None, None, None, None, True, [],
        [], cu_seqlens_q=cu_q, alibi_slopes=slopes, options=opts, context=_devices.resolve(device))
    out = _arrays.wrap(out, kind)
    if not with_lse:
        return out
    return out, _flash_lse(_arrays.wrap(lse, kind), kind), None


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None, *, device=None,
                           precision=None):
    """FlashAttention's flash_attn_varlen_func: a ragged batch of B sequences packed along one token axis.

    q: (total_q, nheads, headdim); k: (total_k, nheads_k, headdim); v: (total_k, nheads_k, headdim_v);
    cu_seqlens_q, cu_seqlens_k: int32 (batch + 1,) offsets (sequence b's queries are the rows
    cu_seqlens_q[b]:cu_seqlens_q[b+1], its keys likewise); max_seqlen_q, max_seqlen_k: at least the
    longest sequence's. Each sequence is its own attention problem, causal aligned to its bottom
    right (query i sees keys j <= i + S_b - L_b), windows and ALiBi distances measured likewise;
    alibi_slopes (nheads,) or (batch, nheads). Returns out (total_q, nheads, headdim_v); with
    return_attn_probs=True, (out, softmax_lse (nheads, total_q) float32, None). block_table
    (batch, max_num_blocks_per_seq) int32: k and v are pools (num_blocks, page_block_size, nheads_k,
    headdim) and cu_seqlens_k gives each sequence's length; the call is the library's paged call
    (as flash_attn_with_kvcache's: the pages the batch reads uploaded once each into a device pool),
    except where q, k or v record gradients or ALiBi slopes (batch, nheads) differ per sequence:
    then each sequence's rows are gathered (a copy) into one ragged call. Every page index is
    checked first (InvalidArgument). dropout_p > 0 is refused (InvalidArgument): the library draws
    dropout's mask per row of a (B, H, L) batch.
    """
    q = _packed_rows(q, "q", "(total_q, nheads, headdim)")
    if block_table is None:
        k = _packed_rows(k, "k", "(total_k, nheads_k, headdim)")
        v = _packed_rows(v, "v", "(total_k, nheads_k, headdim_v)")
    else:
        k, v = _arrays.host_array(k, "k"), _arrays.host_array(v, "v")
    return _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
                   window_size, softcap, alibi_slopes, return_attn_probs, device, precision, block_table=block_table)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None, causal=False,
                                     window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False, *, device=None, precision=None):
    """FlashAttention's flash_attn_varlen_qkvpacked_func: qkv (total, 3, nheads, headdim), q, k and v
    packed along dimension 1 (read as views), one offset list for queries and keys. Returns as
    flash_attn_varlen_func."""
    q, k, v = _unpacked(qkv, "qkv", ("total", 3, "nheads", "headdim"))
    return _varlen(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, softmax_scale, causal,
                   window_size, softcap, alibi_slopes, return_attn_probs, device, precision, names=("qkv",) * 3)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                                    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False, return_attn_probs=False, *, device=None,
                                    precision=None):
    """FlashAttention's flash_attn_varlen_kvpacked_func: q (total_q, nheads, headdim), kv
    (total_k, 2, nheads_k, headdim), k and v packed along dimension 1. Returns as
    flash_attn_varlen_func."""
    k, v = _unpacked(kv, "kv", ("total_k", 2, "nheads_k", "headdim"))
    return _varlen(_packed_rows(q, "q", "(total_q, nheads, headdim)"), k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                   max_seqlen_k, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                   return_attn_probs, device, precision, names=("q", "kv", "kv"))


def _int32s(x, name, batch):
    """cache_seqlens, cache_batch_idx, cache_leftpad: an int (cache_seqlens only), or int32 (batch,). A
    qkv.Tensor is refused here: only a PagedKVCache's call reads lengths on the device (_with_pool)."""
    if isinstance(x, numbers.Integral) and not isinstance(x, bool):
        return [int(x)] * batch
    if isinstance(x, _qkv.Tensor):
        raise InvalidArgument(f"{name} is a qkv.Tensor: " + (
            "lengths on the device are read there, by the paged call against a qkv.PagedKVCache "
            "(flash_attn_with_kvcache(cache=...) or qkv.paged_attention); pass them as an int32 array here"
            if name == "cache_seqlens" else "it must be an int32 host array (batch,)"))
    x = _arrays.host_view(x, name)
    if _arrays.dtype_name(x) != "int32" or _arrays.shape_of(x) != (batch,):
        raise InvalidArgument(f"{name} is {_arrays.dtype_name(x)} {_arrays.shape_of(x)}: it must be int32 (batch,) "
                              f"with batch = {batch}")
    return [int(i) for i in x.tolist()]


class _Ops:
    """The few array operations the K/V-cache call needs, on numpy arrays or torch tensors alike."""

    def __init__(self, kind):
        self.torch = _arrays._torch() if kind == _arrays.TORCH else None
        if self.torch is None:
            import numpy

            self.np = numpy

    def cat(self, xs, axis):
        return self.torch.cat(xs, dim=axis) if self.torch else self.np.concatenate(xs, axis=axis)

    def stack(self, xs, axis):
        return self.torch.stack(xs, dim=axis) if self.torch else self.np.stack(xs, axis=axis)

    def wide(self, x, like):
        """x in float32 (float64 where `like` is float64): the precision rotary embedding runs in."""
        wide = "float64" if _arrays.dtype_name(like) == "float64" else "float32"
        return x.to(getattr(self.torch, wide)) if self.torch else x.astype(wide)

    def like(self, x, like):
        return x.to(like.dtype) if self.torch else x.astype(like.dtype)

    def take(self, x, rows):
        if self.torch:
            return x[self.torch.tensor(rows, dtype=self.torch.int64)]
        return x[self.np.asarray(rows, dtype=self.np.int64)]


def _rotary(ops, x, positions, cos, sin, interleaved):
    """FlashAttention's rotary embedding of x (n, H, E) at `positions` (n,): the first rotary_dim =
    2 * cos.shape[1] features turned by the angles of row positions[i] of cos and sin, pairs
    (0, 1), (2, 3), ... when interleaved (GPT-J), else (j, j + rotary_dim / 2) (GPT-NeoX); computed
    in float32 (float64 for float64 inputs), rounded once to x's dtype."""
    half = _arrays.shape_of(cos)[1]
    c, s = (ops.wide(ops.take(t, positions), x)[:, None, :] for t in (cos, sin))
    w = ops.wide(x, x)
    if interleaved:
        x1, x2 = w[..., 0:2 * half:2], w[..., 1:2 * half:2]
    else:
        x1, x2 = w[..., :half], w[..., half:2 * half]
    y1, y2 = x1 * c - x2 * s, x1 * s + x2 * c
    n, h = _arrays.shape_of(x)[:2]
    turned = ops.stack([y1, y2], -1).reshape(n, h, 2 * half) if interleaved else ops.cat([y1, y2], -1)
    return ops.like(ops.cat([turned, w[..., 2 * half:]], -1), x)


def _pool_of(k_cache, v_cache, cache):
    """The PagedKVCache a call names (as k_cache and v_cache, or cache=), or None for arrays."""
    given = [x for x in (k_cache, v_cache) if isinstance(x, PagedKVCache)]
    if cache is not None:
        if not isinstance(cache, PagedKVCache):
            raise TypeError(f"cache must be a qkv.PagedKVCache (it is a {type(cache).__name__})")
        if any(x is not None and x is not cache for x in (k_cache, v_cache)):
            raise InvalidArgument("cache= is given: k_cache and v_cache are then None or that cache")
        return cache
    if given:
        if k_cache is not v_cache:
            raise InvalidArgument("a qkv.PagedKVCache holds both keys and values: pass it as k_cache and v_cache")
        return k_cache
    return None


def _uniform_slopes(slopes):
    """ALiBi slopes (nheads,) as they are; (batch, nheads) whose rows are equal as their first row;
    None where the rows differ (each sequence then has its own slopes)."""
    if slopes is None or _arrays.kind_of(slopes) == _arrays.BUFFER or _arrays.rank(slopes) != 2:
        return slopes, True
    rows = slopes.tolist()
    if all(r == rows[0] for r in rows):
        return slopes[0], True
    return slopes, False


def flash_attn_with_kvcache(q, k_cache=None, v_cache=None, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False, *,
                            cache=None, device=None, precision=None):
    """FlashAttention's flash_attn_with_kvcache: attention of new queries against a K/V cache the caller
    holds, the new keys and values (if given) appended to it in place.

    q (batch, seqlen_q, nheads, headdim); k_cache, v_cache (batch_cache, seqlen_cache, nheads_k,
    headdim[_v]), or with block_table (batch, max_num_blocks_per_seq) int32 pools of pages
    (num_blocks, page_block_size, nheads_k, headdim[_v]), or a qkv.PagedKVCache (as both, or as
    cache=) whose pages stay on the device; k, v (batch, seqlen_new, nheads_k, ·) are written into
    sequence b's cache at rows cache_seqlens[b] ... cache_seqlens[b] + seqlen_new - 1 (its cache row
    cache_batch_idx[b], or with a block table through the pages of table row cache_batch_idx[b]).
    cache_seqlens: an int or int32 (batch,), the rows each cache holds before the call (None: the
    whole cache, without new k and v; required with a PagedKVCache). Sequence b attends to the rows
    cache_leftpad[b] (0 if None) up to cache_seqlens[b] + seqlen_new, causal and windows aligned to
    the bottom right of that block. rotary_cos and rotary_sin (seqlen_ro, rotary_dim / 2) rotate
    the new k at its rows' positions and q at cache_seqlens[b] + i when causal or windowed, else
    all at cache_seqlens[b] (interleaved pairs, or halves with rotary_interleaved=False), computed
    in float32 (float64 for float64 inputs) and rounded to the inputs' dtype, the rotated k being
    what the cache receives. Returns out (batch, seqlen_q, nheads, headdim_v), with
    return_softmax_lse=True also softmax_lse (batch, nheads, seqlen_q) float32.

    The call runs the library's batched paged decode (on a Vulkan device): the pages the batch
    reads or writes are uploaded once each into a pool on the device (a page shared by sequences
    stays shared, and a shared prompt is attended once per group), the new rows are appended there
    and the decode reads every sequence's keys through the block table, in one command buffer; the
    new rows are then written into the caller's arrays. A contiguous cache is taken as a pool of
    pages of P rows (P the largest power of two up to 1024 dividing seqlen_cache), cache row r
    being the pages of table row r. Head widths past the batched decode's (128) run the library's
    host-pool paged call instead; ALiBi slopes of shape (batch, nheads) whose rows differ run as one
    ragged (varlen) call over each sequence's visible rows, gathered on the host. Equal inputs give
    equal bits. cache_batch_idx and cache_leftpad are taken with a block_table as FlashAttention 3
    defines them (the table then has any number of rows, cache_batch_idx[b] naming sequence b's);
    FlashAttention 2 refuses both with a block_table.

    With a qkv.PagedKVCache, block_table may be an int32 qkv.Tensor (qkv.tensor(table, cache.context)):
    the table stays on the device, where a server may update it (Tensor.upload) between steps; it is
    never read back, so its entries are checked on the device, a bad one, or two new rows bound for
    one row of the pool through two table rows that name one page, raising InvalidArgument after
    the run (no row appended, nothing returned), and shared prefixes are not looked for
    (each sequence attends all its keys; the same result up to rounding). Appends into a q8_0 /
    q4_0 pool take a host table. cache_seqlens may likewise be an int32 qkv.Tensor (batch,) on the
    cache's Context, with a host or a device table: read on the device when the call runs, never
    on the host, so the call is planned for each sequence's bound (its table row's keys less
    seqlen_new), a length past it or below cache_leftpad[b] raises InvalidArgument after the run
    (nothing appended, nothing returned), the rotary embedding is applied on the device (q in
    float32, not rounded to its dtype), and appends into a q8_0 / q4_0 pool or with a
    cache_batch_idx naming one row twice are refused (InvalidArgument: give host lengths).

    Everything is checked before a cache is written (a page index past the pool, rows past the
    cache, two new rows bound for one row of a pool: InvalidArgument, nothing written), and an
    array cache is written only once the attention succeeded. num_splits is accepted and changes
    nothing. There is no backward pass (FlashAttention has none): inputs that would record a graph
    are refused."""
    pool = _pool_of(k_cache, v_cache, cache)
    torch = _arrays._torch()
    q = _bshd(q, "q")
    if pool is None:
        k_cache, v_cache = _arrays.host_array(k_cache, "k_cache"), _arrays.host_array(v_cache, "v_cache")
    given = [(x, n) for x, n in ((q, "q"), (k_cache, "k_cache"), (v_cache, "v_cache"), (k, "k"), (v, "v"))
             if x is not None and not isinstance(x, PagedKVCache)]
    kind = same_kind([x for x, _ in given], [n for _, n in given])
    if kind not in (_arrays.NUMPY, _arrays.TORCH):
        raise InvalidArgument("flash_attn_with_kvcache takes numpy arrays or torch tensors (the caches are written "
                              "in place)")
    if torch is not None and torch.is_grad_enabled():
        for x, n in given:
            if isinstance(x, torch.Tensor) and x.requires_grad:
                raise NotImplementedError(f"{n}.requires_grad: flash_attn_with_kvcache has no backward pass "
                                          "(FlashAttention's has none); call it under torch.no_grad()")
    if (k is None) != (v is None):
        raise InvalidArgument("k and v go together: the new keys and values to append")
    if not isinstance(num_splits, numbers.Integral) or isinstance(num_splits, bool):
        raise TypeError(f"num_splits must be an int (it is a {type(num_splits).__name__})")
    _flag(rotary_interleaved, "rotary_interleaved")
    opts = options(scale=softmax_scale, causal=causal, alignment=BOTTOM_RIGHT, window=window_size or (-1, -1),
                   softcap=0.0 if softcap is None else softcap, return_lse=_flag(return_softmax_lse,
                                                                                 "return_softmax_lse"),
                   precision=precision)
    if pool is not None:
        return _with_pool(q, pool, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad,
                          block_table, rotary_interleaved, alibi_slopes, opts, kind, device)
    check_dtypes(q, k_cache, v_cache)
    B, L, Hq, E = _arrays.shape_of(q)
    cshape, vshape = _arrays.shape_of(k_cache), _arrays.shape_of(v_cache)
    if len(cshape) != 4 or len(vshape) != 4 or cshape[:3] != vshape[:3]:
        raise InvalidArgument(f"k_cache {cshape} and v_cache {vshape}: they must be (batch_cache, seqlen_cache, "
                              "nheads_k, headdim), or pages (num_blocks, page_block_size, nheads_k, headdim), alike")
    Hkv, Ev = cshape[2], vshape[3]
    if cshape[3] != E or Hkv == 0 or Hq % Hkv:
        raise InvalidArgument(f"q {_arrays.shape_of(q)} and k_cache {cshape}: the headdims must match and nheads_k "
                              "divide nheads")
    for x, n in ((q, "q"), (k_cache, "k_cache"), (v_cache, "v_cache"), (k, "k"), (v, "v")):
        if x is not None and _arrays.dtype_name(x) != _arrays.dtype_name(q):
            raise InvalidArgument(f"{n} is {_arrays.dtype_name(x)} and q {_arrays.dtype_name(q)}: one dtype")
    new = 0
    if k is not None:
        k, v = _bshd(k, "k"), _bshd(v, "v")
        new = _arrays.shape_of(k)[1]
        if _arrays.shape_of(k) != (B, new, Hkv, E) or _arrays.shape_of(v) != (B, new, Hkv, Ev):
            raise InvalidArgument(f"k {_arrays.shape_of(k)} and v {_arrays.shape_of(v)}: they must be (batch, "
                                  f"seqlen_new, nheads_k, headdim) = ({B}, seqlen_new, {Hkv}, {E}) and ({B}, "
                                  f"seqlen_new, {Hkv}, {Ev})")
        for cache_array, n in ((k_cache, "k_cache"), (v_cache, "v_cache")):
            if kind == _arrays.NUMPY and not cache_array.flags.writeable:
                raise InvalidArgument(f"{n} is read-only: new k and v are written into it")
    paged = block_table is not None
    if paged:
        table = _block_table(block_table, None if cache_batch_idx is not None else B)
        page = cshape[1]
        capacity = len(table[0]) * page if table else 0
        rows_held = len(table)
    else:
        capacity, rows_held = cshape[1], cshape[0]
    if cache_seqlens is None:
        if k is not None:
            raise InvalidArgument("k and v need cache_seqlens: the rows after which they are written")
        seqlens = [capacity] * B
    else:
        seqlens = _int32s(cache_seqlens, "cache_seqlens", B)
    rows = list(range(B)) if cache_batch_idx is None else _int32s(cache_batch_idx, "cache_batch_idx", B)
    starts = [0] * B if cache_leftpad is None else _int32s(cache_leftpad, "cache_leftpad", B)
    for b in range(B):
        if not 0 <= rows[b] < rows_held:
            raise InvalidArgument(f"cache_batch_idx[{b}] = {rows[b]}: the {'block_table' if paged else 'cache'} has "
                                  f"{rows_held} rows")
        if seqlens[b] < 0 or seqlens[b] + new > capacity:
            raise InvalidArgument(f"cache_seqlens[{b}] = {seqlens[b]}: with {new} new rows it must lie in [0, "
                                  f"{capacity - new}] (the cache holds {capacity} rows)")
        if not 0 <= starts[b] <= seqlens[b]:
            raise InvalidArgument(f"cache_leftpad[{b}] = {starts[b]}: it must lie in [0, cache_seqlens[{b}] = "
                                  f"{seqlens[b]}]")
    if paged:  # every page a sequence's rows use, before anything is read or written
        for b in range(B):
            for j in range(starts[b] // page, -(-(seqlens[b] + new) // page)):
                if not 0 <= table[rows[b]][j] < cshape[0]:
                    raise InvalidArgument(f"block_table[{rows[b]}, {j}] = {table[rows[b]][j]}: the pool k_cache has "
                                          f"{cshape[0]} pages (0 to {cshape[0] - 1})")
    cos = sin = None
    if rotary_cos is not None or rotary_sin is not None:
        if rotary_cos is None or rotary_sin is None or k is None:
            raise InvalidArgument("rotary_cos and rotary_sin go together, and with new k and v (as in FlashAttention)")
        cos, sin = _arrays.host_view(rotary_cos, "rotary_cos"), _arrays.host_view(rotary_sin, "rotary_sin")
        ro = _arrays.shape_of(cos)
        if len(ro) != 2 or _arrays.shape_of(sin) != ro or not 0 < 2 * ro[1] <= E:
            raise InvalidArgument(f"rotary_cos {ro} and rotary_sin {_arrays.shape_of(sin)}: they must be "
                                  f"(seqlen_ro, rotary_dim / 2) alike, rotary_dim <= headdim = {E}")
        if same_kind((q, cos), ("q", "rotary_cos")) and _arrays.dtype_name(cos) not in _arrays.FLOATS:
            raise InvalidArgument(f"rotary_cos is {_arrays.dtype_name(cos)}: it must be floating point")
        moving = causal or tuple(window_size or (-1, -1)) != (-1, -1)
        last = max(seqlens[b] + (max(L, new) if moving else new) for b in range(B)) if B else 0
        if last > ro[0]:
            raise InvalidArgument(f"rotary_cos has {ro[0]} positions; this call reaches position {last - 1}")
    slopes, uniform = _uniform_slopes(small(alibi_slopes, "alibi_slopes"))
    ops = _Ops(kind)
    if uniform and (paged or capacity > 0):
        # The library's paged call; the new rows come back as written, rotated and rounded. A
        # contiguous cache (batch_cache, seqlen_cache, ...) is a pool of batch_cache x seqlen_cache / P
        # pages of P rows (P the largest power of two up to 1024 dividing seqlen_cache), row r of
        # the cache the pages of row r of the table, each sequence naming its row.
        pool_k, pool_v, batch_idx = k_cache, v_cache, [] if cache_batch_idx is None else rows
        if not paged:
            page = min(capacity & -capacity, 1024)
            per = capacity // page
            pool_k, pool_v = (x.reshape(rows_held * per, page, *_arrays.shape_of(x)[2:]) for x in (k_cache, v_cache))
            table = [list(range(r * per, (r + 1) * per)) for r in range(rows_held)]
            batch_idx = rows
        out, lse, k_rows, v_rows = _qkv._paged(
            _arrays.detached(q), _arrays.detached(pool_k), _arrays.detached(pool_v), None,
            [i for row in table for i in row], len(table[0]) if table else 0, seqlens,
            _arrays.detached(k) if new else None, _arrays.detached(v) if new else None, cos, sin, rotary_interleaved,
            batch_idx, [] if cache_leftpad is None else starts, alibi_slopes=slopes, options=opts,
            context=_devices.resolve(device))
        out = _arrays.wrap(out, kind)
        if new:
            k, v = _arrays.wrap(k_rows, kind), _arrays.wrap(v_rows, kind)
        lse = _arrays.wrap(lse, kind)
    else:
        if cos is not None:
            k = ops.stack([_rotary(ops, k[b], [seqlens[b] + i for i in range(new)], cos, sin, rotary_interleaved)
                           for b in range(B)], 0)
            q = ops.stack([_rotary(ops, q[b], [seqlens[b] + (i if moving else 0) for i in range(L)], cos, sin,
                                   rotary_interleaved) for b in range(B)], 0)
        # The visible rows of each sequence: its cache's [start, seqlen), then the new ones.
        keys, values, lengths = [], [], []
        for b in range(B):
            if paged:
                old_k, old_v = (_paged_rows(x, _pages_read(x, n, [table[rows[b]]], [seqlens[b]]),
                                            [seqlens[b]])[starts[b]:] for x, n in ((k_cache, "k_cache"),
                                                                                     (v_cache, "v_cache")))
            else:
                old_k, old_v = k_cache[rows[b], starts[b]:seqlens[b]], v_cache[rows[b], starts[b]:seqlens[b]]
            keys += [old_k] + ([k[b]] if new else [])
            values += [old_v] + ([v[b]] if new else [])
            lengths.append(seqlens[b] - starts[b] + new)
        cu_k, cu_q = [0], [L * b for b in range(B + 1)]
        for n in lengths:
            cu_k.append(cu_k[-1] + n)
        packed_k = ops.cat(keys, 0) if keys else k_cache[:0, 0]
        packed_v = ops.cat(values, 0) if values else v_cache[:0, 0]
        call = _Ragged(q.reshape(B * L, Hq, E), packed_k, packed_v, ("q", "k_cache", "v_cache"), kind, cu_q, cu_k, L,
                       max(lengths, default=0), slopes, opts, _devices.resolve(device))
        out, lse, _ = call.run()
    if new:  # written only now: a refused or failed call leaves the cache as it was
        for b in range(B):
            for i in range(new):
                pos = seqlens[b] + i
                target = (table[rows[b]][pos // page], pos % page) if paged else (rows[b], pos)
                for cache_array, x in ((k_cache, k), (v_cache, v)):
                    if torch is not None and kind == _arrays.TORCH:
                        with torch.no_grad():
                            cache_array[target].copy_(x[b, i])
                    else:
                        cache_array[target] = x[b, i]
    return _kvcache_results(out, lse, B, L, Hq, Ev, kind, opts["return_lse"])


def _kvcache_results(out, lse, B, L, Hq, Ev, kind, with_lse):
    """out (batch, seqlen_q, nheads, headdim_v) and softmax_lse (batch, nheads, seqlen_q) from the
    ragged batch's (B·L, Hq, Ev) and (Hq, B·L)."""
    out = out.reshape(B, L, Hq, Ev)
    if not with_lse:
        return out
    lse = lse.reshape(Hq, B, L).transpose(0, 1) if kind == _arrays.TORCH else lse.reshape(Hq, B, L).transpose(1, 0, 2)
    return out, _flash_lse(lse.contiguous() if kind == _arrays.TORCH else lse, kind)  # numpy's copy is C-ordered


def _with_pool(q, pool, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
               rotary_interleaved, alibi_slopes, opts, kind, device):
    """flash_attn_with_kvcache against a PagedKVCache: one call of the library's paged decode on the
    pool's device, the new rows appended into its pages there. A block_table or cache_seqlens that
    is an int32 qkv.Tensor stays on the device (the library's paged_call over tensors reads and
    checks it there; a bad entry or length is its InvalidArgument after the run)."""
    if block_table is None or cache_seqlens is None:
        raise InvalidArgument("a qkv.PagedKVCache needs a block_table and cache_seqlens: which pages and rows each "
                              "sequence has")
    if device is not None and _devices.resolve(device) is not pool.context:
        raise InvalidArgument("device: a qkv.PagedKVCache computes on its own device (leave device= out)")
    check_dtypes(q, q, q)
    B, L, Hq, _ = _arrays.shape_of(q)
    if k is not None:
        k, v = _bshd(k, "k"), _bshd(v, "v")
    device_table = block_table if isinstance(block_table, _qkv.Tensor) else None
    if device_table is not None:  # read on the device, never here: its shape checked, its entries there
        shape = device_table.shape
        if device_table.dtype != "int32" or len(shape) != 2 or (shape[0] != B if cache_batch_idx is None else False):
            raise InvalidArgument(f"block_table is a {device_table.dtype} qkv.Tensor {shape}: it must be int32 (batch, "
                                  f"max_num_blocks_per_seq) with batch = {B}, or (rows, max_num_blocks_per_seq) with "
                                  "cache_batch_idx")
        flat, max_pages = [], shape[1]
    else:
        table = _block_table(block_table, None if cache_batch_idx is not None else B)
        flat, max_pages = [i for row in table for i in row], len(table[0]) if table else 0
    device_lengths = cache_seqlens if isinstance(cache_seqlens, _qkv.Tensor) else None
    if device_lengths is not None:  # read on the device, never here: its shape checked, its values there
        if device_lengths.dtype != "int32" or device_lengths.shape != (B,):
            raise InvalidArgument(f"cache_seqlens is a {device_lengths.dtype} qkv.Tensor {device_lengths.shape}: it "
                                  f"must be int32 (batch,) with batch = {B}")
        seqlens = []
    else:
        seqlens = _int32s(cache_seqlens, "cache_seqlens", B)
    rows = [] if cache_batch_idx is None else _int32s(cache_batch_idx, "cache_batch_idx", B)
    starts = [] if cache_leftpad is None else _int32s(cache_leftpad, "cache_leftpad", B)
    cos = sin = None
    if rotary_cos is not None or rotary_sin is not None:
        if rotary_cos is None or rotary_sin is None:
            raise InvalidArgument("rotary_cos and rotary_sin go together")
        cos, sin = _arrays.host_view(rotary_cos, "rotary_cos"), _arrays.host_view(rotary_sin, "rotary_sin")
    slopes, uniform = _uniform_slopes(small(alibi_slopes, "alibi_slopes"))
    if not uniform:
        raise InvalidArgument("alibi_slopes (batch, nheads) with rows that differ: the paged call against a "
                              "qkv.PagedKVCache takes one slope per query head, (nheads,)")
    out, lse, _, _ = _qkv._paged(_arrays.detached(q), None, None, pool._pool, flat, max_pages, seqlens,
                                 None if k is None else _arrays.detached(k), None if v is None else _arrays.detached(v),
                                 cos, sin, rotary_interleaved, rows, starts, alibi_slopes=slopes, options=opts,
                                 context=pool.context, block_table_tensor=device_table,
                                 cache_seqlens_tensor=device_lengths)
    return _kvcache_results(_arrays.wrap(out, kind), _arrays.wrap(lse, kind), B, L, Hq, pool.head_dim_v, kind,
                            opts["return_lse"])
