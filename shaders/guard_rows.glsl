// The overflow guard's row norm, one place for the shaders that run the guard's rows pass
// (sdpa_guard.comp; sdpa_merge.comp's QKV_MERGE_GUARD form): over a row's finite elements, its
// largest |element| m, then m·sqrt(Σ (x/m)²), so that no square leaves float32 (the result does
// only where the norm is beyond the rule's 2^127 anyway); `bad` is set by any NaN or Inf. Each loop
// runs d iterations (at most 4,096: the hosts' limit), far below llvmpipe's 65,535.
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
