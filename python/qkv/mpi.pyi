# Type stubs of qkv.mpi (the implementation: mpi.py).
from typing import Any, Literal, Optional, Sequence, Tuple, Union

from . import Context, Device
from ._errors import MPIError as MPIError, Timeout as Timeout

Array = Any
available: bool

def slice_of(length: int, ranks: int, rank: int, layout: Literal["zigzag", "contiguous"] = "zigzag") -> list[range]: ...
def take(array: Array, axis: int, rows: Sequence[range]) -> Any: ...
def timed_out() -> bool: ...
def sdpa(comm: Any, query: Array, key: Array, value: Array, attn_mask: Optional[Array] = None, *,
         q_len: Optional[int] = None, kv_len: Optional[int] = None, is_causal: bool = False,
         scale: Optional[float] = None, causal_alignment: Literal["top_left", "bottom_right"] = "top_left",
         window: Optional[Tuple[int, int]] = None, softcap: float = 0.0,
         sinks: Union[None, Array, Sequence[float]] = None,
         kv_type: Optional[Literal["f32", "f16", "q8_0", "q4_0"]] = None, return_lse: bool = False,
         precision: Optional[Literal["fp32", "fp16"]] = None, mode: Literal["ring", "allgather"] = "ring",
         layout: Literal["zigzag", "contiguous"] = "zigzag", timeout: Optional[float] = None,
         device: Union[None, Literal["cpu"], str, int, Device, Context] = None) -> Any: ...
