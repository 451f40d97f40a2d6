"""Every typed C++ error arrives as its Python class with the C++ message, unchanged; real calls
produce each kind; and no input, however wrong, crashes the interpreter (a small fuzz of the
argument parsing: wrong types, dtypes, ranks, shapes, None, huge sizes, views, zero-size arrays)."""

import itertools

import numpy as np
import pytest
import torch

import qkv
from qkv import _qkv

from conftest import needs_vulkan

MAPPING = [
    ("error", qkv.Error, Exception),
    ("invalid_argument", qkv.InvalidArgument, ValueError),
    ("limit_exceeded", qkv.LimitExceeded, ValueError),
    ("numeric_overflow", qkv.NumericOverflow, ArithmeticError),
    ("unavailable", qkv.Unavailable, RuntimeError),
    ("no_matching_device", qkv.NoMatchingDevice, RuntimeError),
    ("device_lost", qkv.DeviceLost, RuntimeError),
    ("out_of_memory", qkv.OutOfMemory, MemoryError),
    ("vulkan::error", qkv.VulkanError, RuntimeError),
]


@pytest.mark.parametrize("kind,cls,builtin", MAPPING)
def test_each_cpp_error_maps_to_its_class_with_its_message(kind, cls, builtin):
    message = f"the {kind} message, verbatim: \u2713 ü"
    with pytest.raises(cls) as info:
        _qkv._raise(kind, message)
    assert type(info.value) is cls and isinstance(info.value, builtin) and isinstance(info.value, qkv.Error)
    assert str(info.value) == message
    assert issubclass(qkv.NoMatchingDevice, qkv.Unavailable)


def test_bad_alloc_and_mpi_errors():
    with pytest.raises(qkv.OutOfMemory):
        _qkv._raise("bad_alloc", "")
    if _qkv._has_mpi:
        from qkv import mpi

        with pytest.raises(mpi.Timeout, match="late") as info:
            _qkv._raise("mpi::timeout", "late")
        assert isinstance(info.value, TimeoutError) and isinstance(info.value, mpi.MPIError)
        with pytest.raises(mpi.MPIError, match="broken"):
            _qkv._raise("mpi::error", "broken")


def small(rng=np.random.default_rng(1), L=3, S=5, E=32):
    return (rng.standard_normal((1, 2, L, E), dtype=np.float32), rng.standard_normal((1, 2, S, E), dtype=np.float32),
            rng.standard_normal((1, 2, S, E), dtype=np.float32))


def test_invalid_argument_carries_the_libraries_message():
    q, k, v = small()
    with pytest.raises(qkv.InvalidArgument, match=r"^sinks has 3 elements, expected one per query head, q_heads = 2"):
        qkv.scaled_dot_product_attention(q, k, v, sinks=[1.0, 2.0, 3.0], device="cpu")
    with pytest.raises(qkv.InvalidArgument, match="window_left must be -1"):
        qkv.scaled_dot_product_attention(q, k, v, window=(-2, 0), device="cpu")
    with pytest.raises(qkv.InvalidArgument, match="softcap must be finite"):
        qkv.scaled_dot_product_attention(q, k, v, softcap=float("nan"), device="cpu")
    with pytest.raises(qkv.InvalidArgument, match="alibi_slopes\\[1\\] is -1"):
        qkv.scaled_dot_product_attention(q, k, v, alibi_slopes=[0.5, -1.0], device="cpu")


@needs_vulkan
def test_real_calls_raise_each_kind():
    q, k, v = small()
    # E = 600 > 576, the fused kernels' widest head
    wide = np.ones((1, 1, 3, 600), np.float32)
    with pytest.raises(qkv.LimitExceeded):
        qkv.scaled_dot_product_attention(wide, wide, wide)
    # scores beyond float32: finite inputs, no finite answer in the precision computed
    with pytest.raises(qkv.NumericOverflow):
        qkv.scaled_dot_product_attention(q * 1e20, k * 1e20, v)
    with pytest.raises(qkv.NumericOverflow):  # beyond float16 storage
        qkv.scaled_dot_product_attention(q * 1e5, k, v, precision="fp16")
    with pytest.raises(qkv.NoMatchingDevice):
        qkv.Context("no device has this name")
    ctx = qkv.Context(_testing={"simulate_device_lost_at_submit": 1})
    with pytest.raises(qkv.DeviceLost):
        qkv.scaled_dot_product_attention(q, k, v, device=ctx)
    with pytest.raises(qkv.DeviceLost):  # and it stays lost
        qkv.scaled_dot_product_attention(q, k, v, device=ctx)
    small_ctx = qkv.Context(memory_limit=1 << 16)
    with pytest.raises(qkv.OutOfMemory):
        qkv.scaled_dot_product_attention(*(np.ones((1, 8, 256, 64), np.float32),) * 3, device=small_ctx)
    # what an entry point does not take is refused from the library's capability table
    cache = qkv.KVCache(None, 1, 2, 8, 32, 32)
    cache.append(k, v)
    with pytest.raises(qkv.InvalidArgument, match="return_weights is not available"):
        cache.decode(q[:, :, :1], return_weights=True)


