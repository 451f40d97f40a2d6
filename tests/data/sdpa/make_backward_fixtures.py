#!/usr/bin/python3
"""Regenerates the fixtures of the backward pass (and of dropout's forward pass) of scaled dot-product
attention, tests/data/sdpa/backward; run with /usr/bin/python3 (numpy, torch). The files are
checked in: the build and the tests never run Python. Used by tests/sdpa_backward_test.cpp.

  backward/<case>/q.npy, k.npy, v.npy, d_out.npy  the inputs (float32, 4-D)
  backward/<case>/mask.npy                         optional: bool, broadcast to (B, Hq, L, S)
  backward/<case>/additive.npy                     optional: float32, broadcast, added (-inf masks)
  backward/<case>/sinks.npy                        optional: float32 (Hq,)
  backward/<case>/options.txt                      the options, one per line: scale S; causal;
                                                   alignment top_left|bottom_right; position_offset N;
                                                   window LEFT RIGHT; softcap C; alibi MAX_BIAS;
                                                   dropout P SEED OFFSET; kv_type f16
  backward/<case>/expected_<name>.npy              float64: out, lse, weights (where the case returns
                                                   them), dq, dk, dv, d_sinks, d_additive

The reference is tests/reference/sdpa_autograd.py: the forward written from qkv's documented
semantics in torch float64, the gradients by torch.autograd (kv_type f16: from K and V rounded to
float16, as the device stores them, the gradients passed straight through).
"""
import os
import shutil
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "reference"))

from make_sdpa_fixtures import save  # noqa: E402
from sdpa_autograd import gradients  # noqa: E402

rng = np.random.default_rng(20261126)
f32 = np.float32
NINF = -np.inf


