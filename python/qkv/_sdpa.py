"""scaled_dot_product_attention and the K/V cache's decode: PyTorch's arguments turned into qkv's
call (the C++ side, _qkv._sdpa, reads the arrays and checks everything again)."""

import numbers
import sys

from . import _arrays, _autograd, _devices, _qkv
from ._errors import InvalidArgument

TOP_LEFT, BOTTOM_RIGHT = "top_left", "bottom_right"


def dropout_options(dropout_p):
    """Dropout's options for a call with dropout_p: none for 0; else p, a 64-bit seed drawn from torch's
    default generator (so torch.manual_seed(s) before a call reproduces its mask, as with PyTorch's and
    FlashAttention's dropout; numpy's global generator where torch is not imported) and offset 0. The
    backward pass of the call draws the same mask (the same options)."""
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real):
        raise TypeError(f"dropout_p must be a number (it is a {type(dropout_p).__name__})")
    if dropout_p == 0:
        return {}
    p = float(dropout_p)
    if not 0 < p < 1:
        raise InvalidArgument(f"dropout_p={dropout_p}: it must be at least 0 and below 1")
    torch = sys.modules.get("torch")
    if torch is not None:
        seed = int(torch.randint(-(2 ** 63), 2 ** 63 - 1, (), dtype=torch.int64).item()) % 2 ** 64
    else:
        import numpy

        seed = int(numpy.random.randint(0, 2 ** 63, dtype=numpy.int64)) * 2 + int(numpy.random.randint(0, 2))
    return {"dropout_p": p, "dropout_seed": seed, "dropout_offset": 0}


def _flag(value, name):
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool (it is a {type(value).__name__})")
    return value


def _real(value, name):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number (it is a {type(value).__name__})")
    return float(value)


def _side(value, name):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int (it is a {type(value).__name__})")
    value = int(value)
    if value < -(2 ** 63) or value >= 2 ** 63:
        raise InvalidArgument(f"{name} is {value}: beyond a 64-bit integer")
    return value


def _name(value, name):
    """An enum's name: checked to be a str here; which names there are is the library's table
    (qkv::parse_name, qkv/runtime/options.hpp), so its message lists them."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str (it is a {type(value).__name__})")
    return value


def options(*, scale=None, causal=False, alignment=TOP_LEFT, window=None, softcap=0.0, return_lse=False,
            return_weights=False, kv_type=None, precision=None, kernel="auto"):
    """The options dict _qkv reads, with every value's type checked here, naming the argument."""
    opts = {
        "causal": _flag(causal, "is_causal"),
        "alignment": _name(alignment, "causal_alignment"),
        "softcap": _real(softcap, "softcap"),
        "return_lse": _flag(return_lse, "return_lse"),
        "return_weights": _flag(return_weights, "return_weights"),
        "kv_type": _name(kv_type, "kv_type"),
        "precision": _name(precision, "precision"),
        "kernel": _name(kernel, "kernel"),
    }
    if scale is not None:
        opts["scale"] = _real(scale, "scale")
    if window is not None:
        try:
            left, right = window
        except (TypeError, ValueError):
            raise TypeError(f"window must be a pair (left, right), -1 for an unbounded side (it is {window!r})") from None
        opts["window_left"] = _side(left, "window[0]")
        opts["window_right"] = _side(right, "window[1]")
    return opts


def mask_kind(mask, grad=False):
    """(mask, is_bool) for PyTorch's attn_mask: bool (True = may attend) or floating (added). With
    grad (scaled_dot_product_attention over host arrays), a floating torch mask is kept with its
    autograd history (_autograd.run gives it the gradient PyTorch gives an attn_mask); elsewhere one
    that would record a graph is refused."""
    if mask is None:
        return None, False
    mask = _arrays.host_array(mask, "attn_mask") if grad else _arrays.host_view(mask, "attn_mask")
    name = _arrays.dtype_name(mask)
    if name == "bool":
        if _arrays.kind_of(mask) == _arrays.TORCH:
            mask = mask.view(_arrays._torch().uint8)  # DLPack of torch 1.13 has no bool: the same bytes
        return mask, True
    if name in _arrays.FLOATS or name is None:
        return mask, False
    raise InvalidArgument(f"attn_mask is {name}: it must be bool (True = may attend) or floating point (added to "
                          "the scores)")


