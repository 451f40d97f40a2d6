"""Arrays in and out: which kind the caller passed (numpy or torch), their dtypes, views that
reorder dimensions without copying, and the results wrapped as the caller's kind without copying.

Neither numpy nor torch is imported here: an array of either kind can only exist when its module
is loaded, so sys.modules tells."""

import sys

from ._errors import InvalidArgument

NUMPY, TORCH, BUFFER = "numpy", "torch", "buffer"


def _torch():
    return sys.modules.get("torch")


def _numpy():
    return sys.modules.get("numpy")


def kind_of(x):
    """numpy, torch, or buffer (anything else with the buffer protocol or __dlpack__)."""
    torch = _torch()
    if torch is not None and isinstance(x, torch.Tensor):
        return TORCH
    np = _numpy()
    if np is not None and isinstance(x, np.ndarray):
        return NUMPY
    return BUFFER


def dtype_name(x):
    """'float32', 'float16', 'bfloat16', 'float64', 'bool', ... of a numpy array or torch tensor."""
    kind = kind_of(x)
    if kind == TORCH:
        return str(x.dtype).replace("torch.", "")
    if kind == NUMPY:
        return x.dtype.name
    return None


FLOATS = ("float32", "float16", "bfloat16", "float64")


def check_grad(x, name):
    """A torch tensor that would record a graph, given where no gradient flows (masks, sinks,
    slopes, cache rows, uploads): refused, never a silent no-op. Query, key and value are
    _autograd.run's to decide about."""
    torch = _torch()
    if torch is not None and isinstance(x, torch.Tensor) and x.requires_grad and torch.is_grad_enabled():
        raise NotImplementedError(
            f"{name}.requires_grad: no gradient flows to {name} here (qkv's gradients reach query, key and value, "
            f"and scaled_dot_product_attention's floating attn_mask and sinks over host arrays); pass "
            f"{name}.detach()")


def host_array(x, name):
    """An argument checked to be an array qkv can read (not None; a torch tensor on the CPU), as it
    is: a torch tensor keeps its autograd history, for _autograd.run to decide about."""
    if x is None:
        raise TypeError(f"{name} is None; an array (numpy.ndarray or torch.Tensor) is needed")
    if kind_of(x) == TORCH and x.device.type != "cpu":
        raise InvalidArgument(
            f"{name} is on {x.device}: qkv reads host memory and runs on its own Vulkan device; pass {name}.cpu()")
    return x


def detached(x):
    """The array qkv reads: a torch tensor detached (a view, no copy); anything else as it is."""
    return x.detach() if kind_of(x) == TORCH else x


def host_view(x, name):
    """The array qkv reads, for arguments no gradient can flow to: checked as host_array does,
    refused (NotImplementedError) where it would record a graph, and detached."""
    x = host_array(x, name)
    check_grad(x, name)
    return detached(x)


def permute(x, order):
    """A view of x with its dimensions in `order` (numpy transpose, torch permute): no copy."""
    if kind_of(x) == TORCH:
        return x.permute(*order)
    return x.transpose(order)


def select(x, axis, index):
    """x[..., index, ...] along `axis`, a view."""
    key = (slice(None),) * axis + (index,)
    return x[key]


def select_range(x, axis, start, stop):
    """x[..., start:stop, ...] along `axis`, a view."""
    key = (slice(None),) * axis + (slice(start, stop),)
    return x[key]


def rank(x):
    shape = getattr(x, "shape", None)
    if shape is None:
        try:
            shape = memoryview(x).shape
        except TypeError:
            raise TypeError(f"a {type(x).__name__} is not an array; pass a numpy.ndarray or a CPU torch.Tensor")
    return len(shape)


def shape_of(x):
    shape = getattr(x, "shape", None)
    if shape is None:
        shape = memoryview(x).shape
    return tuple(int(d) for d in shape)


_TORCH_DTYPES = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16", "float64": "float64",
                 "int32": "int32"}


def wrap(result, kind):
    """A qkv result (_qkv._Array, which owns its memory) as the caller's kind: a numpy array or a torch
    tensor over the same memory (no copy); for other callers a numpy array where numpy is installed,
    else the _Array itself (it has the buffer protocol, .shape and .dtype)."""
    if result is None:
        return None
    if kind == TORCH:
        torch = _torch()
        dtype = getattr(torch, _TORCH_DTYPES[result.dtype])
        shape = result.shape
        count = 1
        for d in shape:
            count *= d
        if count == 0:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(result, dtype=dtype).reshape(shape)
    np = _numpy()
    if np is None:
        try:
            import numpy as np  # noqa: F811 - a buffer caller may still have numpy installed
        except ImportError:
            return result
    if result.dtype == "bfloat16":
        raise InvalidArgument("a bfloat16 result can only be returned as a torch tensor (numpy has no bfloat16)")
    return np.asarray(result)
