"""qkv: transformer attention on any Vulkan GPU (or Mesa's lavapipe on a CPU), with a float64
reference on the host.

    import qkv
    qkv.devices()                                          # the Vulkan devices ([] without Vulkan)
    out = qkv.scaled_dot_product_attention(q, k, v, is_causal=True)      # PyTorch's call
    from qkv.flash_attn import flash_attn_func             # FlashAttention's calls
    ref = qkv.scaled_dot_product_attention(q, k, v, device="cpu")       # the float64 reference

Arrays are numpy arrays or CPU torch tensors of float32, float16 or bfloat16 (torch), and float64
with device="cpu"; results come back as the same kind and dtype. Importing qkv needs neither numpy
nor torch, and no Vulkan: qkv.devices() is then [] and device="cpu" works.
"""

from . import _qkv
from ._devices import default_context
from ._errors import (DeviceLost, Error, InvalidArgument, LimitExceeded, NoMatchingDevice, NumericOverflow,
                      OutOfMemory, Unavailable, VulkanError)
from ._qkv import Context, Device, Tensor, devices
from ._paged import PagedKVCache
from . import _arrays, _devices, _sdpa

__version__ = _qkv.__version__

__all__ = [
    "scaled_dot_product_attention", "devices", "Device", "Context", "default_context", "Tensor", "tensor", "KVCache",
    "PagedKVCache", "paged_attention",
    "alibi_slopes", "Error", "InvalidArgument", "LimitExceeded", "NumericOverflow", "Unavailable",
    "NoMatchingDevice", "DeviceLost", "OutOfMemory", "VulkanError", "__version__", "flash_attn", "mpi", "tutorial",
]


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False, *, device=None, precision=None, window=None, softcap=0.0,
                                 alibi_slopes=None, sinks=None, causal_alignment="top_left", kv_type=None,
                                 return_lse=False, return_weights=False, kernel="auto"):
    """PyTorch's torch.nn.functional.scaled_dot_product_attention, computed by qkv.

    Shapes (PyTorch's): query (N..., Hq, L, E), key (N..., Hkv, S, E), value (N..., Hkv, S, Ev) ->
    output (N..., Hq, L, Ev). The batch dimensions N... (any number, also none: (H, L, E), or
    (L, E)) must be equal in query, key and value. Hkv = Hq, or with enable_gqa=True any Hkv that
    divides Hq: query head h reads key/value head h // (Hq // Hkv).

    attn_mask: bool (True = may attend) or floating point (added to the scaled scores; -inf masks),
    of any shape that broadcasts to (N..., Hq, L, S). is_causal keeps key j for query i when
    j <= i (top-left, PyTorch's tril(ones(L, S))); causal_alignment="bottom_right" puts the
    diagonal at j <= i + S - L instead (the K/V-cache convention). scale: default 1/sqrt(E).
    dropout_p: attention dropout (kept weights scaled by 1/(1 - p)), its Philox seed drawn from
    torch's default generator, so torch.manual_seed(s) before a call reproduces it. Torch inputs
    that require grad (with grad enabled) record a graph: .backward() runs qkv's backward pass on
    the same device (with the forward's dropout mask) and gives query, key and value their
    gradients; a mask, sinks or slopes that require grad are refused (NotImplementedError).

    Where qkv differs from PyTorch, deliberately:
      - is_causal together with attn_mask is allowed and combines them by AND (PyTorch raises);
      - a query row left with no key to attend to gets a zero output (PyTorch: NaN), and lse -inf;
      - zero-size dimensions are refused (qkv.InvalidArgument; PyTorch returns an empty result).

    qkv's options (keyword-only):
      device: None (the default Context: QKV_DEVICE, else the best Vulkan device), "cpu" (the
        float64 reference on the host: every input widened exactly, computed in float64, rounded
        once to the result's dtype), a qkv.Device, an index, a part of a device name, or a Context.
      precision: "fp32" or "fp16", how query, key and value are stored on the device (arithmetic
        and accumulation are float32 either way). Default: "fp16" for float16 inputs where the
        device has 16-bit storage (exact: they are float16), else "fp32". bfloat16 inputs are
        widened to float32 exactly and computed as float32; the result is rounded to bfloat16.
      window=(left, right): key j is kept only when i + off - left <= j <= i + off + right (off = 0,
        or S - L with causal_alignment="bottom_right"); -1 leaves a side unbounded.
      softcap=C: each scaled score s becomes C * tanh(s / C) (0: off), before ALiBi and the mask.
      alibi_slopes: (Hq,) slopes; score -= slope[h] * |i + off - j|.
      sinks: (Hq,) logits, one per query head, that join each row's softmax denominator and attend
        to nothing (the weights of a row then sum to less than 1).
      kv_type: "f32", "f16", "q8_0" or "q4_0": how K and V are stored on the device (E and Ev
        multiples of 32 for the last two); on device="cpu" the reference computes from K and V
        rounded the same way.
      return_lse=True: also the log-sum-exp of each row, float32 (N..., Hq, L), sinks not included,
        -inf for a row with no key. return_weights=True: also the attention weights (N..., Hq, L, S).
      kernel: "auto", "row_tiles", "block_tiles" or "coopmat" (the matrix units, fp16 only): which
        kernel family runs (the same results up to rounding; "cpu" and "gpu" are the deprecated names
        of the first two).

    Returns the output, of the inputs' kind (numpy or torch) and dtype; with return_lse and/or
    return_weights the tuple (output, lse, weights), leaving out what was not asked for.

    Over qkv.Tensor inputs (all three) the call stays on the device and returns a float32 Tensor
    (N, Hq, L, Ev), and with return_lse / return_weights float32 Tensors (N, Hq, L) / (N, Hq, L, S).

    Errors: qkv.InvalidArgument (ValueError) for inputs that do not fit, qkv.LimitExceeded for
    shapes beyond the device's limits, qkv.NumericOverflow for finite inputs whose scores or
    results leave the computed precision, qkv.Unavailable without Vulkan (use device="cpu"),
    qkv.OutOfMemory, qkv.DeviceLost; each with the library's message.
    """
    return _sdpa.sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, device=device,
                      precision=precision, window=window, softcap=softcap, alibi_slopes=alibi_slopes, sinks=sinks,
                      causal_alignment=causal_alignment, kv_type=kv_type, return_lse=return_lse,
                      return_weights=return_weights, kernel=kernel)


