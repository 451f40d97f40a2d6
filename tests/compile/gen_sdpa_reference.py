#!/usr/bin/python3
"""Writes tests/compile/sdpa_reference.hpp: the inputs and float64 reference results of the
compile-time scaled_dot_product_attention proofs (tests/compile/sdpa_static.cpp).

The inputs are small pseudo-random multiples of 1/16 (exact in float32 and float64, so both sides
start from the same numbers). The reference follows the semantics PyTorch documents for
torch.nn.functional.scaled_dot_product_attention (its "equivalent implementation"), computed in
float64 with NumPy:
    attn_bias = 0 (L x S)
    is_causal:   attn_bias[~tril(ones(L, S), diagonal)] = -inf, diagonal 0 (top-left, PyTorch's
                 is_causal) or S - L (bottom-right, the KV-cache convention)
    bool mask:   attn_bias[~mask] = -inf           float mask: attn_bias += mask
    enable_gqa:  k, v = k.repeat_interleave(Hq // Hkv, head dim), same for v
    weights = softmax(q @ k.T * scale + attn_bias) by rows, output = weights @ v,
    scale = 1 / sqrt(E) unless given.
One deliberate difference, qkv's documented policy (include/qkv/softmax.hpp): a row with no key
left to attend to (every entry -inf) gets zero weights and a zero output, where PyTorch gives NaN.
(The torch installed here, 1.13, predates F.scaled_dot_product_attention, so the documented
semantics are implemented directly.) qkv's bool and float masks may also be given together;
both are applied, a key must pass all of them.

The script also reports how far a float32 evaluation lands from the reference (NumPy float32,
not qkv's summation order), which the proofs' tolerance must comfortably exceed.

Usage: /usr/bin/python3 tests/compile/gen_sdpa_reference.py   (from the repository root)
"""
import math
import pathlib

import numpy as np

RNG = np.random.default_rng(20261123)
NINF = -math.inf


def sixteenths(rows, cols, lo=-24, hi=24):
    """A rows x cols matrix of k/16, k uniform in [lo, hi]: exact in float32."""
    return RNG.integers(lo, hi + 1, size=(rows, cols)).astype(np.float64) / 16.0


def sdpa64(q, k, v, *, scale=None, causal=None, mask=None, additive=None, hq=1, hkv=1):
    """Float64 reference: q L x (hq*E), k S x (hkv*E), v S x (hkv*Ev), heads side by side in the
    columns. Returns (output L x hq*Ev, [weights per query head], [scores per query head])."""
    L, S = q.shape[0], k.shape[0]
    e, ev = q.shape[1] // hq, v.shape[1] // hkv
    assert k.shape[1] // hkv == e and hq % hkv == 0
    bias = np.zeros((L, S))
    if causal is not None:
        diagonal = 0 if causal == "top_left" else S - L
        keep = np.tril(np.ones((L, S), dtype=bool), diagonal)
        bias[~keep] = NINF
    if mask is not None:
        bias[~mask] = NINF
    if additive is not None:
        bias = bias + additive
    scale = 1.0 / math.sqrt(e) if scale is None else scale
    group = hq // hkv
    outs, weights, scores = [], [], []
    for h in range(hq):
        g = h // group  # repeat_interleave: query head h uses K/V head h // group
        qh, kh, vh = q[:, h * e:(h + 1) * e], k[:, g * e:(g + 1) * e], v[:, g * ev:(g + 1) * ev]
        raw = qh @ kh.T * scale
        s = raw + bias
        w = np.zeros((L, S))
        for i in range(L):
            if np.all(s[i] == NINF):
                continue  # nothing to attend to: zeros (qkv's policy; PyTorch: NaN)
            e_row = np.exp(s[i] - s[i].max())
            w[i] = e_row / e_row.sum()
        outs.append(w @ vh)
        weights.append(w)
        # qkv's scores: q·kᵀ·scale plus the additive mask (the bool and causal masks are not added)
        scores.append(raw + additive if additive is not None else raw)
    return np.concatenate(outs, axis=1), weights, scores


