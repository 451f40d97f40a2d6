// The host–shader contract of the score rules beyond PyTorch's SDPA (qkv/runtime/sdpa.hpp): softcap,
// ALiBi, the sliding window, sinks and the log-sum-exp, shared by every attention kernel that
// applies them (flash.comp, flash_cpu.comp, flash_weights.comp, sdpa_decode.comp, sdpa_merge.comp)
// through shaders/score_rules.glsl, and attention dropout (shaders/dropout.glsl), which the fused
// kernels and the backward kernels apply. See common.h for the convention.
//
// Which rules a call uses is a set of SCORE_* bits: a specialization constant of each kernel
// (FLASH_SPEC_FEATURES, FLASH_CPU_SPEC_FEATURES, DECODE_SPEC_FEATURES; a call without them builds
// no code for them), and score_params::features for the kernels that read it at run time
// (flash_weights.comp, sdpa_merge.comp). Their values travel in one storage buffer, the "params"
// binding of each kernel, written by the host once per call:
//
//   score_params                     64 bytes: the window's sides, the softcap, ALiBi's far part, the
//                                    features, dropout's seed, offset, threshold and scale
//   vec2 heads[q_heads]              per query head h: (ALiBi slope of h, sink logit of h)
//
// The slopes are ggml's (qkv::alibi_slope, computed by the host in float64 and rounded once); a
// head without a sink has -inf.
//
// Positions. The kernels see query row i at position p = i + off', off' a 32-bit offset (their push
// block's causal_offset), and key j at distance d = j - p. The host reduces the call's off (up to
// ±2^62) and window sides (up to 2^63 - 1) to off' in [-2^30, 2^30] and sides in [-1, 2^31 - 1] that
// keep every rule's answer (kernels/score_positions.hpp: reduce_positions): where every key lies
// on one side of every row (|off| >= 2^30 with q_len + kv_len <= 2^30) the causal rule is all or
// nothing, one window side cuts at a point the reduced side keeps, and ALiBi's distances differ
// from the reduced ones by one constant, alibi_far. ALiBi is applied relative to each row's nearest key
// (score_rules.glsl: rule_score), so the row's largest bias is 0 and the bias's float32 rounding
// stays that of the distances within the row; the part left out, slope·(near + alibi_far), is
// subtracted from the row's log-sum-exp and added to its sink logit, where it does not cancel.
#ifndef QKV_CONTRACT_SCORE_H
#define QKV_CONTRACT_SCORE_H

#include "common.h"
#ifdef __cplusplus
#include <cmath>
#include <limits>
#endif

QKV_CONTRACT_BEGIN

#ifdef __cplusplus
using std::abs;
using std::exp;
#endif

struct score_params {
    int window_left, window_right;  // key j may be attended from position p = i + off' when
                                    // p - window_left <= j <= p + window_right; -1: that side unbounded
    float softcap;                  // C > 0: s <- C·tanh(s / C) (at least the smallest normal float)
    float softcap_prescale;         // 1, or 2^-32 where 1 / C is below the smallest normal float
    float softcap_inverse;          // 1 / (C · prescale), rounded once by the host (softcap_factors_of)
    float alibi_far;                // ALiBi: what the reduction took off every row's distance to its nearest key
    uint features;                  // SCORE_* below
    // Dropout (SCORE_DROPOUT; contract/philox.h, shaders/dropout.glsl): the 64-bit seed and offset
    // as (low, high) words, the keep threshold ceil(p·2^32) (qkv::dropout_threshold) and 1 / (1 - p).
    uint dropout_seed_lo, dropout_seed_hi;
    uint dropout_offset_lo, dropout_offset_hi;
    uint dropout_threshold;
    float dropout_scale;
    uint pad0, pad1, pad2;
};

QKV_CONST uint SCORE_SOFTCAP = 1u;   // s <- C·tanh(s / C), first
QKV_CONST uint SCORE_ALIBI = 2u;     // s <- s - slope_h·|i + off - j|, after the softcap
QKV_CONST uint SCORE_WINDOW = 4u;    // the sliding window (ANDed with causal and the masks)
QKV_CONST uint SCORE_SINKS = 8u;     // sink logits join each row's softmax denominator
QKV_CONST uint SCORE_LSE = 16u;      // the kernel writes each row's log-sum-exp (sinks not included)
QKV_CONST uint SCORE_DROPOUT = 32u;  // attention dropout: a weight is kept (scaled by 1 / (1 - p)) or dropped
QKV_CONST uint SCORE_FEATURES_ALL = 63u;
/// The rules that may change or exclude a score on any key step, not only at the masks, the last
/// keys or the causal diagonal: with one of them, the kernels that skip the score rules on the
/// other steps (flash_cpu.comp, sdpa_decode.comp, flash_bwd_dq.comp, flash_bwd_dkdv.comp) run
/// them on every step. A new rule that changes every score belongs here.
QKV_CONST uint SCORE_EVERY_STEP = SCORE_SOFTCAP | SCORE_ALIBI | SCORE_WINDOW;

