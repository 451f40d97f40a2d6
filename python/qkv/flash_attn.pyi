# Type stubs of qkv.flash_attn (FlashAttention 2's interface; the implementation: flash_attn.py).
from typing import Any, Literal, Optional, Tuple, Union

from . import Context, Device, PagedKVCache, Tensor

Array = Any
DeviceArg = Union[None, Literal["cpu"], str, int, Device, Context]

def flash_attn_func(q: Array, k: Array, v: Array, dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                    causal: bool = False, window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                    alibi_slopes: Optional[Array] = None, deterministic: bool = False,
                    return_attn_probs: bool = False, *, device: DeviceArg = None,
                    precision: Optional[Literal["fp32", "fp16"]] = None) -> Any: ...
def flash_attn_qkvpacked_func(qkv: Array, dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                              causal: bool = False, window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                              alibi_slopes: Optional[Array] = None, deterministic: bool = False,
                              return_attn_probs: bool = False, *, device: DeviceArg = None,
                              precision: Optional[Literal["fp32", "fp16"]] = None) -> Any: ...
def flash_attn_kvpacked_func(q: Array, kv: Array, dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                             causal: bool = False, window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                             alibi_slopes: Optional[Array] = None, deterministic: bool = False,
                             return_attn_probs: bool = False, *, device: DeviceArg = None,
                             precision: Optional[Literal["fp32", "fp16"]] = None) -> Any: ...
def flash_attn_varlen_func(q: Array, k: Array, v: Array, cu_seqlens_q: Array, cu_seqlens_k: Array, max_seqlen_q: int,
                           max_seqlen_k: int, dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                           causal: bool = False, window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                           alibi_slopes: Optional[Array] = None, deterministic: bool = False,
                           return_attn_probs: bool = False, block_table: Optional[Array] = None, *,
                           device: DeviceArg = None, precision: Optional[Literal["fp32", "fp16"]] = None) -> Any: ...
def flash_attn_varlen_qkvpacked_func(qkv: Array, cu_seqlens: Array, max_seqlen: int, dropout_p: float = 0.0,
                                     softmax_scale: Optional[float] = None, causal: bool = False,
                                     window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                                     alibi_slopes: Optional[Array] = None, deterministic: bool = False,
                                     return_attn_probs: bool = False, *, device: DeviceArg = None,
                                     precision: Optional[Literal["fp32", "fp16"]] = None) -> Any: ...
def flash_attn_varlen_kvpacked_func(q: Array, kv: Array, cu_seqlens_q: Array, cu_seqlens_k: Array,
                                    max_seqlen_q: int, max_seqlen_k: int, dropout_p: float = 0.0,
                                    softmax_scale: Optional[float] = None, causal: bool = False,
                                    window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                                    alibi_slopes: Optional[Array] = None, deterministic: bool = False,
                                    return_attn_probs: bool = False, *, device: DeviceArg = None,
                                    precision: Optional[Literal["fp32", "fp16"]] = None) -> Any: ...
def flash_attn_with_kvcache(q: Array, k_cache: Union[None, Array, PagedKVCache] = None,
                            v_cache: Union[None, Array, PagedKVCache] = None, k: Optional[Array] = None,
                            v: Optional[Array] = None, rotary_cos: Optional[Array] = None,
                            rotary_sin: Optional[Array] = None, cache_seqlens: Union[None, int, Array, Tensor] = None,
                            cache_batch_idx: Optional[Array] = None, cache_leftpad: Optional[Array] = None,
                            block_table: Union[None, Array, Tensor] = None, softmax_scale: Optional[float] = None,
                            causal: bool = False, window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                            rotary_interleaved: bool = True, alibi_slopes: Optional[Array] = None,
                            num_splits: int = 0, return_softmax_lse: bool = False, *,
                            cache: Optional[PagedKVCache] = None, device: DeviceArg = None,
                            precision: Optional[Literal["fp32", "fp16"]] = None) -> Any: ...