def small(x, name, grad=False):
    """sinks and alibi_slopes: an array, or a list of numbers. With grad, a torch tensor is kept with
    its autograd history (the sinks of scaled_dot_product_attention over host arrays)."""
    if x is None:
        return None
    if isinstance(x, (list, tuple)):
        import array

        try:
            return array.array("d", [_real(v, name) for v in x])
        except TypeError:
            raise TypeError(f"{name} must be an array or a sequence of numbers") from None
    return _arrays.host_array(x, name) if grad else _arrays.host_view(x, name)


def same_kind(arrays, names):
    kinds = {_arrays.kind_of(a) for a in arrays}
    if len(kinds) > 1:
        raise InvalidArgument(f"{', '.join(names)} mix numpy arrays and torch tensors: pass one kind")
    return kinds.pop()


def check_dtypes(query, key, value):
    names = [_arrays.dtype_name(a) for a in (query, key, value)]
    for n, what in zip(names, ("query", "key", "value")):
        if n is not None and n not in _arrays.FLOATS:
            raise InvalidArgument(f"{what} is {n}: qkv computes float32, float16 and bfloat16 (and float64 with "
                                  "device=\"cpu\")")


def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False, *,
         device=None, precision=None, window=None, softcap=0.0, alibi_slopes=None, sinks=None,
         causal_alignment=TOP_LEFT, kv_type=None, return_lse=False, return_weights=False, kernel="auto"):
    _flag(enable_gqa, "enable_gqa")
    opts = options(scale=scale, causal=is_causal, alignment=causal_alignment, window=window, softcap=softcap,
                   return_lse=return_lse, return_weights=return_weights, kv_type=kv_type, precision=precision,
                   kernel=kernel)
    opts.update(dropout_options(dropout_p))
    tensors = [isinstance(a, _qkv.Tensor) for a in (query, key, value)]
    if any(tensors):
        return _sdpa_tensors(query, key, value, attn_mask, opts, enable_gqa, alibi_slopes, sinks, device, tensors)
    names = ("query", "key", "value")
    q, k, v = (_arrays.host_array(x, n) for x, n in zip((query, key, value), names))
    kind = same_kind((q, k, v), names)
    check_dtypes(q, k, v)
    _check_heads(q, k, enable_gqa)
    mask, is_bool = mask_kind(attn_mask, grad=True)
    call = Attention(q, k, v, names, kind, mask=mask, mask_is_bool=is_bool, sinks=small(sinks, "sinks", grad=True),
                     alibi_slopes=small(alibi_slopes, "alibi_slopes"), options=opts,
                     context=_devices.resolve(device))
    out, lse, weights = _autograd.run(call)
    extra = tuple(r for r in (lse, weights) if r is not None)
    return (out, *extra) if extra else out