def tensor(array, context=None, dtype=None):
    """Uploads `array` (any shape, numpy or torch) to a device: a qkv.Tensor of float32, or of
    float16 for a float16 array (dtype="float32" or "float16" to choose; bfloat16 becomes float32),
    or of int32 for an integer array (indices, such as a block table on the device): int32, or
    int64 (numpy's default integer) where every value fits int32 (else InvalidArgument; nothing is
    made). Integer and floating-point arrays and tensors do not mix (InvalidArgument). context: a
    qkv.Context, or None for the default one. Tensor.numpy() downloads it, Tensor.upload(array)
    overwrites it."""
    ctx = _devices.resolve(context) if not isinstance(context, Context) else context
    if ctx is None:
        raise InvalidArgument("context: a qkv.Tensor lives on a Vulkan device, not on \"cpu\"")
    return _qkv._tensor(_arrays.host_view(array, "array"), ctx, dtype)


def _tensor_numpy(self):
    """The tensor's values as a numpy array of its dtype (float32, float16 or int32); waits for the
    device."""
    return _arrays.wrap(self._download(), _arrays.NUMPY)


def _tensor_upload(self, array):
    """Overwrites the tensor's values in place with `array` (numpy or torch) of its shape, converted
    as qkv.tensor converts (int32 tensors take int32, or int64 within int32's range); calls given
    the tensor afterwards read the new values. Checked before anything is written
    (InvalidArgument)."""
    self._upload(_arrays.host_view(array, "array"))


Tensor.numpy = _tensor_numpy
Tensor.upload = _tensor_upload


