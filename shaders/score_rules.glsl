// The score rules of scaled_dot_product_attention beyond the dot product, written once for every
// attention kernel (flash.comp, flash_cpu.comp, flash_weights.comp, sdpa_decode.comp,
// sdpa_merge.comp), in the order of qkv/runtime/sdpa.hpp:
//
//   s = scale·q·k                 (the kernel's dot product, with q pre-scaled)
//   s = C·tanh(s / C)             SCORE_SOFTCAP (contract/score.h: softcapped)
//   s = s - slope_h·|d|           SCORE_ALIBI, d = j - (i + off), applied relative to the row's
//                                 nearest key (rule_score, alibi_drop)
//   s = s + additive mask         MASK_FLAG_ADDITIVE
//   -inf unless key j passes:     causal (d <= 0), the window (-left <= d <= right), the bool mask
//
// and the end of a row: its normalisation with a sink logit (SCORE_SINKS) and its log-sum-exp
// (SCORE_LSE). The contract (values, bits, the params buffer's layout) is contract/score.h.
//
// Include after contract/score.h and mask.h, with QKV_SCORE_PARAMS_BINDING defined as the
// kernel's binding of the params buffer.

layout(std430, binding = QKV_SCORE_PARAMS_BINDING) readonly buffer ScoreParams {
    score_params score_in;
    vec2 head_values[];  // per query head: (ALiBi slope, sink logit)
};

float score_neg_inf() { return uintBitsToFloat(0xff800000u); }

/// The params of a call without rules (a kernel whose FEATURES constant is 0 reads none).
score_params no_score_params() {
    return score_params(-1, -1, 1.0, 1.0, 1.0, 0.0, 0u, 0u, 0u, 0u, 0u, 0u, 1.0, 0u, 0u, 0u);
}

/// Distance from position p to the nearest key of [0, kv_len): ALiBi's reference for a row at p
/// (0 inside the keys). |p| < 2^31 - kv_len (contract/score.h: SCORE_POSITION_LIMIT).
int nearest_key_distance(int p, uint kv_len) { return p < 0 ? -p : max(p - int(kv_len) + 1, 0); }

/// Whether the window admits a key at distance d = j - p from the row's position.
bool window_admits(int d, score_params sp) {
    return (sp.window_left < 0 || d >= -sp.window_left) && (sp.window_right < 0 || d <= sp.window_right);
}

/// The final score of a key at distance d from the row's position, from s = scale·q·k: -inf where
/// the key may not be attended. `near`: the row's nearest_key_distance (ALiBi is applied relative
/// to it: the row's largest bias is 0, and slope·(near + alibi_far) is the row's alibi_drop);
/// `mask_bit`: the bool mask's entry (read only with MASK_FLAG_BOOLEAN); `add`: the additive
/// mask's entry (with MASK_FLAG_ADDITIVE); `slope`: the row's head's ALiBi slope (with SCORE_ALIBI).
float rule_score(float s, int d, int near, uint features, uint masks, score_params sp, float slope, bool mask_bit,
                 float add) {
    if ((features & SCORE_SOFTCAP) != 0u) s = softcapped(s, sp.softcap, sp.softcap_prescale, sp.softcap_inverse);
    if ((features & SCORE_ALIBI) != 0u) s -= slope * float(abs(d) - near);  // abs(d) - near in [0, kv_len)
    if ((masks & MASK_FLAG_ADDITIVE) != 0u) s += add;
    bool ok = true;
    if ((masks & MASK_FLAG_CAUSAL) != 0u) ok = d <= 0;
    if ((features & SCORE_WINDOW) != 0u) ok = ok && window_admits(d, sp);
    if ((masks & MASK_FLAG_BOOLEAN) != 0u) ok = ok && mask_bit;
    return ok ? s : score_neg_inf();
}

/// What ALiBi's relative scores leave out of every score of the row at position p: slope·(the
/// row's true distance to its nearest key) >= 0. The row's log-sum-exp is lower by it, and its
/// sink logit is raised by it to meet the relative scores. 0 without ALiBi.
float alibi_drop(int p, uint kv_len, uint features, score_params sp, float slope) {
    if ((features & SCORE_ALIBI) == 0u) return 0.0;
    return slope * (float(nearest_key_distance(p, kv_len)) + sp.alibi_far);
}

/// The keys [first, end) within [lo, hi) that rows at positions p_first .. p_last (i + off') may
/// attend by the causal rule and the window alone: a kernel skips every key tile outside them.
/// No sum overflows for positions within ±2^31 - 1 and sides up to 2^31 - 1: a side is applied
/// only where it cuts into [lo, hi).
uvec2 visible_keys(int p_first, int p_last, uint features, bool causal, score_params sp, uint lo, uint hi) {
    int first = int(lo), end = int(hi);
    if (causal) end = min(end, p_last + 1);
    if ((features & SCORE_WINDOW) != 0u) {
        // p_last + right + 1 < end, without the sum: p_last < end and right < end - 1 - p_last,
        // the difference taken in uint (it is below 2^32).
        if (sp.window_right >= 0 && p_last < end && uint(sp.window_right) < uint(end - 1) - uint(p_last))
            end = p_last + sp.window_right + 1;
        // p_first - left > first: only where p_first > first >= 0, so the difference stays in range.
        if (sp.window_left >= 0 && p_first > first && p_first - sp.window_left > first) first = p_first - sp.window_left;
    }
    if (end <= first) return uvec2(lo, lo);
    return uvec2(uint(first), uint(end));
}

/// What a row's accumulator is multiplied by at the end: 1 / (l + e^(sink - m)), or 1 / l without
/// a sink; 0 for a row with nothing to attend (l = 0). m and l: the row's running maximum and sum
/// (sum of e^(s_j - m)), finite; the sink -inf for none. Never overflows: with a sink above m the
/// numerator and denominator are both taken relative to the sink.
float row_normaliser(float m, float l, uint features, float sink) {
    if (l == 0.0) return 0.0;
    if ((features & SCORE_SINKS) == 0u || sink <= m) {
        const float extra = (features & SCORE_SINKS) != 0u ? exp(sink - m) : 0.0;
        return 1.0 / (l + extra);
    }
    const float t = exp(m - sink);
    return t / (l * t + 1.0);
}

/// A row's output from its accumulator: acc / l without a sink (0 for l = 0), acc times
/// row_normaliser with one.
vec4 normalised(vec4 acc, float m, float l, uint features, float sink) {
    if ((features & SCORE_SINKS) != 0u) return acc * row_normaliser(m, l, features, sink);
    return l > 0.0 ? acc / l : vec4(0.0);
}

/// A row's log-sum-exp from its maximum and sum: -inf for a row with nothing to attend (l = 0),
/// NaN for a poisoned row (NaN l, or `poisoned`). `drop`: the row's alibi_drop (0 without ALiBi).
float row_lse(float m, float l, bool poisoned, float drop) {
    if (poisoned || isnan(l)) return uintBitsToFloat(0x7fc00000u);
    if (l == 0.0) return score_neg_inf();
    return (m + log(l)) - drop;
}
