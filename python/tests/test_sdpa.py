"""qkv.scaled_dot_product_attention against PyTorch's documented semantics and qkv's documented
options (sdpa_reference in conftest.py, float64 NumPy), on Vulkan and on the float64 reference
(device="cpu"): odd shapes, batch dimensions, GQA, bool and float masks that broadcast, both causal
alignments, windows, softcap, ALiBi slopes, sinks, K/V types, lse and weights, every dtype, numpy
and torch, and inputs that are views (transposes, slices, negative and zero strides)."""

import numpy as np
import pytest
import torch

import qkv

from conftest import flash_rule, max_error, needs_vulkan, nmse, sdpa_reference

DEVICES = [pytest.param(None, marks=needs_vulkan, id="vulkan"), pytest.param("cpu", id="cpu")]


def normal(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def close(got, want, bound=1e-9):
    assert nmse(got, want) <= bound


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(1, 1), (1, 113), (3, 17), (17, 3), (113, 17)], ids=str)
def test_odd_shapes_masks_and_causal(device, shape, rng):
    L, S = shape
    q, k, v = normal(rng, 2, 3, L, 32), normal(rng, 2, 3, S, 32), normal(rng, 2, 3, S, 16)
    mask = rng.random((2, 1, L, S)) > 0.3  # broadcast over heads; some rows may lose every key
    variants = ({}, {"is_causal": True}, {"attn_mask": mask}, {"attn_mask": mask, "is_causal": True})
    # Two of the four per shape, in turn (each is a pipeline lavapipe compiles); all four on the reference.
    turn = [(L + S) % 4, (L + S + 2) % 4]
    for kw in variants if device == "cpu" else [variants[t] for t in turn]:
        got = qkv.scaled_dot_product_attention(q, k, v, device=device, **kw)
        assert got.dtype == np.float32 and got.shape == (2, 3, L, 16)
        close(got, sdpa_reference(q, k, v, **kw))


@pytest.mark.parametrize("device", DEVICES)
def test_batch_dimensions_gqa_and_forms(device, rng):
    # two batch dimensions, GQA 6:2; a float mask broadcasting over the first batch dimension only
    q, k, v = normal(rng, 2, 3, 6, 5, 32), normal(rng, 2, 3, 2, 7, 32), normal(rng, 2, 3, 2, 7, 32)
    add = normal(rng, 3, 1, 5, 7)
    add[0, 0, 1] = -np.inf  # a row of one mask entry's batch without keys
    got = qkv.scaled_dot_product_attention(q, k, v, add, enable_gqa=True, scale=0.3, device=device)
    close(got, sdpa_reference(q, k, v, add, enable_gqa=True, scale=0.3))
    with pytest.raises(qkv.InvalidArgument, match="enable_gqa=True"):
        qkv.scaled_dot_product_attention(q, k, v, device=device)
    # 3-D (H, L, E) and 2-D (L, E): one batch, one head
    close(qkv.scaled_dot_product_attention(q[0, 0], k[0, 0, :1].repeat(6, 0), v[0, 0, :1].repeat(6, 0),
                                           device=device),
          sdpa_reference(q[0, 0], k[0, 0, :1].repeat(6, 0), v[0, 0, :1].repeat(6, 0)))
    close(qkv.scaled_dot_product_attention(q[0, 0, 0], k[0, 0, 0], v[0, 0, 0], device=device),
          sdpa_reference(q[0, 0, 0], k[0, 0, 0], v[0, 0, 0]))


