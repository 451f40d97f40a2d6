#version 450
#extension GL_GOOGLE_include_directive : require
// The backward pass's first step (contract/backward.h): for each query row, from the loss's
// gradient dO and the forward's saved output O and log-sum-exp,
//   D = Σ_c dO_c·O_c,  Σ_c |dO_c·O_c|,  lse' = log(e^lse + e^σ) (the head's sink σ; lse without one)
// and the sink's term -e^(σ - lse')·D; with ALiBi, lse' is relative as the kernels' scores are
// (score_rules.glsl: rule_score): lse and σ both raised by the row's alibi_drop (its gradient's share from this row, summed per head by
// flash_bwd_fold.comp), into the row statistics that flash_bwd_dq.comp and flash_bwd_dkdv.comp
// read. One invocation per padded row slot (B·Hq·npad_q); a padding row gets lse' = +inf, so that
// every probability recomputed for it is 0. Its only loop runs over the Ev columns.
// A NaN or infinity in dO or O, or a NaN or +inf lse, sets BWD_FLAG_NONFINITE_INPUT.
#include "precision.glsl"
#include "contract/backward.h"
#include "contract/score.h"
#define QKV_SCORE_PARAMS_BINDING BWD_PREP_BINDING_PARAMS
#include "score_rules.glsl"

layout(local_size_x_id = BWD_SMALL_SPEC_WG, local_size_y = 1, local_size_z = 1) in;

layout(std430, binding = BWD_PREP_BINDING_DO) readonly buffer DO { QKV_T d_out[]; };
layout(std430, binding = BWD_PREP_BINDING_OUT) readonly buffer Out { float o[]; };
layout(std430, binding = BWD_PREP_BINDING_LSE) readonly buffer Lse { float lse[]; };
layout(std430, binding = BWD_PREP_BINDING_STATS) writeonly buffer Stats { vec4 stats[]; };
layout(std430, binding = BWD_PREP_BINDING_SINKS) writeonly buffer Sinks { float sink_terms[]; };
layout(std430, binding = BWD_PREP_BINDING_VERDICT) buffer Verdict { uint verdict[]; };

layout(push_constant) uniform Push { bwd_prep_push pc; };

bool finite(float x) { return !isnan(x) && !isinf(x); }

void main() {
    const uint n = (gl_WorkGroupID.x + pc.group_x) * gl_WorkGroupSize.x + gl_LocalInvocationID.x;
    if (n >= pc.rows) return;
    const float pos_inf = uintBitsToFloat(0x7f800000u), neg_inf = uintBitsToFloat(0xff800000u);
    const uint z = n / pc.npad_q, i = n % pc.npad_q;
    if (i >= pc.q_len) {
        stats[n] = vec4(pos_inf, 0.0, 0.0, 0.0);
        return;
    }
    const uint r = z * pc.q_len + i;
    float d = 0.0, spread = 0.0;
    bool inputs_finite = true;
    for (uint c = 0; c < pc.dv; ++c) {
        const float g = float(d_out[pc.do_off + r * pc.dv + c]), x = o[r * pc.dv + c];
        inputs_finite = inputs_finite && finite(g) && finite(x);
        const float t = g * x;
        d += t;
        spread += abs(t);
    }
    const float saved = lse[r];
    // ALiBi's scores are relative to the row's nearest key, raised by its drop over their true
    // values: the saved lse and the sink meet them raised by as much (the forward's own method).
    float drop = 0.0;
    if ((pc.features & SCORE_ALIBI) != 0u)
        drop = alibi_drop(int(i) + pc.causal_offset, pc.kv_len, SCORE_ALIBI, score_in, head_values[z % pc.heads].x);
    const float raw_sink = (pc.features & SCORE_SINKS) != 0u ? head_values[z % pc.heads].y : neg_inf;
    const float sink = raw_sink + drop;
    // lse' = log(e^lse + e^σ) without overflow; -inf where both are (no key, no sink)
    float total = saved + drop;
    if (sink != neg_inf && !isnan(saved)) {
        const float m = max(saved + drop, sink);
        total = m + log(exp(saved + drop - m) + exp(sink - m));
    }
    stats[n] = vec4(total, d, spread, saved);
    if ((pc.features & SCORE_SINKS) != 0u)
        sink_terms[r] = sink == neg_inf ? 0.0 : -exp(sink - total) * d;
    // (D itself may overflow from finite inputs: the gradients then show it, BWD_FLAG_NONFINITE_GRADIENT.)
    if (!inputs_finite || isnan(saved) || saved == pos_inf) atomicOr(verdict[0], BWD_FLAG_NONFINITE_INPUT);
}
