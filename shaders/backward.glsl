// What the backward kernels (flash_bwd_dq.comp, flash_bwd_dkdv.comp) share beyond the score rules:
// which rows a block of keys can be seen from, and the softcap's derivative. Include after
// score_rules.glsl.

/// The rows [first, end) within [0, q_len) from which some key of [k_first, k_last] may be attended
/// by the causal rule and the window alone (the inverse of score_rules.glsl's visible_keys): the
/// dk/dv kernel skips every step of rows outside them. Positions as the forward's: row i sits at
/// i + off; the host keeps q_len, kv_len and |off| below 2^30 and the window's sides below 2^30,
/// so no sum here leaves 32 bits.
uvec2 visible_rows(int k_first, int k_last, int off, uint features, bool causal, score_params sp, uint q_len) {
    int first = 0, end = int(q_len);
    if (causal) first = max(first, k_first - off);  // j <= i + off
    if ((features & SCORE_WINDOW) != 0u) {
        if (sp.window_right >= 0) first = max(first, k_first - off - sp.window_right);  // j <= i + off + right
        const int x = k_last - off + 1;  // i + off - left <= j: rows below x + left
        if (sp.window_left >= 0 && x < end && sp.window_left < end - x) end = x + sp.window_left;
    }
    if (end <= first) return uvec2(0u, 0u);
    return uvec2(uint(first), uint(end));
}

/// d(C·tanh(r / C)) / dr = 1 - tanh²(r / C), as 4e / (1 + e)² with e = e^(-2|r| / C): no
/// cancellation near |tanh| = 1 and no overflow for any r (NaN stays NaN).
float softcap_slope(float r, score_params sp) {
    const float e = exp(-2.0 * abs(r) / sp.softcap);
    const float u = 1.0 + e;
    return 4.0 * e / (u * u);
}