def sdpa32_error(q, k, v, ref, **kw):
    """Max |float32 evaluation - reference|, the same formula in float32."""
    f = lambda a: None if a is None else a.astype(np.float32)
    q32, k32, v32 = f(q), f(k), f(v)
    L, S = q.shape[0], k.shape[0]
    hq, hkv = kw.get("hq", 1), kw.get("hkv", 1)
    e, ev = q.shape[1] // hq, v.shape[1] // hkv
    bias = np.zeros((L, S), dtype=np.float32)
    if kw.get("causal") is not None:
        keep = np.tril(np.ones((L, S), dtype=bool), 0 if kw["causal"] == "top_left" else S - L)
        bias[~keep] = -np.inf
    if kw.get("mask") is not None:
        bias[~kw["mask"]] = -np.inf
    if kw.get("additive") is not None:
        bias = bias + f(kw["additive"])
    scale = np.float32(1.0 / math.sqrt(e) if kw.get("scale") is None else kw["scale"])
    outs = []
    for h in range(hq):
        g = h // (hq // hkv)
        s = q32[:, h * e:(h + 1) * e] @ k32[:, g * e:(g + 1) * e].T * scale + bias
        w = np.zeros((L, S), dtype=np.float32)
        for i in range(L):
            if np.all(s[i] == -np.inf):
                continue
            x = np.exp(s[i] - s[i].max())
            w[i] = x / x.sum()
        outs.append(w @ v32[:, g * ev:(g + 1) * ev])
    return float(np.abs(np.concatenate(outs, axis=1).astype(np.float64) - ref).max())


def literal(x, kind):
    if kind == "bool":
        return "true" if x else "false"
    if x == NINF:
        return "ninf<float>" if kind == "float" else "ninf<double>"
    if kind == "float":
        return f"{x!r}f"  # inputs: exact multiples of 1/16
    return f"{x:.17e}"


def emit_matrix(lines, name, m, kind, comment=None):
    rows, cols = m.shape
    if comment:
        lines.append(f"/// {comment}")
    if kind == "bool":
        body = ", ".join("{" + ", ".join(literal(x, kind) for x in row) + "}" for row in m)
        lines.append(f"inline constexpr qkv::matrix<bool, {rows}, {cols}> {name}{{{{{body}}}}};")
        return
    t = "float" if kind == "float" else "double"
    lines.append(f"inline constexpr auto {name} = qkv::matrix_of<{t}>({{")
    for row in m:
        lines.append("    {" + ", ".join(literal(x, kind) for x in row) + "},")
    lines.append("});")


