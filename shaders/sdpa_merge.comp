#version 450
#extension GL_GOOGLE_include_directive : require
// Merges the P partial softmax states (m, l, acc) of each row written by sdpa_decode.comp, in the
// fixed order 0..P−1, so that equal inputs give identical bits on every run:
//   M = max_p m_p,  w_p = exp(m_p − M) (0 for an empty chunk),  out = Σ w_p·acc_p / Σ w_p·l_p.
// A row with nothing to attend (every l_p = 0) gets zeros; a NaN sum gives a NaN row.
// One invocation per output element; the output row of group z's row r is z·R + r, which is
// exactly (batch, query head, query row) of a (B, Hq, L, Ev) tensor.
#include "contract/decode.h"

layout(local_size_x = MERGE_WORKGROUP, local_size_y = 1, local_size_z = 1) in;
layout(std430, binding = MERGE_BINDING_STATS) readonly buffer Stats { vec2 stats[]; };
layout(std430, binding = MERGE_BINDING_ACC) readonly buffer Acc { float acc[]; };
layout(std430, binding = MERGE_BINDING_OUT) writeonly buffer Out { float o_out[]; };
layout(push_constant) uniform Push { decode_merge_push pc; };

void main() {
    const float neg_inf = uintBitsToFloat(0xff800000u);
    const uint id = (gl_WorkGroupID.x + pc.group_x) * MERGE_WORKGROUP + gl_LocalInvocationID.x;
    if (id >= pc.groups * pc.rows * pc.dv) return;
    const uint row = id / pc.dv, c = id % pc.dv;
    const uint base = row * pc.chunks;
    float big = neg_inf;
    for (uint p = 0; p < pc.chunks; ++p) big = max(big, stats[base + p].x);
    const float m_use = big == neg_inf ? 0.0 : big;
    float l = 0.0, a = 0.0;
    for (uint p = 0; p < pc.chunks; ++p) {
        const vec2 st = stats[base + p];
        if (st.y == 0.0 && st.x == neg_inf) continue;  // an empty chunk adds nothing
        const float w = exp(st.x - m_use);
        l += w * st.y;
        a += w * acc[(base + p) * pc.dv_stride + c];
    }
    o_out[row * pc.dv + c] = isnan(l) ? uintBitsToFloat(0x7fc00000u) : (l == 0.0 ? 0.0 : a / l);
}
