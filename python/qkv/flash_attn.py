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
(nheads, total_q); their gradients run each sequence's backward pass. dropout_p > 0 is refused
there (InvalidArgument): the library draws dropout's mask per row of a (batch, nheads, seqlen)
batch, which a ragged one does not have. Every function's call goes through _forward or _varlen
below to _autograd.run, the one place where the backward pass (a torch.autograd.Function) plugs in.

Extra keyword arguments (qkv's): device= and precision=, as qkv.scaled_dot_product_attention's.
"""

import numbers

from . import _arrays, _autograd, _devices, _qkv
from ._errors import InvalidArgument
from ._sdpa import BOTTOM_RIGHT, Attention, check_dtypes, dropout_options, options, same_kind, small

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
    lse = lse.copy() if kind != _arrays.TORCH else lse.clone()  # the backward pass keeps the original
    lse[lse == float("-inf")] = float("inf")  # a row with no key: FlashAttention 2 stores +inf
    return out, lse, weights


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
    packed = _arrays.host_array(qkv, "qkv")
    shape = _arrays.shape_of(packed)
    if len(shape) != 5 or shape[2] != 3:
        raise InvalidArgument(f"qkv has shape {shape}: it must be (batch, seqlen, 3, nheads, headdim)")
    q, k, v = (_arrays.select(packed, 2, i) for i in range(3))
    return _forward(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, return_attn_probs,
                    device, precision, names=("qkv",) * 3)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                             softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False, *,
                             device=None, precision=None):
    """FlashAttention's flash_attn_kvpacked_func: q (batch, seqlen_q, nheads, headdim), kv
    (batch, seqlen_k, 2, nheads_k, headdim), k and v packed along dimension 2. Returns as
    flash_attn_func."""
    packed = _arrays.host_array(kv, "kv")
    shape = _arrays.shape_of(packed)
    if len(shape) != 5 or shape[2] != 2:
        raise InvalidArgument(f"kv has shape {shape}: it must be (batch, seqlen_k, 2, nheads_k, headdim)")
    k, v = (_arrays.select(packed, 2, i) for i in range(2))
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


def _paged_rows(pool, name, block_table, lengths):
    """The rows of each sequence b, [0, lengths[b]), read through its row of the block table from a
    pool (num_blocks, page_size, H, D), packed along one token axis: FlashAttention's paged K/V
    gathered (a copy; torch indexing keeps the gradient's path to the pool)."""
    shape = _arrays.shape_of(pool)
    if len(shape) != 4:
        raise InvalidArgument(f"{name} has shape {shape}: with a block_table it is (num_blocks, page_block_size, "
                              "nheads_k, headdim)")
    blocks, page = shape[0], shape[1]
    rows = []
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
            rows.extend(range(index * page, index * page + min(page, n - j * page)))
    flat = pool.reshape(blocks * page, shape[2], shape[3])
    if _arrays.kind_of(pool) == _arrays.TORCH:
        return flat[_arrays._torch().tensor(rows, dtype=_arrays._torch().int64)]
    import numpy

    return flat[numpy.asarray(rows, dtype=numpy.int64)]


def _block_table(x, batch):
    x = _arrays.host_view(x, "block_table")
    dtype = _arrays.dtype_name(x)
    if dtype != "int32" or _arrays.rank(x) != 2 or _arrays.shape_of(x)[0] != batch:
        raise InvalidArgument(f"block_table is {dtype} {_arrays.shape_of(x)}: it must be int32 (batch, "
                              f"max_num_blocks_per_seq) with batch = {batch}")
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
    if block_table is not None:  # FlashAttention's paged varlen: k and v are pools, cu_seqlens_k the lengths
        if len(cu_k) < 2 or any(b < a for a, b in zip(cu_k, cu_k[1:])):
            raise InvalidArgument(f"cu_seqlens_k {cu_k}: it must be nondecreasing batch + 1 offsets")
        lengths = [b - a for a, b in zip(cu_k, cu_k[1:])]
        table = _block_table(block_table, len(lengths))
        k, v = _paged_rows(k, names[1], table, lengths), _paged_rows(v, names[2], table, lengths)
        cu_k = [0]
        for n in lengths:
            cu_k.append(cu_k[-1] + n)
    if window_size is None:
        window_size = (-1, -1)
    if softcap is None:
        softcap = 0.0
    opts = options(scale=softmax_scale, causal=causal, alignment=BOTTOM_RIGHT, window=window_size, softcap=softcap,
                   return_lse=bool(return_attn_probs), precision=precision)
    opts.update(dropout_options(dropout_p))  # refused by the library's capability table (its message says why)
    slopes = small(alibi_slopes, "alibi_slopes")
    call = _Ragged(q, k, v, names, kind, cu_q, cu_k, max_q, max_k, slopes, opts, _devices.resolve(device))
    out, lse, _ = _autograd.run(call)
    if not return_attn_probs:
        return out
    lse = lse.copy() if kind != _arrays.TORCH else lse.clone()  # the backward pass keeps the original
    lse[lse == float("-inf")] = float("inf")  # a row with no key: FlashAttention 2 stores +inf
    return out, lse, None


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
    headdim) and cu_seqlens_k gives each sequence's length (its rows gathered, a copy). dropout_p > 0
    is refused (InvalidArgument): the library draws dropout's mask per row of a (B, H, L) batch.
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
    packed = _arrays.host_array(qkv, "qkv")
    shape = _arrays.shape_of(packed)
    if len(shape) != 4 or shape[1] != 3:
        raise InvalidArgument(f"qkv has shape {shape}: it must be (total, 3, nheads, headdim)")
    q, k, v = (_arrays.select(packed, 1, i) for i in range(3))
    return _varlen(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, softmax_scale, causal,
                   window_size, softcap, alibi_slopes, return_attn_probs, device, precision, names=("qkv",) * 3)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                                    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False, return_attn_probs=False, *, device=None,
                                    precision=None):
    """FlashAttention's flash_attn_varlen_kvpacked_func: q (total_q, nheads, headdim), kv
    (total_k, 2, nheads_k, headdim), k and v packed along dimension 1. Returns as
    flash_attn_varlen_func."""
    packed = _arrays.host_array(kv, "kv")
    shape = _arrays.shape_of(packed)
    if len(shape) != 4 or shape[1] != 2:
        raise InvalidArgument(f"kv has shape {shape}: it must be (total_k, 2, nheads_k, headdim)")
    k, v = (_arrays.select(packed, 1, i) for i in range(2))
    return _varlen(_packed_rows(q, "q", "(total_q, nheads, headdim)"), k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                   max_seqlen_k, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                   return_attn_probs, device, precision, names=("q", "kv", "kv"))


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False):
    """FlashAttention's flash_attn_with_kvcache: not available yet (NotImplementedError); qkv.KVCache
    keeps keys and values on the device and decodes against them."""
    raise NotImplementedError("flash_attn_with_kvcache: qkv does not serve paged K/V caches from Python yet; keep "
                              "keys and values in a qkv.KVCache and call its decode()")
