"""Where a call runs: the `device=` argument of every call resolved to a qkv.Context, or to None
for the float64 reference on the host ("cpu"). Contexts are made once per device and shared; the
default one (device=None) is made on first use."""

import threading

from . import _qkv
from ._errors import InvalidArgument, Unavailable

_lock = threading.Lock()
_contexts = {}  # the key a device= argument names -> its Context


def default_context():
    """The Context that calls without device= use, made on first use: the device QKV_DEVICE names,
    else the best one. Raises qkv.Unavailable without Vulkan (device="cpu" still works)."""
    return _context_for(None)


def _context_for(key):
    with _lock:
        ctx = _contexts.get(key)
        if ctx is None:
            try:
                ctx = _qkv.Context(key)
            except Unavailable as e:
                if key is None and type(e) is Unavailable:
                    raise Unavailable(f"{e}\nqkv: pass device=\"cpu\" to use the float64 reference on the host instead") from None
                raise
            _contexts[key] = ctx
        return ctx


def resolve(device):
    """None -> the default context; "cpu" -> None (the float64 reference); a qkv.Context -> itself;
    a qkv.Device, an index or a part of a device's name -> that device's shared context."""
    if device is None:
        return default_context()
    if isinstance(device, _qkv.Context):
        return device
    if isinstance(device, str):
        if device == "cpu":
            return None
        return _context_for(device)
    if isinstance(device, _qkv.Device):
        return _context_for(str(device.index))
    if isinstance(device, bool) or not isinstance(device, int):
        raise TypeError(f"device: a {type(device).__name__} is not a device "
                        "(None, \"cpu\", an index, a name, a qkv.Device or a qkv.Context)")
    if device < 0:
        raise InvalidArgument(f"device: index {device} is negative")
    return _context_for(str(device))
