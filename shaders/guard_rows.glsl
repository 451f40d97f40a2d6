// The overflow guard's row norm, one place for the shaders that run the guard's rows pass
// (sdpa_guard.comp; sdpa_merge.comp's QKV_MERGE_GUARD form; sdpa_decode.comp over q's texels): over
// a row's finite elements, its largest |element| m, then m·sqrt(Σ (x/m)²), so that no square leaves
// float32 (the result does only where the norm is beyond the rule's 2^127 anyway); `bad` is set by
// any NaN or Inf. Each loop runs d iterations (at most 4,096: the hosts' limit), far below
// llvmpipe's 65,535.
bool guard_finite(float x) { return !isnan(x) && !isinf(x); }

// Defines `float NAME(uint at, uint d, inout bool bad)` over the row of d values of ROWS from `at`.
#define QKV_GUARD_ROW_NORM(NAME, ROWS)                              \
    float NAME(uint at, uint d, inout bool bad) {                   \
        float m = 0.0;                                              \
        for (uint c = 0u; c < d; ++c) {                             \
            const float x = float(ROWS[at + c]);                    \
            if (guard_finite(x)) m = max(m, abs(x)); else bad = true; \
        }                                                           \
        float s = 0.0;                                              \
        if (m > 0.0)                                                \
            for (uint c = 0u; c < d; ++c) {                         \
                const float x = float(ROWS[at + c]);                \
                if (guard_finite(x)) s += (x / m) * (x / m);        \
            }                                                       \
        return m * sqrt(s);                                         \
    }

// The same norm over rows of texels (4 values each, zeros past the row's end, which add
// nothing), in the same order as QKV_GUARD_ROW_NORM: guard_max4 over every texel of the row,
// then, where m > 0, guard_sum4 over every texel; the norm is m·sqrt(s). For the decode kernels,
// which fold q's row norms in as they read q (sdpa_decode.comp, DECODE_SPEC_GUARD).
void guard_max1(float x, inout float m, inout bool bad) {
    if (guard_finite(x)) m = max(m, abs(x)); else bad = true;
}
void guard_max4(vec4 t, inout float m, inout bool bad) {
    guard_max1(t.x, m, bad);
    guard_max1(t.y, m, bad);
    guard_max1(t.z, m, bad);
    guard_max1(t.w, m, bad);
}
float guard_square(float x, float m) { return guard_finite(x) ? (x / m) * (x / m) : 0.0; }
void guard_sum4(vec4 t, float m, inout float s) {
    s += guard_square(t.x, m);
    s += guard_square(t.y, m);
    s += guard_square(t.z, m);
    s += guard_square(t.w, m);
}

// Defines `float NAME(uint at, uint e4, inout bool bad)`: the norm of the row of e4 texels of the
// uniform texel buffer TEX from texel `at`. Each loop runs e4 iterations (at most 1,024).
#define QKV_GUARD_TEXEL_NORM(NAME, TEX)                                                      \
    float NAME(uint at, uint e4, inout bool bad) {                                           \
        float m = 0.0;                                                                       \
        for (uint c = 0u; c < e4; ++c) guard_max4(texelFetch(TEX, int(at + c)), m, bad);     \
        float s = 0.0;                                                                       \
        if (m > 0.0)                                                                         \
            for (uint c = 0u; c < e4; ++c) guard_sum4(texelFetch(TEX, int(at + c)), m, s);   \
        return m * sqrt(s);                                                                  \
    }
