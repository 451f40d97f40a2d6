// What the backward kernels (flash_bwd_dq.comp, flash_bwd_dkdv.comp, flash_bwd_dq_dr.comp) share
// beyond the score rules: which rows a block of keys can be seen from, the softcap's derivative,
// and the check of a row's saved lse and out. Include after score_rules.glsl.

/// The rows [first, end) within [0, q_len) from which some key of [k_first, k_last] may be attended
/// by the causal rule and the window alone (the inverse of score_rules.glsl's visible_keys): the
/// dk/dv kernel skips every step of rows outside them. Positions as the forward's: row i sits at
/// i + off (kernels/score_positions.hpp: |off| <= 2^30, q_len + kv_len <= 2^30 with a positional
/// rule) and a side is at most 2^31 - 1, so no sum here leaves 32 bits: a side is applied only
/// where it cuts into [0, q_len).
uvec2 visible_rows(int k_first, int k_last, int off, uint features, bool causal, score_params sp, uint q_len) {
    int first = 0, end = int(q_len);
    const int t = k_first - off;
    if (causal) first = max(first, t);  // j <= i + off
    if ((features & SCORE_WINDOW) != 0u) {
        // j <= i + off + right: rows from t - right, where that is above 0 (right < t)
        if (sp.window_right >= 0 && sp.window_right < t) first = max(first, t - sp.window_right);
        const int x = k_last - off + 1;  // i + off - left <= j: rows below x + left
        if (sp.window_left >= 0 && x < end && sp.window_left < end - x) end = x + sp.window_left;
    }
    if (end <= first) return uvec2(0u, 0u);
    return uvec2(uint(first), uint(end));
}

/// d(C·tanh(r / C)) / dr = 1 - tanh²(x), x = r / C taken as contract/score.h's softcapped takes
/// it ((r·prescale)·inverse: no division by a C whose quotient the Vulkan spec leaves undefined,
/// so any C the forward takes), as 4e / (1 + e)² with e = e^(-2|x|): no cancellation near
/// |tanh| = 1 (1 - (capped / C)² would lose its relative precision there) and no overflow for any
/// r (NaN stays NaN).
float softcap_slope(float r, score_params sp) {
    const float x = (r * sp.softcap_prescale) * sp.softcap_inverse;
    const float e = exp(-2.0 * abs(x));
    const float u = 1.0 + e;
    return 4.0 * e / (u * u);
}

/// The check of one row's saved lse and out (BWD_CHECK) against its sums over the keys, `check`
/// = (Σ P, Σ P·dP, Σ P·|dP|, keys allowed), with the row statistics `st`: the CPU reference's rules
/// (qkv::cpu::sdpa_backward): lse -inf exactly where no key is allowed; the probabilities (with the
/// sink's) sum to 1 and Σ P·dP = D, within 1 %. The BWD_FLAG_* bits it breaks (0: none); row at
/// position p of a head with ALiBi slope `slope`.
uint saved_row_verdict(vec4 st, vec4 check, int p, uint kv_len, uint features, score_params sp, float slope, uint head) {
    const float neg_inf = uintBitsToFloat(0xff800000u);
    const float saved = st.w, total = st.x, dd = st.y;
    // lse' (total) is relative to ALiBi's nearest key, as the scores: so is the sink here.
    const float drop = alibi_drop(p, kv_len, features, sp, slope);
    const float sink = (features & SCORE_SINKS) != 0u ? head_values[head].y + drop : neg_inf;
    if (isnan(saved) || isnan(total)) return 0u;  // a poisoned row: NaN, as its forward
    uint bad = 0u;
    if ((saved == neg_inf) != (check.w == 0.0)) {
        bad = BWD_FLAG_NO_KEY;
    } else if (saved != neg_inf) {
        const float mass = check.x + (sink == neg_inf ? 0.0 : exp(sink - total));
        if (!isinf(mass) && !isnan(mass) && !(abs(mass - 1.0) <= BWD_SAVED_TOLERANCE)) bad = BWD_FLAG_BAD_LSE;
        const float d_p = check.y, spread = check.z + st.z;
        if (!isinf(dd) && !isnan(dd) && !isinf(d_p) && !isnan(d_p) && !(abs(dd - d_p) <= BWD_SAVED_TOLERANCE * spread))
            bad |= BWD_FLAG_BAD_OUT;
    }
    return bad;
}
