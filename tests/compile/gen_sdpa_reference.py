#!/usr/bin/python3
"""Writes tests/compile/sdpa_reference.hpp and tests/compile/sdpa_features_reference.hpp: the inputs
and float64 reference results of the compile-time scaled_dot_product_attention proofs
(tests/compile/sdpa_static.cpp, and sdpa_features_static.cpp for the softcap, ALiBi,
sliding window, sinks and log-sum-exp: see sdpa() below for their semantics).

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


def sixteenths(rows, cols, lo=-24, hi=24, rng=RNG):
    """A rows x cols matrix of k/16, k uniform in [lo, hi]: exact in float32."""
    return rng.integers(lo, hi + 1, size=(rows, cols)).astype(np.float64) / 16.0


def alibi_slope(max_bias, h, heads):
    """ggml's ALiBi slope of query head h of `heads`: n = 2^floor(log2 heads), m0 = 2^(-b/n),
    m1 = 2^(-b/(2n)); m0^(h+1) for h < n, else m1^(2(h-n)+1)."""
    n = 2 ** int(math.floor(math.log2(heads)))
    m0, m1 = 2.0 ** (-max_bias / n), 2.0 ** (-max_bias / (2 * n))
    return m0 ** (h + 1) if h < n else m1 ** (2 * (h - n) + 1)


def sdpa(q, k, v, *, dtype=np.float64, scale=None, causal=None, mask=None, additive=None, hq=1, hkv=1,
         softcap=0.0, alibi_slope_=0.0, alibi_max_bias=0.0, window=(-1, -1), align=None, sinks=None):
    """Scaled dot-product attention computed in `dtype` (float64: the reference; float32: how far a
    float32 evaluation lands). q L x (hq*E), k S x (hkv*E), v S x (hkv*Ev), heads side by side in
    the columns. The semantics of qkv/runtime/sdpa.hpp, with s = scale*q.k and query i at key position i + off
    (off = 0 top-left, S - L bottom-right: the causal mode's alignment, else `align`):
        softcap C > 0:  s <- C*tanh(s/C), first;
        ALiBi:          s <- s - slope*|i + off - j| (slope given, or alibi_slope(max_bias, h, hq));
        additive mask:  s <- s + additive (-inf masks);
        window (l, r):  key j allowed only if i + off - l <= j <= i + off + r (-1: unbounded);
        causal, bool mask, window and -inf entries combine by AND;
        sinks sigma_h:  weights e^(s_j - m) / (sum e^(s_j - m) + e^(sigma - m)), m = max(max s, sigma);
        lse:            log sum_j e^(s_j) over the allowed keys (no sink), -inf for a row with none.
    A row with no key left gets zero weights and output (qkv's policy; PyTorch: NaN).
    Returns (output L x hq*Ev, [weights per head], [scores per head], lse hq x L)."""
    t = lambda a: None if a is None else np.asarray(a).astype(dtype)
    q, k, v, additive = t(q), t(k), t(v), t(additive)
    L, S = q.shape[0], k.shape[0]
    e, ev = q.shape[1] // hq, v.shape[1] // hkv
    assert k.shape[1] // hkv == e and hq % hkv == 0
    align = causal if causal is not None else (align or "top_left")
    off = 0 if align == "top_left" else S - L
    i_pos = np.arange(L)[:, None] + off  # query i's key position
    j_pos = np.arange(S)[None, :]
    bias = np.zeros((L, S), dtype=dtype)
    if causal is not None:
        bias[~np.tril(np.ones((L, S), dtype=bool), off)] = -np.inf
    if mask is not None:
        bias[~mask] = -np.inf
    left, right = window
    if left >= 0:
        bias[j_pos < i_pos - left] = -np.inf
    if right >= 0:
        bias[j_pos > i_pos + right] = -np.inf
    distance = np.abs(i_pos - j_pos).astype(dtype)
    scale = dtype(1.0 / math.sqrt(e) if scale is None else scale)
    group = hq // hkv
    outs, weights, scores, lses = [], [], [], []
    for h in range(hq):
        g = h // group  # repeat_interleave: query head h uses K/V head h // group
        qh, kh, vh = q[:, h * e:(h + 1) * e], k[:, g * e:(g + 1) * e], v[:, g * ev:(g + 1) * ev]
        raw = qh @ kh.T * scale
        if softcap:
            cap = dtype(softcap)
            raw = cap * np.tanh(raw / cap)
        slope = alibi_slope_ if alibi_slope_ else (alibi_slope(alibi_max_bias, h, hq) if alibi_max_bias else 0.0)
        if slope:
            raw = raw - dtype(slope) * distance
        sc = raw + additive if additive is not None else raw
        s = sc + bias
        sigma = None if sinks is None else dtype(sinks[h if len(sinks) > 1 else 0])
        w = np.zeros((L, S), dtype=dtype)
        lse = np.full(L, -np.inf, dtype=dtype)
        for i in range(L):
            if np.all(s[i] == -np.inf):
                continue  # nothing to attend to: zeros (qkv's policy; PyTorch: NaN)
            mx = s[i].max()
            m = mx if sigma is None or sigma <= mx else sigma
            e_row = np.exp(s[i] - m)
            denominator = e_row.sum() if sigma is None else e_row.sum() + np.exp(sigma - m)
            w[i] = e_row / denominator
            lse[i] = mx + np.log(np.exp(s[i] - mx).sum())
        outs.append(w @ vh)
        weights.append(w)
        scores.append(sc)  # qkv's scores: before the bool, causal and window masks
        lses.append(lse)
    return np.concatenate(outs, axis=1), weights, scores, np.array(lses)


def sdpa64(q, k, v, **kw):
    """Float64 reference: (output, [weights per query head], [scores per query head])."""
    out, w, sc, _ = sdpa(q, k, v, **kw)
    return out, w, sc


def sdpa32_error(q, k, v, ref, **kw):
    """Max |float32 evaluation - reference|, the same formula in float32."""
    out, _, _, _ = sdpa(q, k, v, dtype=np.float32, **kw)
    return float(np.abs(out.astype(np.float64) - ref).max())


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


def features():
    """sdpa_features_reference.hpp: the options beyond PyTorch's, alone and combined, on odd shapes."""
    rng = np.random.default_rng(20261124)
    six = lambda rows, cols, lo=-24, hi=24: sixteenths(rows, cols, lo, hi, rng)
    out = pathlib.Path(__file__).with_name("sdpa_features_reference.hpp")
    lines = [
        "// Generated by tests/compile/gen_sdpa_reference.py: do not edit.",
        "// Inputs (exact multiples of 1/16) and float64 reference results of scaled dot-product attention",
        "// with softcap, ALiBi, sliding windows, sinks and log-sum-exp (qkv/runtime/sdpa.hpp's semantics,",
        "// computed with NumPy); rows with nothing to attend to are zero, their lse -inf.",
        "#pragma once",
        "",
        "#include <qkv/math.hpp>",
        "#include <qkv/matrix.hpp>",
        "",
        "// clang-format off",
        "namespace qkv_test::sdpa_features {",
        "",
        "template <class T>",
        "inline constexpr T ninf = -qkv::infinity<T>();",
        "",
    ]
    worst = worst_lse = 0.0

    def case(name, q, k, v, what, weights=False, scores=False, **kw):
        nonlocal worst, worst_lse
        ref, w, sc, lse = sdpa(q, k, v, **kw)
        err = sdpa32_error(q, k, v, ref, **kw)
        lse32 = sdpa(q, k, v, dtype=np.float32, **kw)[3].astype(np.float64)
        assert np.array_equal(lse32 == -np.inf, lse == -np.inf)
        finite = lse != -np.inf
        lse_err = float(np.abs(lse32[finite] - lse[finite]).max()) if finite.any() else 0.0
        worst, worst_lse = max(worst, err), max(worst_lse, lse_err)
        empty = int(np.sum(lse == -np.inf))
        print(f"{name}: {what}; |output| max {np.abs(ref).max():.3g}, {empty} empty rows, float32 error {err:.2e}, "
              f"lse {lse_err:.2e}")
        emit_matrix(lines, f"{name}_output", ref, "double", f"{what}: output (float32 error {err:.2e}).")
        emit_matrix(lines, f"{name}_lse", lse, "double", f"{what}: log-sum-exp, one row per query head.")
        for h in range(len(w)) if weights or scores else []:
            suffix = "" if len(w) == 1 else f"_{h}"
            if weights:
                emit_matrix(lines, f"{name}_weights{suffix}", w[h], "double", f"{what}: weights{suffix}.")
            if scores:
                emit_matrix(lines, f"{name}_scores{suffix}", sc[h], "double", f"{what}: scores{suffix}.")
        lines.append("")

    # L = 3 queries over S = 17 keys, E = 4, Ev = 3; L = 17 over S = 5; one decode row.
    qa, ka, va = six(3, 4), six(17, 4), six(17, 3)
    qb, kb, vb = six(17, 4), six(5, 4), six(5, 3)
    qd = six(1, 4)
    mask_a = rng.random((3, 17)) > 0.2
    mask_a[1, :] = False
    additive_a = six(3, 17, -32, 32)
    additive_a[0, 5] = additive_a[2, 16] = additive_a[2, 0] = NINF
    mask_b = rng.random((17, 5)) > 0.2
    mask_b[14, :] = False
    additive_b = six(17, 5, -32, 32)
    additive_b[16, 4] = additive_b[9, 1] = NINF
    # Grouped-query: Hq = 12 heads of E = 4 over Hkv = 4 (Ev = 2), L = 5, S = 17; Hq = 3 over 1.
    qg, kg, vg = six(5, 12 * 4), six(17, 4 * 4), six(17, 4 * 2)
    mask_g = rng.random((5, 17)) > 0.25
    sinks_g = rng.integers(-16, 17, size=(1, 12)).astype(np.float64) / 8.0
    sinks_g[0, 5] = NINF
    q3h, k3h, v3h = six(3, 3 * 4), six(5, 4), six(5, 3)
    for name, m, kind, what in [
        ("qa", qa, "float", "Queries, L = 3, E = 4."), ("ka", ka, "float", "Keys, S = 17, E = 4."),
        ("va", va, "float", "Values, S = 17, Ev = 3."), ("qb", qb, "float", "Queries, L = 17, E = 4 (L > S)."),
        ("kb", kb, "float", "Keys, S = 5, E = 4."), ("vb", vb, "float", "Values, S = 5, Ev = 3."),
        ("qd", qd, "float", "One query (decode), against ka, va."),
        ("mask_a", mask_a, "bool", "Bool mask over (3, 17); row 1 attends to nothing."),
        ("additive_a", additive_a, "float", "Additive mask over (3, 17), with -inf entries."),
        ("mask_b", mask_b, "bool", "Bool mask over (17, 5); row 14 attends to nothing."),
        ("additive_b", additive_b, "float", "Additive mask over (17, 5), with -inf entries."),
        ("qg", qg, "float", "GQA queries: 12 heads of E = 4, L = 5."),
        ("kg", kg, "float", "GQA keys: 4 heads of E = 4, S = 17."),
        ("vg", vg, "float", "GQA values: 4 heads of Ev = 2, S = 17."),
        ("mask_g", mask_g, "bool", "Bool mask over (5, 17) for the GQA cases."),
        ("sinks_g", sinks_g, "float", "One sink per query head of the GQA case; head 5's is -inf (none)."),
        ("q3h", q3h, "float", "3 query heads of E = 4, L = 3."), ("k3h", k3h, "float", "1 K/V head, S = 5."),
        ("v3h", v3h, "float", "1 K/V head, Ev = 3."),
    ]:
        emit_matrix(lines, name, m, kind, what)
    emit_matrix(lines, "slopes_12", np.array([[alibi_slope(8.0, h, 12) for h in range(12)]]), "double",
                "ggml's ALiBi slopes, max_bias 8 over 12 heads (n = 8).")
    emit_matrix(lines, "slopes_3", np.array([[alibi_slope(4.0, h, 3) for h in range(3)]]), "double",
                "ggml's ALiBi slopes, max_bias 4 over 3 heads (n = 2).")
    lines.append("")

    case("softcap", qa, ka, va, "softcap 2, scale 1", weights=True, scores=True, scale=1.0, softcap=2.0)
    case("softcap_masked", qa, ka, va, "softcap 2, scale 1, bool and additive masks", weights=True, scale=1.0,
         softcap=2.0, mask=mask_a, additive=additive_a)
    case("alibi_top_left", qa, ka, va, "ALiBi slope 0.25, top-left", scores=True, alibi_slope_=0.25)
    case("alibi_bottom_right", qa, ka, va, "ALiBi slope 0.25, alignment bottom-right", alibi_slope_=0.25,
         align="bottom_right")
    case("alibi_causal", qa, ka, va, "ALiBi slope 0.25, causal bottom-right", alibi_slope_=0.25,
         causal="bottom_right")
    case("window_top_left", qa, ka, va, "window (2, 1), top-left", weights=True, window=(2, 1))
    case("window_bottom_right", qa, ka, va, "window (4, 0), alignment bottom-right", weights=True, window=(4, 0),
         align="bottom_right")
    case("window_causal_long", qb, kb, vb, "window (1, 0), causal bottom-right, L = 17 > S = 5", weights=True,
         window=(1, 0), causal="bottom_right")
    case("window_long", qb, kb, vb, "window (2, 2), top-left, L = 17 > S = 5", window=(2, 2))
    case("window_masked", qa, ka, va, "window (3, 3), causal top-left, bool mask", window=(3, 3),
         causal="top_left", mask=mask_a)
    case("sink", qa, ka, va, "sink 0.5", weights=True, sinks=[0.5])
    case("sink_masked", qa, ka, va, "sink 1, bool mask (row 1 empty)", weights=True, sinks=[1.0], mask=mask_a)
    case("sink_dominant", qa, ka, va, "sink 12, above every score", weights=True, sinks=[12.0])
    case("decode", qd, ka, va, "one query: causal bottom-right, window (4, 0), softcap 3, ALiBi 0.5, sink 0.25",
         weights=True, causal="bottom_right", window=(4, 0), softcap=3.0, alibi_slope_=0.5, sinks=[0.25])
    case("combo_long", qb, kb, vb, "L = 17 > S = 5, everything: scale 0.75, causal bottom-right, window (2, 0), "
         "softcap 4, ALiBi 0.125, sink 0.25, bool and additive masks", weights=True, scale=0.75,
         causal="bottom_right", window=(2, 0), softcap=4.0, alibi_slope_=0.125, sinks=[0.25], mask=mask_b,
         additive=additive_b)
    case("gqa_alibi", qg, kg, vg, "GQA Hq = 12 over Hkv = 4, ALiBi max_bias 8", hq=12, hkv=4, alibi_max_bias=8.0)
    case("gqa_combo", qg, kg, vg, "GQA 12 over 4: causal bottom-right, window (6, 1), softcap 5, ALiBi max_bias 8, "
         "sinks, bool mask", hq=12, hkv=4, causal="bottom_right", window=(6, 1), softcap=5.0, alibi_max_bias=8.0,
         sinks=list(sinks_g[0]), mask=mask_g)
    case("heads3", q3h, k3h, v3h, "Hq = 3 over Hkv = 1, ALiBi max_bias 4, window (1, -1)", hq=3, hkv=1,
         alibi_max_bias=4.0, window=(1, -1))

    lines.append(f"/// The largest float32 error of the outputs over the cases above: {worst:.2e}; of the lse: {worst_lse:.2e}.")
    lines.append(f"inline constexpr double float32_error = {worst:.3e};")
    lines.append(f"inline constexpr double float32_lse_error = {worst_lse:.3e};")
    lines.append("")
    lines.append("}  // namespace qkv_test::sdpa_features")
    out.write_text("\n".join(lines) + "\n")
    print(f"worst float32 error {worst:.2e}; wrote {out}")


if __name__ == "__main__":
    main()
    features()