@pytest.mark.parametrize("device", DEVICES)
def test_every_option(device, rng):
    Hq, Hkv, L, S, E = 4, 2, 17, 113, 32
    q, k, v = normal(rng, 1, Hq, L, E), normal(rng, 1, Hkv, S, E), normal(rng, 1, Hkv, S, E)
    slopes = np.array(qkv.alibi_slopes(Hq), dtype=np.float32)
    sinks = np.array([0.5, -np.inf, 3.0, -1.0], dtype=np.float32)
    cases = [
        {"window": (8, 0), "is_causal": True, "causal_alignment": "bottom_right"},
        {"window": (4, 2)},
        {"window": (-1, 3), "causal_alignment": "bottom_right"},
        {"softcap": 2.5, "scale": 1.3},
        {"alibi_slopes": slopes, "is_causal": True, "causal_alignment": "bottom_right"},
        {"sinks": sinks, "window": (5, 5)},
        {"softcap": 10.0, "alibi_slopes": slopes, "sinks": sinks, "is_causal": True},
    ]
    for kw in cases:
        out, lse = qkv.scaled_dot_product_attention(q, k, v, enable_gqa=True, device=device, return_lse=True, **kw)
        ref = {("alignment" if key == "causal_alignment" else key): val for key, val in kw.items()}
        want, want_lse, _ = sdpa_reference(q, k, v, enable_gqa=True, return_lse=True, **ref)
        close(out, want)
        assert lse.dtype == np.float32 and lse.shape == (1, Hq, L)
        assert max_error(lse, want_lse) < 1e-4


@pytest.mark.parametrize("device", DEVICES)
def test_weights_lse_and_rows_without_keys(device, rng):
    q, k, v = normal(rng, 1, 2, 9, 32), normal(rng, 1, 2, 5, 32), normal(rng, 1, 2, 5, 32)
    # causal top-left with L > S: fine; bottom-right with L > S: the first 4 rows see no key
    out, lse, w = qkv.scaled_dot_product_attention(q, k, v, is_causal=True, causal_alignment="bottom_right",
                                                   return_lse=True, return_weights=True, device=device)
    want, want_lse, want_w = sdpa_reference(q, k, v, is_causal=True, alignment="bottom_right", return_lse=True)
    assert (out[:, :, :4] == 0).all() and (lse[:, :, :4] == -np.inf).all()
    close(out, want)
    close(w, want_w)
    assert max_error(lse, want_lse) < 1e-5
    only_w = qkv.scaled_dot_product_attention(q, k, v, return_weights=True, device=device)
    assert isinstance(only_w, tuple) and len(only_w) == 2


def _quantized(x, kind):
    """ggml's q8_0 / q4_0 round trip of rows of 32 (the blocks' documented rules, element_type.hpp)."""
    blocks = x.reshape(-1, 32).astype(np.float32)
    out = np.empty_like(blocks)
    for n, b in enumerate(blocks):
        if kind == "q8_0":
            d = np.float32(np.abs(b).max() / np.float32(127))
            inv = np.float32(1) / d if d != 0 else np.float32(0)
            prod = (b * inv).astype(np.float32)
            qv = np.sign(prod) * np.floor(np.abs(prod) + np.float32(0.5))
            out[n] = qv * np.float32(np.float16(d))
        else:
            m = b[np.argmax(np.abs(b))]
            d = np.float32(m / np.float32(-8))
            inv = np.float32(1) / d if d != 0 else np.float32(0)
            qv = np.minimum(np.float32(15), np.trunc((b * inv).astype(np.float32) + np.float32(8.5)))
            out[n] = (qv - 8) * np.float32(np.float16(d))
    return out.reshape(x.shape)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kv_type", ["f16", "q8_0", "q4_0"])
