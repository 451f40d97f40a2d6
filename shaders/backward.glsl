// What the backward kernels (flash_bwd_dq.comp, flash_bwd_dkdv.comp) share beyond the score rules:
// which rows a block of keys can be seen from, and the softcap's derivative. Include after
// score_rules.glsl.

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
