#version 450
#extension GL_GOOGLE_include_directive : require
#ifdef QKV_SUBGROUP_VOTE
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_vote : require
#endif
// Merges the P partial softmax states (m, l, acc) of each row written by sdpa_decode.comp, in the
// fixed order 0..P−1, so that equal inputs give identical bits on every run:
//   M = max_p m_p,  w_p = exp(m_p − M) (0 for an empty chunk),  out = Σ w_p·acc_p / Σ w_p·l_p.
// A row with nothing to attend (every l_p = 0) gets zeros; a NaN sum gives a NaN row. With
// SCORE_SINKS (score_params::features, read at run time) the row's head's sink joins the
// denominator here, once: out = Σ w_p·acc_p / (Σ w_p·l_p + e^(σ − M)); with SCORE_LSE the row's
// log-sum-exp M + log Σ w_p·l_p (sinks not included) goes to `lse` (score_rules.glsl). With ALiBi
// the partial states hold scores relative to the row's nearest key, and the part left out
// (alibi_drop) meets the sink and the lse here.
// One invocation per output element; the output row of group z's row r is z·R + r, which is
// exactly (batch, query head, query row) of a (B, Hq, L, Ev) tensor.
// QKV_MERGE_GUARD (with QKV_FP16 for a float16 q): the overflow guard's output pass over the
// elements written and its rows pass over q in the same dispatch (contract/decode.h,
// decode_merge_guard_push), so that a decode recorded over device tensors adds no dispatch of its
// own for the check. The rows pass runs only where the decode kernel did not (q_rows = 0
// otherwise: sdpa_decode.comp's GUARD). With QKV_SUBGROUP_VOTE (the device offers subgroup votes
// in compute shaders) a subgroup raises the output flag once, by subgroupAny over its active
// invocations, whatever its size.
#include "contract/decode.h"
#include "contract/paged.h"
#include "contract/score.h"
#define QKV_SCORE_PARAMS_BINDING MERGE_BINDING_PARAMS
#include "score_rules.glsl"

layout(local_size_x = MERGE_WORKGROUP, local_size_y = 1, local_size_z = 1) in;
layout(std430, binding = MERGE_BINDING_STATS) readonly buffer Stats { vec2 stats[]; };
layout(std430, binding = MERGE_BINDING_ACC) readonly buffer Acc { float acc[]; };
layout(std430, binding = MERGE_BINDING_OUT) writeonly buffer Out { float o_out[]; };
layout(std430, binding = MERGE_BINDING_LSE) writeonly buffer Lse { float lse_out[]; };
#ifdef QKV_PAGED
// The batched paged decode's merge (contract/paged.h): output element (query row t, head h, c) of a
// (total_q, Hq, Ev) tensor, its partials found through t's sequence; lse is (Hq, total_q).
layout(std430, binding = PAGED_MERGE_BINDING_WORK) readonly buffer Work { uint work[]; };
layout(push_constant) uniform Push { paged_merge_push pc; };
#elif defined(QKV_MERGE_GUARD)
#include "precision.glsl"
#include "contract/tensor.h"
#include "guard_rows.glsl"
layout(std430, binding = MERGE_BINDING_Q) readonly buffer Q { QKV_T q[]; };
layout(std430, binding = MERGE_BINDING_RESULT) buffer Result { uint result[]; };
layout(push_constant) uniform Push { decode_merge_guard_push pg; };
#define pc pg.merge
QKV_GUARD_ROW_NORM(q_row_norm, q)
#else
layout(push_constant) uniform Push { decode_merge_push pc; };
#endif

