#!/usr/bin/python3
"""Regenerates the fixtures of the attention options beyond PyTorch's SDPA (sliding windows, sinks,
softcap, ALiBi, quantized K/V, log-sum-exp) and of the K/V storage formats; run with
/usr/bin/python3 (needs numpy). The files are checked in: the build and the tests never run Python.
Used by tests/sdpa_features_test.cpp and tests/element_type_test.cpp.

  features/<case>/q.npy, k.npy, v.npy  the inputs (float32)
  features/<case>/mask.npy             optional: bool (True = may attend) or float32 (added)
  features/<case>/sinks.npy            optional: float32 (Hq,), one logit per query head
  features/<case>/args.txt             the `qkv sdpa` flags of the case besides the files, one line:
                                       --causal, --causal-align top-left|bottom-right (the offset of
                                       the window and ALiBi too, with or without --causal), --scale S,
                                       --window LEFT,RIGHT, --softcap C, --alibi MAX_BIAS,
                                       --kv-type f32|f16|q8_0|q4_0
  features/<case>/expected_out.npy     float64, q's leading dimensions and Ev columns
  features/<case>/expected_weights.npy float64 (..., L, S), where the case checks the weights too
  features/<case>/expected_lse.npy     float64, q's leading dimensions (log-sum-exp of each row)

  quantize/x.npy                       float32 values, a multiple of 32 (blocks of edge cases)
  quantize/q8_0.bin, q4_0.bin          the bytes of x stored as each type, raw (ggml's layout:
                                       little-endian float16 d, then the quants)
  quantize/x_f16.npy, f16.bin          float32 values within float16's range and the edges of its
                                       rounding; their bytes as float16 (little-endian)

The reference is the semantics of qkv/runtime/sdpa.hpp written as NumPy formulas, independently of
qkv's C++: with s = scale * q.k, off = 0 (top-left) or S - L (bottom-right):
  softcap C > 0: s = C tanh(s / C); ALiBi b > 0: s -= slope_h |i + off - j| with ggml's slopes;
  additive mask added; key j allowed by the bool mask, causal (j <= i + off), the window
  (i + off - left <= j <= i + off + right, -1 unbounded) and s != -inf; softmax over the allowed
  keys with the head's sink in the denominator; lse = log sum_j e^(s_j) without the sink; a row with
  no key gets zeros and lse -inf. The quantizers are ggml's reference rules in float32 arithmetic:
  q8_0 d = max|x| / 127, q = roundf(x * (1/d)); q4_0 d = m / -8 (m the first value of largest
  magnitude), q = min(15, trunc(x * (1/d) + 8.5)); d stored as float16 (round to nearest even).
"""
import os
import shutil

import numpy as np

from make_sdpa_fixtures import as4, save

HERE = os.path.dirname(os.path.abspath(__file__))
rng = np.random.default_rng(20261125)
f32 = np.float32