class Attention:
    """One attention call over host arrays, as qkv.scaled_dot_product_attention and every
    qkv.flash_attn function make it: _qkv._sdpa's arguments, with query, key and value as the
    caller passed them (torch tensors keep their autograd history: _autograd.run decides whether
    a graph is recorded; so may a floating mask and the sinks), the names to report them by, and
    the kind (numpy or torch) results take.
    out_perm: the order of the output's dimensions, as a view of qkv's (B, Hq, L, Ev)."""

    def __init__(self, query, key, value, names, kind, *, mask, mask_is_bool, sinks, alibi_slopes, options, context,
                 out_perm=()):
        self.query, self.key, self.value = query, key, value
        self.names, self.kind = names, kind
        self.mask, self.mask_is_bool, self.sinks, self.alibi_slopes = mask, mask_is_bool, sinks, alibi_slopes
        self.options, self.context, self.out_perm = options, context, list(out_perm)

    def run(self, **options):
        """(output, lse, weights) of the inputs' kind, None for what the options do not ask for,
        computed from the inputs detached; `options` override the call's (a backward pass asks
        for return_lse=True)."""
        results = _qkv._sdpa(*(_arrays.detached(x) for x in (self.query, self.key, self.value)),
                             mask=_arrays.detached(self.mask), mask_is_bool=self.mask_is_bool,
                             sinks=_arrays.detached(self.sinks), alibi_slopes=self.alibi_slopes,
                             options=dict(self.options, **options), context=self.context, out_perm=self.out_perm)
        return tuple(_arrays.wrap(r, self.kind) for r in results)


def _check_heads(q, k, enable_gqa):
    """PyTorch's rule: query and key heads (dimension -3) are equal unless enable_gqa=True, when the
    key's divide the query's (qkv checks the division)."""
    if enable_gqa or _arrays.rank(q) < 3 or _arrays.rank(k) < 3:
        return
    hq, hkv = _arrays.shape_of(q)[-3], _arrays.shape_of(k)[-3]
    if hq != hkv:
        raise InvalidArgument(f"query has {hq} heads and key {hkv} (dimension -3): pass enable_gqa=True for "
                              "grouped-query attention")


def _results(kind, out, lse, weights):
    out = _arrays.wrap(out, kind)
    extra = tuple(_arrays.wrap(r, kind) for r in (lse, weights) if r is not None)
    return (out, *extra) if extra else out


def _sdpa_tensors(query, key, value, attn_mask, opts, enable_gqa, alibi_slopes, sinks, device, tensors):
    if not all(tensors):
        raise InvalidArgument("query, key and value must all be qkv.Tensor, or all host arrays")
    if device is not None and device is not query.context:
        raise InvalidArgument("device: calls over qkv.Tensor run on the tensors' Context")
    if not enable_gqa and len(query.shape) >= 3 and len(key.shape) >= 3 and query.shape[-3] != key.shape[-3]:
        raise InvalidArgument(f"query has {query.shape[-3]} heads and key {key.shape[-3]}: pass enable_gqa=True")
    if opts.get("precision") is not None:
        raise InvalidArgument("precision: over qkv.Tensor the tensors' dtype sets it (float32: fp32, float16: fp16)")
    mask, is_bool = mask_kind(attn_mask)
    out, lse, weights = _qkv._sdpa_tensors(query, key, value, mask=mask, mask_is_bool=is_bool,
                                           sinks=small(sinks, "sinks"), alibi_slopes=small(alibi_slopes, "alibi_slopes"),
                                           options=opts)
    extra = tuple(r for r in (lse, weights) if r is not None)
    return (out, *extra) if extra else out


def decode(cache, query, attn_mask=None, *, is_causal=False, scale=None, causal_alignment=BOTTOM_RIGHT, window=None,
           softcap=0.0, alibi_slopes=None, sinks=None, return_lse=False, return_weights=False, precision=None,
           kernel="auto"):
    opts = options(scale=scale, causal=is_causal, alignment=causal_alignment, window=window, softcap=softcap,
                   return_lse=return_lse, return_weights=return_weights, precision=precision, kernel=kernel)
    q = _arrays.host_view(query, "query")
    check_dtypes(q, q, q)
    mask, is_bool = mask_kind(attn_mask)
    out, lse, _ = _qkv._decode(cache, q, mask=mask, mask_is_bool=is_bool, sinks=small(sinks, "sinks"),
                               alibi_slopes=small(alibi_slopes, "alibi_slopes"), options=opts)
    return _results(_arrays.kind_of(q), out, lse, None)