void main() {
    const float neg_inf = uintBitsToFloat(0xff800000u);
    const uint id = (gl_WorkGroupID.x + pc.group_x) * MERGE_WORKGROUP + gl_LocalInvocationID.x;
#ifdef QKV_PAGED
    if (id >= pc.total_q * pc.q_heads * pc.dv) return;
    const uint c = id % pc.dv, t = id / pc.dv / pc.q_heads, head = id / pc.dv % pc.q_heads;
    const uint seq = work[pc.token_base + t] * PAGED_SEQ_WORDS;
    const uint q_len = work[seq + PAGED_SEQ_Q_LEN], chunks = work[seq + PAGED_SEQ_CHUNKS];
    const uint kv_len = work[seq + PAGED_SEQ_KV_LEN];
    const int causal_offset = int(work[seq + PAGED_SEQ_OFFSET]);
    const uint i = t - work[seq + PAGED_SEQ_Q_FIRST], group = pc.q_heads / pc.kv_heads;
    const uint kv_head = head / group, r = (head % group) * q_len + i;
    const uint base = work[seq + PAGED_SEQ_PART_BASE] + (kv_head * group * q_len + r) * chunks;
    const uint out_at = id, lse_at = head * pc.total_q + t;
#else
#ifdef QKV_MERGE_GUARD
    if (id < pg.q_rows) {  // the guard's rows pass: row id of q
        bool bad = false;
        const float norm = q_row_norm(pg.q_off + id * pg.d, pg.d, bad);
        atomicMax(result[GUARD_HEADER_WORDS + id / pc.q_len], floatBitsToUint(norm));
        if (bad) atomicOr(result[GUARD_WORD_FLAGS], GUARD_FLAG_INPUT_NONFINITE);
    }
#endif
    if (id >= pc.groups * pc.rows * pc.dv) return;
    const uint row = id / pc.dv, c = id % pc.dv;
    const uint base = row * pc.chunks, chunks = pc.chunks, q_len = pc.q_len, kv_len = pc.kv_len;
    const uint head = (row / pc.q_len) % pc.q_heads, i = row % pc.q_len;
    const int causal_offset = pc.causal_offset;
    const uint out_at = row * pc.dv + c, lse_at = row;
#endif
    float big = neg_inf;
    for (uint p = 0; p < chunks; ++p) big = max(big, stats[base + p].x);
    const float m_use = big == neg_inf ? 0.0 : big;
    float l = 0.0, a = 0.0;
    for (uint p = 0; p < chunks; ++p) {
        const vec2 st = stats[base + p];
        if (st.y == 0.0 && st.x == neg_inf) continue;  // an empty chunk adds nothing
        const float w = exp(st.x - m_use);
        l += w * st.y;
        a += w * acc[(base + p) * pc.dv_stride + c];
    }
    const score_params sp = score_in;
    const uint features = sp.features;
    // ALiBi's part left out of the row's scores (score_rules.glsl): off its lse, onto its sink
    const float slope = (features & SCORE_ALIBI) != 0u ? head_values[head].x : 0.0;
    const float drop = alibi_drop(int(i) + causal_offset, kv_len, features, sp, slope);
    const float sink = (features & SCORE_SINKS) != 0u ? head_values[head].y + drop : neg_inf;
    float o;
    if (isnan(l))
        o = uintBitsToFloat(0x7fc00000u);
    else if ((features & SCORE_SINKS) != 0u)
        o = a * row_normaliser(big, l, features, sink);
    else
        o = l == 0.0 ? 0.0 : a / l;
    o_out[out_at] = o;
#if defined(QKV_MERGE_GUARD) && defined(QKV_SUBGROUP_VOTE)
    if (subgroupAny(!guard_finite(o)) && subgroupElect())
        atomicOr(result[GUARD_WORD_FLAGS], GUARD_FLAG_OUTPUT_NONFINITE);
#elif defined(QKV_MERGE_GUARD)
    if (!guard_finite(o)) atomicOr(result[GUARD_WORD_FLAGS], GUARD_FLAG_OUTPUT_NONFINITE);
#endif
    if ((features & SCORE_LSE) != 0u && c == 0u) lse_out[lse_at] = row_lse(big, l, false, drop);
}