def randn(*shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(f32)


def case(name, B, Hq, Hkv, L, S, E, Ev, *, mask=None, additive=None, sinks=None, weights=False, kv_type=None,
         scale_q=1.0, **options):
    d = os.path.join(HERE, "backward", name)
    os.makedirs(d)
    # qkv's options are float32: the reference computes with the same values.
    for key in ("scale", "softcap", "alibi_max_bias", "dropout_p"):
        if key in options:
            options[key] = float(f32(options[key]))
    q, k, v, d_out = randn(B, Hq, L, E, scale=scale_q), randn(B, Hkv, S, E), randn(B, Hkv, S, Ev), randn(B, Hq, L, Ev)
    for file, a in [("q", q), ("k", k), ("v", v), ("d_out", d_out), ("mask", mask), ("additive", additive),
                    ("sinks", sinks)]:
        if a is not None:
            save(os.path.join(d, f"{file}.npy"), a)
    lines = []
    if "scale" in options:
        lines.append(f"scale {options['scale']!r}")
    if options.get("causal"):
        lines.append("causal")
    if "alignment" in options:
        lines.append(f"alignment {options['alignment']}")
    if "position_offset" in options:
        lines.append(f"position_offset {options['position_offset']}")
    if "window" in options:
        lines.append(f"window {options['window'][0]} {options['window'][1]}")
    if "softcap" in options:
        lines.append(f"softcap {options['softcap']!r}")
    if "alibi_max_bias" in options:
        lines.append(f"alibi {options['alibi_max_bias']!r}")
    if "dropout_p" in options:
        lines.append(f"dropout {options['dropout_p']!r} {options['seed']} {options['offset']}")
    if kv_type:
        assert kv_type == "f16"
        lines.append("kv_type f16")
        k, v = k.astype(np.float16).astype(f32), v.astype(np.float16).astype(f32)
    with open(os.path.join(d, "options.txt"), "w") as f:
        f.write("".join(line + "\n" for line in lines))
    r = gradients(q, k, v, d_out, additive=additive, sinks=sinks, mask=mask, **options)
    names = ["out", "lse", "dq", "dk", "dv"] + (["weights"] if weights else []) + \
        (["d_sinks"] if sinks is not None else []) + (["d_additive"] if additive is not None else [])
    for n in names:
        save(os.path.join(d, f"expected_{n}.npy"), np.asarray(r[n], dtype=np.float64))
    empty = int(np.sum(r["lse"] == NINF))
    print(f"{name}: B {B}, Hq {Hq}, Hkv {Hkv}, L {L}, S {S}, E {E}, Ev {Ev}, {lines}; {empty} rows without a key, "
          f"|dq| max {np.abs(r['dq']).max():.3g}")


def main():
    shutil.rmtree(os.path.join(HERE, "backward"), ignore_errors=True)
    # Odd shapes, no option.
    case("plain_113x113_e64", 1, 1, 1, 113, 113, 64, 64)
    case("l113_s1_e16", 1, 2, 2, 113, 1, 16, 16)  # one key: its weight is 1, q gets no gradient
    case("l1_s113_e80_gqa", 1, 4, 1, 1, 113, 80, 80)
    case("l3_s17_e80", 1, 1, 1, 3, 17, 80, 16, scale=-0.25)
    # Each feature alone.
    case("causal_top_left", 1, 2, 2, 3, 17, 16, 16, causal=True)
    case("causal_bottom_right", 1, 2, 1, 17, 3, 16, 64, causal=True, alignment="bottom_right")  # L > S: empty rows
    case("position_offset", 1, 1, 1, 17, 17, 16, 16, causal=True, position_offset=-5, window=(4, -1))
    case("window", 1, 1, 1, 17, 17, 16, 16, window=(3, 1), alignment="bottom_right")
    case("softcap", 1, 1, 1, 17, 17, 64, 16, softcap=2.0, scale=1.0 / 4)
    case("alibi", 1, 4, 2, 17, 17, 16, 16, alibi_max_bias=8.0)
    case("sinks", 2, 3, 3, 17, 17, 16, 16, sinks=np.array([0.5, NINF, 2.5], dtype=f32))
    bool_mask = rng.random((2, 1, 17, 17)) < 0.7
    bool_mask[1, 0, 5] = False  # an empty row
    case("bool_mask", 2, 2, 2, 17, 17, 16, 16, mask=bool_mask)
    key_padding = randn(2, 1, 1, 17)
    key_padding[0, 0, 0, 12:] = NINF
    case("additive_key_padding", 2, 2, 1, 17, 17, 16, 16, additive=key_padding)
    square = randn(17, 17)
    square[np.triu_indices(17, 3)] = NINF
    square[9] = NINF  # an empty row
    case("additive_square", 2, 2, 2, 17, 17, 16, 16, additive=square)
    case("additive_per_row", 1, 2, 2, 17, 17, 16, 16, additive=randn(2, 17, 1), sinks=np.array([0.25, -1.0], f32))
    case("dropout", 2, 2, 1, 17, 113, 16, 16, weights=True, dropout_p=0.2, seed=0x5EED, offset=7)
    case("dropout_heavy", 1, 1, 1, 3, 17, 16, 16, weights=True, dropout_p=0.9, seed=3, offset=2 ** 63)
    case("kv_f16", 1, 2, 2, 17, 17, 16, 16, kv_type="f16")
    # Everything at once.
    everything_mask = rng.random((2, 1, 17, 113)) < 0.9
    everything_additive = randn(2, 1, 17, 113)  # the masks share one shape
    everything_additive[1, 0, 3, :] = NINF
    case("everything", 2, 4, 2, 17, 113, 16, 16, mask=everything_mask, additive=everything_additive,
         sinks=np.array([0.5, 1.0, NINF, -0.5], f32), weights=True, scale=0.2, causal=True, alignment="bottom_right",
         window=(40, 3), softcap=5.0, alibi_max_bias=4.0, dropout_p=0.1, seed=2 ** 40 + 1, offset=11)


if __name__ == "__main__":
    main()