/// Bytes before the per-head values (vec2 per query head) in the params buffer.
QKV_CONST uint SCORE_PARAMS_HEAD_OFFSET = 64u;

/// The reduced positions: |off'| <= SCORE_POSITION_LIMIT, and with the causal rule, a window or
/// ALiBi q_len + kv_len <= SCORE_POSITION_LIMIT, so that p = i + off', d = j - p and
/// p ± side + 1 stay within 32 bits (score_rules.glsl).
QKV_CONST int SCORE_POSITION_LIMIT = 1 << 30;

// The softcap, C·tanh(s / C), written once for both sides: the kernels call it (score_rules.glsl)
// and tests/score_rules_test.cpp measures its error over every binade on the host. With x = s / C:
//   |x| < 1:  s·(tanh(x) / x) = s + s·z·P(z), z = x², P a degree-6 polynomial fitted to
//             (tanh(x)/x − 1) / z on [0, 1] (its error below 0.07 ulp): no C multiplies an
//             error, and for C far above s the result tends to s;
//   |x| >= 1: C·tanh(|x|)·sign(x), tanh(|x|) = 1 − 2e / (1 + e), e = exp(−2|x|) <= e^−2: no
//             overflow for any x, and exp's error scaled down by e.
// Relative error: at most 2.7 units of 2^-24 with glibc's expf, 5.7 with the worst exp and
// division the Vulkan spec allows (3 + 2|x| ulp, 2.5 ulp). x = (s·prescale)·inverse, the host's
// 1/C split so that both factors are normal floats (a device may flush a subnormal 1/C, for C
// above 2^126, to zero): no division by a C whose quotient the spec leaves undefined.
QKV_CONST float SOFTCAP_P0 = -3.333329856e-01f;
QKV_CONST float SOFTCAP_P1 = 1.333241165e-01f;
QKV_CONST float SOFTCAP_P2 = -5.388410762e-02f;
QKV_CONST float SOFTCAP_P3 = 2.149940841e-02f;
QKV_CONST float SOFTCAP_P4 = -7.965224795e-03f;
QKV_CONST float SOFTCAP_P5 = 2.315473510e-03f;
QKV_CONST float SOFTCAP_P6 = -3.625251411e-04f;

QKV_FUNCTION float softcapped(float s, float c, float prescale, float inverse) {
    const float x = (s * prescale) * inverse;
    const float z = x * x;
    float p = SOFTCAP_P6;
    p = p * z + SOFTCAP_P5;
    p = p * z + SOFTCAP_P4;
    p = p * z + SOFTCAP_P3;
    p = p * z + SOFTCAP_P2;
    p = p * z + SOFTCAP_P1;
    p = p * z + SOFTCAP_P0;
    const float small = s + s * (z * p);
    const float e = exp(-2.0f * abs(x));
    const float t = 1.0f - (2.0f * e) / (1.0f + e);
    const float large = (x < 0.0f ? -c : c) * t;
    return abs(x) < 1.0f ? small : large;  // NaN takes the exp branch and stays NaN
}

#ifdef __cplusplus
/// The softcap's values as softcapped takes them: C, at least the smallest normal float (a
/// subnormal C may be flushed to zero on a device; every capped score lies within ±C, below what
/// the softmax can tell from 0 either way), and 1/C, rounded once from float64, as prescale ·
/// inverse with both normal floats.
struct softcap_factors {
    float c, prescale, inverse;
};
inline softcap_factors softcap_factors_of(float softcap) {
    const float smallest = std::numeric_limits<float>::min();
    const float c = softcap < smallest ? smallest : softcap;
    const double inverse = 1.0 / static_cast<double>(c);
    const float prescale = inverse < static_cast<double>(smallest) ? 0x1p-32f : 1.0f;
    return {c, prescale, static_cast<float>(inverse / static_cast<double>(prescale))};
}
#endif

QKV_CONTRACT_END

QKV_CONTRACT_CHECK(sizeof(qkv::contract::score_params) == qkv::contract::SCORE_PARAMS_HEAD_OFFSET)

#endif