def main():
    out = pathlib.Path(__file__).with_name("sdpa_reference.hpp")
    lines = [
        "// Generated by tests/compile/gen_sdpa_reference.py: do not edit.",
        "// Inputs (exact multiples of 1/16) and float64 reference results of scaled dot-product attention,",
        "// computed with NumPy after PyTorch's documented F.scaled_dot_product_attention semantics; rows",
        "// with nothing to attend to are zero (qkv's policy).",
        "#pragma once",
        "",
        "#include <qkv/math.hpp>",
        "#include <qkv/matrix.hpp>",
        "",
        "// clang-format off",
        "namespace qkv_test::sdpa {",
        "",
        "template <class T>",
        "inline constexpr T ninf = -qkv::infinity<T>();",
        "",
    ]
    worst = 0.0

    def case(name, q, k, v, what, weights=False, **kw):
        nonlocal worst
        ref, w, _ = sdpa64(q, k, v, **kw)
        err = sdpa32_error(q, k, v, ref, **kw)
        worst = max(worst, err)
        print(f"{name}: {what}; |output| max {np.abs(ref).max():.3f}, float32 error {err:.2e}")
        emit_matrix(lines, f"{name}_output", ref, "double", f"{what}: output (float32 error {err:.2e}).")
        if weights:
            for h, wh in enumerate(w):
                suffix = "" if len(w) == 1 else f"_{h}"
                emit_matrix(lines, f"{name}_weights{suffix}", wh, "double", f"{what}: weights{suffix}.")
        lines.append("")

    # Cross-attention: L = 3 queries, S = 5 keys, E = 4, Ev = 2.
    q = sixteenths(3, 4)
    k = sixteenths(5, 4)
    v = sixteenths(5, 2)
    emit_matrix(lines, "q", q, "float", "Queries, L = 3, E = 4.")
    emit_matrix(lines, "k", k, "float", "Keys, S = 5, E = 4.")
    emit_matrix(lines, "v", v, "float", "Values, S = 5, Ev = 2.")
    # L = 5 queries over the first 3 keys (L > S).
    q_long = sixteenths(5, 4)
    emit_matrix(lines, "q_long", q_long, "float", "Queries, L = 5, E = 4 (against k3, v3: L > S).")
    k3, v3 = k[:3], v[:3]
    emit_matrix(lines, "k3", k3, "float", "The first 3 keys.")
    emit_matrix(lines, "v3", v3, "float", "The first 3 values.")
    # One decode row.
    q1 = sixteenths(1, 4)
    emit_matrix(lines, "q1", q1, "float", "One query (decode), L = 1.")
    # Masks over (3, 5): row 1 fully masked by the bool mask; the additive mask has finite
    # entries, -inf entries and a fully -inf row 2.
    mask = np.array([[1, 0, 1, 1, 0], [0, 0, 0, 0, 0], [1, 1, 0, 1, 1]], dtype=bool)
    additive = sixteenths(3, 5, -32, 32)
    additive[0, 3] = NINF
    additive[1, 0] = NINF
    additive[2, :] = NINF
    mask_combo = np.array([[1, 1, 1, 0, 1], [1, 0, 1, 1, 1], [0, 1, 1, 1, 1]], dtype=bool)
    additive_combo = sixteenths(3, 5, -32, 32)
    additive_combo[2, 4] = NINF
    emit_matrix(lines, "mask", mask, "bool", "Bool mask (true = attend); row 1 attends to nothing.")
    emit_matrix(lines, "additive", additive, "float", "Additive mask; -inf masks; row 2 is all -inf.")
    emit_matrix(lines, "mask_combo", mask_combo, "bool", "Bool mask for the combined case.")
    emit_matrix(lines, "additive_combo", additive_combo, "float", "Additive mask for the combined case.")
    # Grouped-query attention: Hq = 4, Hkv = 2, E = 2, Ev = 3, L = 3, S = 5.
    q_gqa = sixteenths(3, 4 * 2)
    k_gqa = sixteenths(5, 2 * 2)
    v_gqa = sixteenths(5, 2 * 3)
    emit_matrix(lines, "q_gqa", q_gqa, "float", "GQA queries: 4 heads of E = 2 side by side, L = 3.")
    emit_matrix(lines, "k_gqa", k_gqa, "float", "GQA keys: 2 heads of E = 2, S = 5.")
    emit_matrix(lines, "v_gqa", v_gqa, "float", "GQA values: 2 heads of Ev = 3, S = 5.")
    lines.append("")

    case("cross", q, k, v, "L = 3, S = 5, E = 4, Ev = 2, default scale", weights=True)
    case("cross_scaled", q, k, v, "the same with scale 0.5", scale=0.5)
    case("top_left", q, k, v, "causal top-left (L = 3, S = 5)", weights=True, causal="top_left")
    case("bottom_right", q, k, v, "causal bottom-right (L = 3, S = 5)", weights=True, causal="bottom_right")
    case("long_top_left", q_long, k3, v3, "causal top-left, L = 5 > S = 3", causal="top_left")
    case("long_bottom_right", q_long, k3, v3, "causal bottom-right, L = 5 > S = 3: rows 0, 1 see nothing",
         weights=True, causal="bottom_right")
    case("masked", q, k, v, "bool mask", weights=True, mask=mask)
    case("additive", q, k, v, "additive mask", weights=True, additive=additive)
    case("combo", q, k, v, "bool and additive masks with causal bottom-right", weights=True, mask=mask_combo,
         additive=additive_combo, causal="bottom_right")
    case("decode", q1, k, v, "one query row, L = 1", weights=True)
    case("gqa", q_gqa, k_gqa, v_gqa, "GQA Hq = 4, Hkv = 2", weights=True, hq=4, hkv=2)
    case("gqa_causal", q_gqa, k_gqa, v_gqa, "GQA Hq = 4, Hkv = 2, causal bottom-right, scale 0.75", hq=4, hkv=2,
         causal="bottom_right", scale=0.75)

    lines.append(f"/// The largest float32 error over the cases above: {worst:.2e}.")
    lines.append(f"inline constexpr double float32_error = {worst:.3e};")
    lines.append("")
    lines.append("}  // namespace qkv_test::sdpa")
    out.write_text("\n".join(lines) + "\n")
    print(f"worst float32 error {worst:.2e}; wrote {out}")


if __name__ == "__main__":
    main()
