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

The variable-length and K/V-cache functions (flash_attn_varlen_func, flash_attn_with_kvcache, ...)
are here with FlashAttention's signatures and raise NotImplementedError until qkv serves ragged
batches and paged caches. Every function's call goes through _forward below to _autograd.run, the
one place where the backward pass (a torch.autograd.Function) plugs in.

Extra keyword arguments (qkv's): device= and precision=, as qkv.scaled_dot_product_attention's.
"""

from . import _arrays, _autograd, _devices
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


def _not_yet(name):
    raise NotImplementedError(
        f"{name}: qkv does not serve variable-length batches or paged K/V caches yet; pad the batch and "
        "call flash_attn_func, or keep keys and values in a qkv.KVCache and call its decode()")


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None):
    """FlashAttention's flash_attn_varlen_func: not available yet (NotImplementedError)."""
    _not_yet("flash_attn_varlen_func")


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None, causal=False,
                                     window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False):
    """FlashAttention's flash_attn_varlen_qkvpacked_func: not available yet (NotImplementedError)."""
    _not_yet("flash_attn_varlen_qkvpacked_func")


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                                    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """FlashAttention's flash_attn_varlen_kvpacked_func: not available yet (NotImplementedError)."""
    _not_yet("flash_attn_varlen_kvpacked_func")


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False):
    """FlashAttention's flash_attn_with_kvcache: not available yet (NotImplementedError); qkv.KVCache
    keeps keys and values on the device and decodes against them."""
    _not_yet("flash_attn_with_kvcache")