class KVCache:
    """Keys and values kept on a device across calls, for decoding: qkv::vulkan::kv_cache.

    KVCache(context, batch, kv_heads, capacity, d_qk, d_v, kv_type="f32"): room for `capacity`
    rows (keys) per (batch, kv head); kv_type "f32", "f16", "q8_0" or "q4_0" (ggml's blocks,
    quantized on append; d_qk and d_v multiples of 32). context None: the default Context.
    """

    def __init__(self, context, batch, kv_heads, capacity, d_qk, d_v, kv_type="f32"):
        ctx = _devices.resolve(context) if not isinstance(context, Context) else context
        if ctx is None:
            raise InvalidArgument("context: a KVCache lives on a Vulkan device, not on \"cpu\"")
        for name, n in (("batch", batch), ("kv_heads", kv_heads), ("capacity", capacity), ("d_qk", d_qk),
                        ("d_v", d_v)):
            if isinstance(n, bool) or not isinstance(n, int):
                raise TypeError(f"{name} must be an int (it is a {type(n).__name__})")
            if n < 0:
                raise InvalidArgument(f"{name} is {n}: it must not be negative")
        self._cache = _qkv._KVCache(ctx, batch, kv_heads, capacity, d_qk, d_v, kv_type)

    def append(self, key, value):
        """Appends rows: key (B, Hkv, rows, E) and value (B, Hkv, rows, Ev), host arrays or qkv.Tensor
        (f32 or f16 caches). Past the capacity raises qkv.LimitExceeded and appends nothing."""
        if not isinstance(key, Tensor):
            key = _arrays.host_view(key, "key")
        if not isinstance(value, Tensor):
            value = _arrays.host_view(value, "value")
        _qkv._cache_append(self._cache, key, value)

    def decode(self, query, attn_mask=None, *, is_causal=False, scale=None, causal_alignment="bottom_right",
               window=None, softcap=0.0, alibi_slopes=None, sinks=None, return_lse=False, return_weights=False,
               precision=None, kernel="auto"):
        """Attention of query (B, Hq, L, E) (or (Hq, L, E), (L, E)) against every row held: output
        (B, Hq, L, Ev), of the query's kind and dtype, with the options of
        scaled_dot_product_attention (causal_alignment defaults to "bottom_right" here: the last
        query sits at the last key). Runs the split-S decode kernels."""
        return _sdpa.decode(self._cache, query, attn_mask, is_causal=is_causal, scale=scale,
                            causal_alignment=causal_alignment, window=window, softcap=softcap,
                            alibi_slopes=alibi_slopes, sinks=sinks, return_lse=return_lse,
                            return_weights=return_weights, precision=precision, kernel=kernel)

    def clear(self):
        """Forgets every row (the memory is kept)."""
        self._cache.clear()

    @property
    def size(self):
        """Rows held per (batch, kv head)."""
        return self._cache.size

    @property
    def capacity(self):
        return self._cache.capacity

    @property
    def kv_type(self):
        return self._cache.kv_type

    @property
    def context(self):
        return self._cache.context

    def __len__(self):
        return self._cache.size

    def __repr__(self):
        return f"qkv.KVCache(size={self.size}, capacity={self.capacity}, kv_type={self.kv_type!r})"


def paged_attention(q, cache, block_table, cache_seqlens, k=None, v=None, *, rotary_cos=None, rotary_sin=None,
                    rotary_interleaved=True, cache_batch_idx=None, cache_leftpad=None, softmax_scale=None,
                    causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, return_softmax_lse=False):
    """A batch of sequences decoding against a qkv.PagedKVCache, in FlashAttention's layout: q
    (batch, seqlen_q, nheads, headdim); block_table int32 (batch, max_pages) page indices (key j
    of sequence b is row j % page_size of page block_table[b][j // page_size]; with
    cache_batch_idx, a table of any number of rows and sequence b's row cache_batch_idx[b]), a
    host array or an int32 qkv.Tensor on the cache's Context (never read back: its entries are
    checked on the device, a bad one, or two new rows bound for one row of the pool,
    InvalidArgument after the run, nothing appended);
    cache_seqlens int32 (batch,) or an int, the keys each sequence has before the call (or an int32
    qkv.Tensor (batch,) on the cache's Context, read on the device when the call runs: a bad length
    is InvalidArgument after the run, nothing appended; see flash_attn_with_kvcache); k, v
    (batch, seqlen_new, kv_heads, ·), written into each sequence's pages at keys cache_seqlens[b]
    onwards before any sequence attends. Every other argument and the result are
    qkv.flash_attn.flash_attn_with_kvcache's (this is flash_attn_with_kvcache(q, cache=cache, ...)):
    out (batch, seqlen_q, nheads, head_dim_v), of q's kind and dtype, and with
    return_softmax_lse=True softmax_lse (batch, nheads, seqlen_q) float32. The caller advances its
    cache_seqlens by seqlen_new afterwards, as with FlashAttention."""
    return flash_attn.flash_attn_with_kvcache(
        q, k=k, v=v, rotary_cos=rotary_cos, rotary_sin=rotary_sin, cache_seqlens=cache_seqlens,
        cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad, block_table=block_table,
        softmax_scale=softmax_scale, causal=causal, window_size=window_size, softcap=softcap,
        rotary_interleaved=rotary_interleaved, alibi_slopes=alibi_slopes, return_softmax_lse=return_softmax_lse,
        cache=cache)


def alibi_slopes(heads, max_bias=8.0):
    """ALiBi's slopes for `heads` query heads (a list of floats): the geometric sequence of the ALiBi
    paper and ggml for max_bias (8 in the paper): with n = 2^floor(log2 heads), m0 = 2^(-max_bias/n),
    m1 = 2^(-max_bias/(2n)), head h has m0^(h+1) for h < n, else m1^(2(h-n)+1). Pass them as
    alibi_slopes= to scaled_dot_product_attention or flash_attn_func."""
    return list(_qkv._alibi_slopes(heads, max_bias))


# The submodules, reachable as attributes after `import qkv` (each imports nothing beyond qkv).
from . import flash_attn, mpi, tutorial