def test_kv_types(device, kv_type, rng):
    q, k, v = normal(rng, 1, 2, 3, 32), normal(rng, 1, 2, 40, 32), normal(rng, 1, 2, 40, 32)
    got = qkv.scaled_dot_product_attention(q, k, v, kv_type=kv_type, device=device)
    if kv_type == "f16":
        kr, vr = k.astype(np.float16), v.astype(np.float16)
    else:
        kr, vr = _quantized(k, kv_type), _quantized(v, kv_type)
    close(got, sdpa_reference(q, kr, vr))
    assert nmse(got, sdpa_reference(q, k, v)) > 1e-9 or kv_type == "f16"  # the rounding is seen


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_torch_dtypes_by_flash_attention_rule(device, dtype):
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 4, n, 32, generator=g).to(dtype) for n in (17, 113, 113))
    got = qkv.scaled_dot_product_attention(q, k, v, is_causal=True, device=device)
    assert isinstance(got, torch.Tensor) and got.dtype == dtype and got.shape == (2, 4, 17, 32)
    want = sdpa_reference(q, k, v, is_causal=True)
    # the same call as explicit torch ops in the dtype, each op rounded (fp16: float32 ops rounded)
    scale = 1 / 32 ** 0.5
    up = (lambda x: x.float()) if dtype == torch.float16 else (lambda x: x)
    s = (up(q) @ up(k).transpose(-1, -2)).to(dtype)
    s = (up(s) * scale).to(dtype).masked_fill(~torch.ones(17, 113, dtype=torch.bool).tril(), float("-inf"))
    same = (torch.softmax(up(s), -1).to(dtype) @ up(v) if dtype != torch.float16
            else (torch.softmax(up(s), -1).half().float() @ v.float()).half())
    flash_rule(got, want, same.to(dtype))


def test_float64_on_the_reference_only(rng):
    q, k, v = (rng.standard_normal((1, 2, n, 32)) for n in (5, 7, 7))
    got = qkv.scaled_dot_product_attention(q * 1e200, k * 1e-200, v, device="cpu")  # beyond float32
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, sdpa_reference(q, k, v), rtol=1e-12, atol=1e-14)
    if qkv.devices():
        with pytest.raises(qkv.InvalidArgument, match="float64"):
            qkv.scaled_dot_product_attention(q, k, v)
    with pytest.raises(qkv.InvalidArgument, match="scale = .* beyond float32's range"):
        qkv.scaled_dot_product_attention(q, k, v, device="cpu", scale=1e-200)


@pytest.mark.parametrize("device", DEVICES)
def test_views_give_what_their_copies_give(device, rng):
    base_q, base_k, base_v = normal(rng, 2, 8, 6, 64), normal(rng, 2, 8, 6, 64), normal(rng, 2, 8, 6, 64)
    views = [
        (base_q.transpose(0, 2, 1, 3), base_k.transpose(0, 2, 1, 3), base_v.transpose(0, 2, 1, 3)),  # (B, H, L, E)
        (base_q[:, ::2, :, ::2], base_k[:, ::2, :, ::2], base_v[:, ::2, :, 1::2]),  # steps
        (base_q[::-1, :, ::-1], base_k[::-1, :, ::-1], base_v[::-1, :, ::-1]),  # negative strides
        (np.broadcast_to(base_q[:1, :1], (3, 5, 6, 64)), np.broadcast_to(base_k[:1, :1], (3, 5, 6, 64)),
         base_v[:1].repeat(3, 0)[:, :5]),  # zero strides
    ]
    for q, k, v in views:
        assert not q.flags.c_contiguous
        got = qkv.scaled_dot_product_attention(q, k, v, device=device)
        copy = qkv.scaled_dot_product_attention(*(np.ascontiguousarray(x) for x in (q, k, v)), device=device)
        assert np.array_equal(got, copy)
        close(got, sdpa_reference(q, k, v))
    t = torch.from_numpy(base_q).transpose(1, 2)  # a torch view, read through DLPack
    assert torch.equal(qkv.scaled_dot_product_attention(t, t, t, device=device),
                       qkv.scaled_dot_product_attention(t.contiguous(), t.contiguous(), t.contiguous(), device=device))


def test_torch_bool_mask_and_mixed_float_mask_dtype(rng):
    q, k, v = (torch.from_numpy(normal(rng, 1, 2, n, 32)) for n in (5, 9, 9))
    mask = torch.from_numpy(rng.random((5, 9)) > 0.5)
    got = qkv.scaled_dot_product_attention(q, k, v, mask, device="cpu")
    close(got, sdpa_reference(q, k, v, mask.numpy()))
    additive = torch.from_numpy(normal(rng, 5, 9)).half()
    close(qkv.scaled_dot_product_attention(q, k, v, additive, device="cpu"),
          sdpa_reference(q, k, v, additive.float().numpy()))