def test_huge_broadcast_views_are_refused_before_allocating():
    q = np.broadcast_to(np.float32(1), (1 << 20, 1 << 10, 64, 32))  # 2^41 elements, no memory
    with pytest.raises(qkv.OutOfMemory, match="GiB of host memory"):
        qkv.scaled_dot_product_attention(q, q, q, device="cpu")


def fuzz_values():
    """Wrong arguments of every kind, for any argument position."""
    rng = np.random.default_rng(7)
    good = rng.standard_normal((1, 2, 3, 32), dtype=np.float32)
    return [
        None, 1, 2.5, "q", b"bytes", [1.0, 2.0], [[1.0]], object(), {}, np.float32(1.0), np.array(1.0, np.float32),
        np.zeros(5, np.float32), np.zeros((0, 32), np.float32), np.zeros((1, 2, 0, 32), np.float32),
        np.zeros((1, 2, 3, 0), np.float32), good.astype(np.int32), good.astype(np.complex64), good.astype(bool),
        good.astype(np.float64), good.astype(np.uint8), good[..., ::-1], good.transpose(3, 2, 1, 0),
        good[:, :, :, :31], np.broadcast_to(good, (7, 2, 3, 32)), torch.zeros(1, 2, 3, 32, dtype=torch.int64),
        torch.from_numpy(good).to(torch.float16)[..., ::2], torch.zeros(1, 2, 3, 32).to_sparse(),
        torch.zeros(1, 2, 3, 32, dtype=torch.complex64), memoryview(good), memoryview(b"\x00" * 16),
        np.full((1, 2, 3, 32), np.nan, np.float32), np.full((1, 2, 3, 32), np.inf, np.float32),
        np.zeros((2 ** 31, 0), np.float32), good.view([("a", np.float32)]),
    ]


ALLOWED = (qkv.Error, TypeError, NotImplementedError, ValueError)


def test_fuzz_arguments_never_crash():
    """Each wrong value in each of query, key, value, attn_mask, sinks and alibi_slopes, on the
    reference and (where present) the device: an exception of an allowed kind, or a result."""
    rng = np.random.default_rng(7)
    q = rng.standard_normal((1, 2, 3, 32), dtype=np.float32)
    devices = ["cpu"] + ([None] if qkv.devices() else [])
    calls = 0
    for value, position, device in itertools.product(fuzz_values(), range(6), devices):
        args = [q, q, q]
        kw = {"device": device}
        if position < 3:
            args[position] = value
        else:
            kw[("attn_mask", "sinks", "alibi_slopes")[position - 3]] = value
        try:
            qkv.scaled_dot_product_attention(*args, **kw)
        except ALLOWED:
            pass
        calls += 1
    assert calls == len(fuzz_values()) * 6 * len(devices)


def test_fuzz_options_never_crash():
    q = np.random.default_rng(8).standard_normal((1, 2, 3, 32), dtype=np.float32)
    bad = {
        "dropout_p": [0.5, "0", None, float("nan")], "is_causal": [1, None, "yes"], "scale": ["1", float("inf"), 1e300,
                                                                                           -1e-300],
        "enable_gqa": [1, None], "window": [(1,), (1, 2, 3), ("a", 1), (2 ** 70, 0), (True, 1), 5],
        "softcap": [-1.0, "1", float("inf")], "causal_alignment": ["middle", 0, None], "kv_type": ["f8", 8],
        "precision": ["fp8", 16], "kernel": ["npu", None], "return_lse": [1], "device": [-1, 99, "no such device",
                                                                                         3.5, True, object()],
    }
    for name, values in bad.items():
        for value in values:
            try:
                qkv.scaled_dot_product_attention(q, q, q, **{name: value})
            except ALLOWED:
                pass


def test_dunder_dlpack_that_lies():
    class Liar:
        def __dlpack__(self, stream=None):
            return "not a capsule"

    class Raiser:
        def __dlpack__(self, stream=None):
            raise RuntimeError("no")

    for obj in (Liar(), Raiser()):
        with pytest.raises((TypeError, qkv.InvalidArgument)):
            qkv.scaled_dot_product_attention(obj, obj, obj, device="cpu")


def test_cuda_like_and_grad_inputs_are_named():
    q = torch.zeros(1, 2, 3, 32, requires_grad=True)
    # No gradient flows to ALiBi's slopes (a constant bias): refused, naming them (the mask's and
    # the sinks' gradients are test_autograd.py's).
    with pytest.raises(NotImplementedError, match="alibi_slopes.requires_grad"):
        qkv.scaled_dot_product_attention(q, q, q, alibi_slopes=torch.ones(2, requires_grad=True), device="cpu")
    with pytest.raises(qkv.InvalidArgument, match="dropout_p=1"):
        qkv.scaled_dot_product_attention(q, q, q, dropout_p=1.0, device="cpu")
    with pytest.raises(qkv.InvalidArgument, match="meta"):
        m = torch.zeros(1, 2, 3, 32, device="meta")
        qkv.scaled_dot_product_attention(m, m, m, device="cpu")