def randn(*shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(f32)


# ---- Storage formats ---------------------------------------------------------------------------------


def half_bits(x):
    """float32 scalar -> float16 bits (numpy converts to nearest, ties to even)."""
    with np.errstate(over="ignore"):
        return int(np.array([x], dtype=f32).astype(np.float16).view(np.uint16)[0])


def half_value(bits):
    return float(np.array([bits], dtype=np.uint16).view(np.float16)[0])


def roundf(x):
    """C's roundf of a float32: halves away from zero (exact in float64)."""
    x = float(x)
    return float(np.sign(x) * np.floor(abs(x) + 0.5))


def quantize_block(kind, blk):
    """One block of 32 float32 values -> (d bits, codes) by ggml's reference rule."""
    blk = np.asarray(blk, dtype=f32)
    if kind == "q8_0":
        amax = f32(0)
        for v in blk:
            amax = max(amax, f32(abs(v)))
        d = f32(amax / f32(127))
        with np.errstate(over="ignore"):
            inv = f32(f32(1) / d) if d != 0 else f32(0)
        if not np.isfinite(inv):
            return half_bits(d), [0] * 32
        scaled = (blk * inv).astype(f32)
        return half_bits(d), [int(roundf(v)) for v in scaled]
    amax, m = f32(0), f32(0)
    for v in blk:
        if amax < abs(v):
            amax, m = f32(abs(v)), v
    d = f32(m / f32(-8))
    with np.errstate(over="ignore"):
        inv = f32(f32(1) / d) if d != 0 else f32(0)
    if not np.isfinite(inv):
        return half_bits(d), [8] * 32
    shifted = ((blk * inv).astype(f32) + f32(8.5)).astype(f32)
    return half_bits(d), [min(15, int(np.trunc(float(v)))) for v in shifted]


def store(kind, x):
    """float32 values -> bytes as `kind` stores them."""
    x = np.asarray(x, dtype=f32).ravel()
    out = bytearray()
    if kind == "f16":
        for v in x:
            out += half_bits(v).to_bytes(2, "little")
        return bytes(out)
    for blk in x.reshape(-1, 32):
        d, codes = quantize_block(kind, blk)
        out += d.to_bytes(2, "little")
        if kind == "q8_0":
            out += bytes((c & 0xFF) for c in codes)
        else:
            out += bytes(codes[j] | (codes[j + 16] << 4) for j in range(16))
    return bytes(out)


def round_trip(kind, x):
    """x as a device storing it as `kind` sees it (float32 values, x's shape)."""
    x = np.asarray(x, dtype=f32)
    if kind == "f32":
        return x.copy()
    if kind == "f16":
        return x.astype(np.float16).astype(f32)
    flat = x.ravel()
    out = np.empty_like(flat)
    for b, blk in enumerate(flat.reshape(-1, 32)):
        d, codes = quantize_block(kind, blk)
        dv = f32(half_value(d))
        for j, c in enumerate(codes):
            out[32 * b + j] = f32(f32(c if kind == "q8_0" else c - 8) * dv)
    return out.reshape(x.shape)


def quantize_fixtures():
    d = os.path.join(HERE, "quantize")
    shutil.rmtree(d, ignore_errors=True)
    blocks = []
    blocks.append(np.zeros(32, f32))  # all zero: d = 0 (q4_0: -0)
    b = np.arange(32, dtype=f32) - 16  # exact scales
    b[0] = -127
    b[1:9] = [2.5, -2.5, 0.5, -0.5, 126.5, -126.5, 1.5, -1.5]  # ties: half away from zero
    blocks.append(b)
    b = np.zeros(32, f32)
    b[0], b[5] = 3, -3  # two of the largest magnitude: the first decides q4_0's sign
    b[6:] = randn(26)
    blocks.append(b)
    b = b.copy()
    b[0], b[5] = -3, 3
    blocks.append(b)
    b = np.zeros(32, f32)
    b[0] = 8  # q4_0: d = -1; the values near -8 clamp to code 15
    b[1:8] = [-8, -7.9, -7.5, -7.4, 7.5, 0.5, -0.5]
    blocks.append(b)
    blocks.append(randn(32, scale=1e-6))  # d below float16's normal range (subnormal d)
    blocks.append(randn(32, scale=1e-9))  # d rounds to 0 as a float16
    blocks.append(randn(32, scale=1e-40))  # subnormal float32 values: 1/d overflows
    blocks.append(randn(32, scale=1e5))  # large but representable (q8_0 d about 3e3)
    b = randn(32, scale=1e3)
    b[8] = -5.2e5  # q4_0: d = 65000, near float16's largest
    blocks.append(b)
    for scale in (0.01, 0.3, 1, 7, 250):
        for _ in range(8):
            blocks.append(randn(32, scale=scale))
    x = np.concatenate(blocks).astype(f32)
    save(os.path.join(d, "x.npy"), x)
    for kind in ("q8_0", "q4_0"):
        with open(os.path.join(d, kind + ".bin"), "wb") as f:
            f.write(store(kind, x))
    # float16: x's values within its range, and the edges of its rounding.
    edges = np.array([65504, 65519.99, -65519.99, 1 + 2.0**-11, 1 + 3 * 2.0**-11, 2.0**-14, 2.0**-24, 2.0**-25,
                      1.5 * 2.0**-24, 2.0**-26, 0.0, -0.0, 1e-45, np.inf, -np.inf], dtype=f32)
    x16 = np.concatenate([x[np.abs(x) < 65504], edges]).astype(f32)
    save(os.path.join(d, "x_f16.npy"), x16)
    with open(os.path.join(d, "f16.bin"), "wb") as f:
        f.write(store("f16", x16))
    print("quantize", x.shape)


# ---- Attention ---------------------------------------------------------------------------------------


def alibi_slopes(hq, max_bias):
    n = 2 ** int(np.floor(np.log2(hq)))
    m0 = 2.0 ** (-max_bias / n)
    m1 = 2.0 ** (-max_bias / (2 * n))
    return np.array([m0 ** (h + 1) if h < n else m1 ** (2 * (h - n) + 1) for h in range(hq)])


def reference(q, k, v, mask=None, causal=False, align="top-left", scale=None, window=(-1, -1), softcap=0.0,
              alibi=0.0, sinks=None, kv_type=None):
    lead = q.shape[:-1]
    if kv_type is not None:
        k, v = round_trip(kv_type, k), round_trip(kv_type, v)
    q4, k4, v4 = (as4(a.astype(np.float64)) for a in (q, k, v))
    B, Hq, L, E = q4.shape
    Hkv, S = k4.shape[1], k4.shape[2]
    k4 = np.repeat(k4, Hq // Hkv, axis=1)
    v4 = np.repeat(v4, Hq // Hkv, axis=1)
    scale = 1.0 / np.sqrt(E) if scale is None else float(f32(scale))
    s = (q4 @ np.swapaxes(k4, -1, -2)) * scale
    if softcap > 0:
        c = float(f32(softcap))
        s = c * np.tanh(s / c)
    off = 0 if align == "top-left" else S - L
    i = np.arange(L)[:, None]
    j = np.arange(S)[None, :]
    if alibi > 0:
        slopes = alibi_slopes(Hq, float(f32(alibi)))
        s = s - slopes[None, :, None, None] * np.abs(i + off - j)[None, None].astype(np.float64)
    allowed = np.ones((B, Hq, L, S), dtype=bool)
    if mask is not None:
        if mask.dtype == np.bool_:
            allowed &= np.broadcast_to(mask, (B, Hq, L, S))
        else:
            s = s + np.broadcast_to(mask.astype(np.float64), (B, Hq, L, S))
    if causal:
        allowed &= (j <= i + off)[None, None]
    left, right = window
    if left >= 0:
        allowed &= (j >= i + off - left)[None, None]
    if right >= 0:
        allowed &= (j <= i + off + right)[None, None]
    allowed &= s != -np.inf
    s = np.where(allowed, s, -np.inf)
    any_row = allowed.any(axis=-1, keepdims=True)
    m = np.where(any_row, np.where(allowed, s, -np.inf).max(axis=-1, keepdims=True), 0.0)
    e = np.where(allowed, np.exp(s - m), 0.0)
    total = e.sum(axis=-1, keepdims=True)
    lse = np.where(any_row, m + np.log(np.where(any_row, total, 1.0)), -np.inf)
    if sinks is not None:
        sig = sinks.astype(np.float64)[None, :, None, None]
        top = np.maximum(m, sig)
        e = np.where(allowed, np.exp(s - top), 0.0)
        denominator = e.sum(axis=-1, keepdims=True) + np.exp(sig - top)
        with np.errstate(invalid="ignore"):  # 0 / 0 in rows with no key, zeroed below
            w = e / denominator
    else:
        w = e / np.where(any_row, total, 1.0)
    w = np.where(any_row, w, 0.0)
    out = w @ v4
    return out.reshape(lead + (out.shape[-1],)), w.reshape(lead + (S,)), lse.reshape(lead)


def case(name, q, k, v, mask=None, causal=False, align="top-left", scale=None, window=(-1, -1), softcap=0.0,
         alibi=0.0, sinks=None, kv_type=None, weights=False):
    d = os.path.join(HERE, "features", name)
    shutil.rmtree(d, ignore_errors=True)
    save(os.path.join(d, "q.npy"), q)
    save(os.path.join(d, "k.npy"), k)
    save(os.path.join(d, "v.npy"), v)
    args = []
    if mask is not None:
        save(os.path.join(d, "mask.npy"), mask)
    if sinks is not None:
        save(os.path.join(d, "sinks.npy"), sinks)
    if causal:
        args += ["--causal"]
    if causal or align != "top-left":
        args += ["--causal-align", align]
    if scale is not None:
        args += ["--scale", repr(scale)]
    if window != (-1, -1):
        args += ["--window", "%d,%d" % window]
    if softcap:
        args += ["--softcap", repr(softcap)]
    if alibi:
        args += ["--alibi", repr(alibi)]
    if kv_type is not None:
        args += ["--kv-type", kv_type]
    out, w, lse = reference(q, k, v, mask, causal, align, scale, window, softcap, alibi, sinks, kv_type)
    save(os.path.join(d, "expected_out.npy"), out)
    save(os.path.join(d, "expected_lse.npy"), lse)
    if weights:
        save(os.path.join(d, "expected_weights.npy"), w)
    with open(os.path.join(d, "args.txt"), "w") as f:
        f.write(" ".join(args) + "\n")
    print(name, q.shape, k.shape, v.shape, None if mask is None else (mask.dtype, mask.shape), args)


def feature_fixtures():
    shutil.rmtree(os.path.join(HERE, "features"), ignore_errors=True)
    # Sliding windows: both sides, one side, with and without causal, both alignments, L < S and L > S.
    case("window_top_left", randn(4, 17, 32), randn(2, 113, 32), randn(2, 113, 32), window=(5, 3), weights=True)
    case("window_bottom_right_l_lt_s", randn(2, 2, 3, 64), randn(2, 1, 113, 64), randn(2, 1, 113, 32),
         align="bottom-right", window=(-1, 7), weights=True)
    case("window_causal_bottom_right_l_gt_s", randn(2, 2, 113, 64), randn(2, 1, 17, 64), randn(2, 1, 17, 32),
         causal=True, align="bottom-right", window=(4, -1), weights=True)
    case("window_causal_top_left_l_gt_s", randn(3, 113, 32), randn(3, 17, 32), randn(3, 17, 32), causal=True,
         window=(0, 0))
    # Sinks: fully masked rows stay zero; -inf is no sink; one sink above every score.
    keep = rng.random((2, 1, 17, 113)) < 0.3
    keep[:, :, 4, :] = False
    keep[1, :, 9, :] = False
    case("sinks_masked", randn(2, 4, 17, 32), randn(2, 2, 113, 32), randn(2, 2, 113, 32), mask=keep,
         sinks=np.array([0.5, -np.inf, 6.0, -1.25], dtype=f32), weights=True)
    case("sinks_causal_bottom_right_l_gt_s", randn(4, 17, 64), randn(2, 3, 64), randn(2, 3, 96), causal=True,
         align="bottom-right", sinks=randn(4), weights=True)
    # Softcap with both masks and causal; scores well beyond the cap.
    add = randn(113, 113)
    add[rng.random(add.shape) < 0.2] = -np.inf
    case("softcap_masks", randn(113, 96, scale=3), randn(113, 96), randn(113, 96), mask=add, causal=True,
         softcap=2.0)
    keep = rng.random((1, 3, 1, 17)) < 0.6
    case("softcap_bool_mask", randn(1, 3, 3, 32), randn(1, 3, 17, 32), randn(1, 3, 17, 64), mask=keep, softcap=0.75,
         weights=True)
    # ALiBi with GQA and head counts that are not powers of two.
    case("alibi_gqa_12", randn(12, 17, 64), randn(4, 113, 64), randn(4, 113, 32), causal=True, align="bottom-right",
         alibi=8.0)
    case("alibi_gqa_20", randn(20, 3, 32), randn(5, 17, 32), randn(5, 17, 32), alibi=8.0, window=(6, 2), weights=True)
    case("alibi_softcap_top_left", randn(2, 6, 17, 96), randn(2, 3, 17, 96), randn(2, 3, 17, 32), alibi=0.5,
         softcap=10.0, weights=True)
    # K/V stored as the device stores them.
    case("kv_q8_0", randn(4, 3, 64), randn(2, 113, 64), randn(2, 113, 32), causal=True, align="bottom-right",
         kv_type="q8_0")
    keep = rng.random((17, 113)) < 0.8
    # The same K with one NaN (flat index 9797, K[1, 40, 5]), which q8_0 cannot store: the refusal
    # names the file and that index, also under --context-parallel (row 40 is in rank 1's slice).
    k_nan = np.load(os.path.join(HERE, "features", "kv_q8_0", "k.npy"))
    k_nan[1, 40, 5] = np.nan
    save(os.path.join(HERE, "features", "kv_q8_0", "k_nan.npy"), k_nan)
    case("kv_q4_0", randn(1, 4, 17, 96), randn(1, 2, 113, 96), randn(1, 2, 113, 64), mask=keep,
         sinks=randn(4), kv_type="q4_0", weights=True)
    case("kv_f16", randn(2, 1, 64), randn(2, 113, 64, scale=30), randn(2, 113, 32), softcap=5.0, kv_type="f16")
    case("kv_f32", randn(1, 17, 32), randn(1, 17, 32), randn(1, 17, 32), causal=True, kv_type="f32")
    # Everything at once.
    keep = rng.random((1, 12, 17, 113)) < 0.7
    case("everything", randn(1, 12, 17, 32), randn(1, 3, 113, 32), randn(1, 3, 113, 32), mask=keep, causal=True,
         align="bottom-right", scale=0.3, window=(40, -1), softcap=10.0, alibi=8.0, sinks=randn(12),
         kv_type="q8_0", weights=True)
    # Odd shapes: L = S = 1; L = 113 > S = 3, top-left (every row sees key 0).
    case("single_lse", randn(1, 32), randn(1, 32), randn(1, 32), sinks=np.array([0.25], dtype=f32), weights=True)
    case("tall_top_left", randn(113, 32), randn(3, 32), randn(3, 64), causal=True, weights=True)


def main():
    quantize_fixtures()
    feature_fixtures()


if __name__ == "__main__":
    main()
