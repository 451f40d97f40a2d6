"""qkv.devices(), qkv.Device, qkv.Context (and the lazily made default), qkv.Tensor (data kept on
the device between calls) and qkv.KVCache (append, decode), against the host calls and the float64
reference."""

import numpy as np
import pytest
import torch

import qkv

from conftest import needs_vulkan, nmse, sdpa_reference

pytestmark = needs_vulkan


def normal(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def test_devices_and_contexts():
    devices = qkv.devices()
    d = devices[0]
    assert isinstance(d, qkv.Device) and d.index == 0 and d.name and d.type in (
        "discrete GPU", "integrated GPU", "virtual GPU", "CPU", "other")
    assert d.api_version.count(".") == 2 and d.subgroup_size > 0 and isinstance(d.fp16_storage, bool)
    assert "qkv.Device(0" in repr(d)
    assert qkv.default_context() is qkv.default_context()  # made once, on first use
    ctx = qkv.Context(d)
    assert ctx.device.index == 0 and ctx.device.name == d.name
    assert qkv.Context(0).device.name == d.name
    assert ctx.take_validation_messages() == []


def test_tensors_keep_data_on_the_device(rng):
    ctx = qkv.default_context()
    q, k, v = normal(rng, 1, 4, 3, 32), normal(rng, 1, 2, 300, 32), normal(rng, 1, 2, 300, 32)
    tq, tk, tv = (qkv.tensor(x, ctx) for x in (q, k, v))
    assert tq.shape == (1, 4, 3, 32) and tq.dtype == "float32" and tq.nbytes == q.nbytes
    assert np.array_equal(tq.numpy(), q)  # upload, download: the same values
    out = qkv.scaled_dot_product_attention(tq, tk, tv, is_causal=True, causal_alignment="bottom_right",
                                           enable_gqa=True, window=(100, 0))
    assert isinstance(out, qkv.Tensor) and out.shape == (1, 4, 3, 32)
    host = qkv.scaled_dot_product_attention(q, k, v, is_causal=True, causal_alignment="bottom_right",
                                            enable_gqa=True, window=(100, 0))
    want = sdpa_reference(q, k, v, is_causal=True, alignment="bottom_right", enable_gqa=True, window=(100, 0))
    assert nmse(out.numpy(), want) <= 1e-9 and nmse(host, want) <= 1e-9
    t_out, t_lse = qkv.scaled_dot_product_attention(tq, tk, tv, is_causal=True, causal_alignment="bottom_right",
                                                    enable_gqa=True, window=(100, 0), return_lse=True)
    _, host_lse = qkv.scaled_dot_product_attention(q, k, v, is_causal=True, causal_alignment="bottom_right",
                                                   enable_gqa=True, window=(100, 0), return_lse=True)
    assert t_lse.shape == (1, 4, 3) and np.abs(t_lse.numpy() - host_lse).max() < 1e-5
    # float16 tensors run with fp16 storage; torch arrays upload too
    h = [qkv.tensor(torch.from_numpy(x).half(), ctx) for x in (q, k, v)]
    assert h[0].dtype == "float16" and h[0].numpy().dtype == np.float16
    out16 = qkv.scaled_dot_product_attention(*h, enable_gqa=True)
    want16 = sdpa_reference(*(x.numpy() for x in h), enable_gqa=True)
    assert nmse(out16.numpy(), want16) <= 1e-6
    with pytest.raises(qkv.InvalidArgument, match="all be qkv.Tensor"):
        qkv.scaled_dot_product_attention(tq, k, v)
    with pytest.raises(qkv.InvalidArgument, match="heads"):
        qkv.scaled_dot_product_attention(tq, tk, tv)  # 4 query heads, 2 key heads, no enable_gqa
    with pytest.raises(qkv.InvalidArgument, match="cpu"):
        qkv.tensor(q, "cpu")
    # upload overwrites in place: a float16 tensor rounds, and refuses a value past float16's range
    h[0].upload(q * 3)
    assert np.array_equal(h[0].numpy(), (q * 3).astype(np.float16))
    with pytest.raises(qkv.NumericOverflow):
        h[0].upload(np.full(q.shape, 1e6, dtype=np.float32))
    assert np.array_equal(h[0].numpy(), (q * 3).astype(np.float16))


@pytest.mark.parametrize("shape", [(1,), (3,), (17,), (3, 17), (1, 3, 17)])
def test_int32_tensors_round_trip(rng, shape):
    ctx = qkv.default_context()
    a = rng.integers(-2**31, 2**31, size=shape, dtype=np.int64).astype(np.int32)
    a.flat[0] = np.iinfo(np.int32).min  # both ends of the range, exactly
    a.flat[-1] = np.iinfo(np.int32).max if a.size > 1 else a.flat[0]
    t = qkv.tensor(a, ctx)
    assert t.dtype == "int32" and t.shape == shape and t.nbytes == a.nbytes
    back = t.numpy()
    assert back.dtype == np.int32 and np.array_equal(back, a)
    # a strided view and a torch tensor upload the same values
    assert np.array_equal(qkv.tensor(np.ascontiguousarray(a[..., ::-1])[..., ::-1], ctx).numpy(), a)
    assert np.array_equal(qkv.tensor(torch.from_numpy(a), ctx).numpy(), a)
    # upload overwrites in place; another shape or a float array is refused, and nothing changes
    b = (a // 7 + 1).astype(np.int32)
    t.upload(b)
    assert np.array_equal(t.numpy(), b)
    with pytest.raises(qkv.InvalidArgument, match="shape"):
        t.upload(np.zeros(shape + (2,), dtype=np.int32))
    with pytest.raises(qkv.InvalidArgument, match="int32"):
        t.upload(b.astype(np.float32))
    assert np.array_equal(t.numpy(), b)


def test_int64_arrays_make_int32_tensors_only_where_no_value_is_lost():
    ctx = qkv.default_context()
    ok = np.array([[0, 5, -3], [2**31 - 1, -2**31, 17]])  # numpy's default integer: int64
    assert ok.dtype == np.int64
    t = qkv.tensor(ok, ctx)
    assert t.dtype == "int32" and np.array_equal(t.numpy(), ok)
    assert np.array_equal(qkv.tensor(torch.from_numpy(ok), ctx).numpy(), ok)  # torch.int64 through DLPack
    for bad in (2**31, -2**31 - 1, 2**40):
        x = ok.copy()
        x[1, 2] = bad
        with pytest.raises(qkv.InvalidArgument, match="outside int32's range"):
            qkv.tensor(x, ctx)
        with pytest.raises(qkv.InvalidArgument, match="outside int32's range"):
            t.upload(x)
        assert np.array_equal(t.numpy(), ok)  # a refused upload writes nothing
    with pytest.raises(qkv.InvalidArgument, match="int32"):
        qkv.tensor(ok, ctx, dtype="float32")  # integers are not floating-point data
    with pytest.raises(qkv.InvalidArgument, match="int32"):
        qkv.tensor(np.ones(3, dtype=np.float32), ctx, dtype="int32")
    with pytest.raises(qkv.InvalidArgument, match="bool"):
        qkv.tensor(np.ones(3, dtype=bool), ctx)


def test_int32_data_is_refused_where_floats_are_needed(rng):
    ctx = qkv.default_context()
    ints = np.arange(2 * 3 * 17, dtype=np.int32).reshape(1, 2, 3, 17)
    ti, tf = qkv.tensor(ints, ctx), qkv.tensor(normal(rng, 1, 2, 3, 17), ctx)
    for args in ((ti, tf, tf), (tf, ti, tf), (tf, tf, ti), (ti, ti, ti)):
        with pytest.raises(qkv.InvalidArgument, match="i32|int32"):
            qkv.scaled_dot_product_attention(*args)
    cache = qkv.KVCache(ctx, 1, 2, 8, 17, 17)
    with pytest.raises(qkv.InvalidArgument, match="i32"):
        cache.append(ti, ti)
    assert len(cache) == 0
    with pytest.raises(qkv.InvalidArgument, match="int32"):
        qkv.scaled_dot_product_attention(ints, ints, ints)
    f = normal(rng, 1, 2, 3, 17)
    with pytest.raises(qkv.InvalidArgument, match="int"):
        qkv.scaled_dot_product_attention(f, f, f, alibi_slopes=np.ones(2, dtype=np.int64))
    with pytest.raises(qkv.InvalidArgument, match="int32"):
        qkv.flash_attn.flash_attn_func(ints, ints, ints)


def test_kv_cache_decode_equals_the_whole_call(rng):
    ctx = qkv.default_context()
    B, Hq, Hkv, S, E = 2, 8, 2, 1100, 64
    k, v = normal(rng, B, Hkv, S, E), normal(rng, B, Hkv, S, E)
    cache = qkv.KVCache(ctx, B, Hkv, 2048, E, E)
    assert len(cache) == 0 and cache.capacity == 2048 and cache.kv_type == "f32"
    cache.append(k[:, :, :700], v[:, :, :700])
    cache.append(torch.from_numpy(k[:, :, 700:]), torch.from_numpy(v[:, :, 700:]))
    assert cache.size == S
    for L in (1, 3):
        q = normal(rng, B, Hq, L, E)
        out, lse = cache.decode(q, is_causal=True, return_lse=True)
        want, want_lse, _ = sdpa_reference(q, k, v, is_causal=True, alignment="bottom_right", enable_gqa=True,
                                           return_lse=True)
        assert nmse(out, want) <= 1e-9 and np.abs(lse - want_lse).max() < 1e-4
    # device tensors appended on the device
    cache.clear()
    cache.append(qkv.tensor(k, ctx), qkv.tensor(v, ctx))
    q = normal(rng, B, Hq, 1, E)
    assert nmse(cache.decode(q), sdpa_reference(q, k, v, enable_gqa=True)) <= 1e-9
    with pytest.raises(qkv.LimitExceeded):
        cache.append(k, v)  # 1100 + 1100 > 2048: nothing appended
    assert cache.size == S


def test_quantized_cache(rng):
    cache = qkv.KVCache(None, 1, 2, 64, 32, 32, "q8_0")
    k, v = normal(rng, 1, 2, 40, 32), normal(rng, 1, 2, 40, 32)
    cache.append(k, v)
    q = normal(rng, 1, 2, 1, 32)
    want_q8 = qkv.scaled_dot_product_attention(q, k, v, kv_type="q8_0", device="cpu")
    assert nmse(cache.decode(q, causal_alignment="top_left"), want_q8) <= 1e-9
    with pytest.raises(qkv.InvalidArgument, match="kv_type"):
        qkv.KVCache(None, 1, 2, 64, 32, 32, "q2_k")
    with pytest.raises(qkv.InvalidArgument, match="empty"):
        qkv.KVCache(None, 1, 2, 64, 32, 32).decode(q)
