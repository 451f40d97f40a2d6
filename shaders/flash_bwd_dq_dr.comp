#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_samplerless_texture_functions : require
#extension GL_EXT_control_flow_attributes : enable
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
// The backward pass's dq in the fused order (contract/backward.h): flash_bwd_dkdv.comp has stored
// every dR (BWD_STORE_DR) per key block of KB keys, so dq = scale·Σ_j dR·k needs no score, P or dP
// of its own: for the RPI query rows each invocation owns, walk the key blocks the rows may see in
// order (score_rules.glsl: visible_keys; per row backward.glsl's visible_rows, what dk/dv wrote), and add
// dR·k over the block's keys in order: one writer per row, no atomics, the same bits on every run.
// A masked key's dR is the sentinel BWD_DR_MASKED and adds nothing, by a select per (row, key); where
// the (batch, K/V head)'s K holds a NaN or an Inf the CAREFUL pipeline selects per product, so that
// 0·NaN never reaches dq. With BWD_CHECK, the rows' check sums are the blocks' sums added in order,
// then checked as flash_bwd_dq.comp checks them (saved_row_verdict). K texels are shared across the
// subgroup by subgroupShuffle (shuffle devices only: the plan takes this order only there).
// The host keeps the key blocks below llvmpipe's 65,535 loop iterations (flash_bwd_plan::fused).
#include "contract/backward.h"
#include "contract/score.h"
#define QKV_SCORE_PARAMS_BINDING BWD_DQ_DR_BINDING_PARAMS
#include "score_rules.glsl"
#include "backward.glsl"

layout(local_size_x_id = BWD_SPEC_WG, local_size_y = 1, local_size_z = 1) in;
layout(constant_id = BWD_SPEC_OWN) const uint RPI = 2;   // query rows per invocation
layout(constant_id = BWD_SPEC_STEP) const uint KB = 16;  // keys per dk/dv block (the scratch's)
layout(constant_id = BWD_SPEC_D4) const uint D4 = 16;    // texels per Q/K row
layout(constant_id = BWD_SPEC_DV4) const uint DV4 = 16;  // unused here
layout(constant_id = BWD_SPEC_MASKS) const uint MASKS = 0;
layout(constant_id = BWD_SPEC_FEATURES) const uint FEATURES = 0;
layout(constant_id = BWD_SPEC_CAREFUL) const uint CAREFUL = 0;
layout(constant_id = BWD_SPEC_EXTRAS) const uint EXTRAS = 0;  // BWD_CHECK

layout(binding = BWD_DQ_DR_BINDING_K) uniform textureBuffer k_tex;    // [B·Hkv][npad_kv][D4]
layout(binding = BWD_DQ_DR_BINDING_STATS) uniform textureBuffer stats;  // [B·Hq][npad_q] RGBA32F
layout(std430, binding = BWD_DQ_DR_BINDING_DR) readonly buffer DR { uvec4 dr[]; };  // dR's bits
layout(std430, binding = BWD_DQ_DR_BINDING_DR_SUMS) readonly buffer DRSums { vec4 dr_sums[]; };
layout(std430, binding = BWD_DQ_DR_BINDING_DQ) writeonly buffer DQ { float dq_out[]; };  // (B, Hq, L, E)
layout(std430, binding = BWD_DQ_DR_BINDING_FLAGS) readonly buffer Flags { uint k_nonfinite[]; };
layout(std430, binding = BWD_DQ_DR_BINDING_VERDICT) buffer Verdict { uint verdict[]; };

layout(push_constant) uniform Push { bwd_push pc; };

const uint WG = gl_WorkGroupSize.x;
const uint BLOCK = WG * RPI;
const uint ROUNDS = (KB + WG - 1u) / WG;  // a block's keys fetched per round: one per lane
const uint KB4 = KB / 4u;                 // KB is a multiple of 4 (the plan's)

void main() {
    const bool causal = (MASKS & MASK_FLAG_CAUSAL) != 0u;
    const uint w = gl_WorkGroupID.x + pc.group_x;
    // Causal balance (as flash_bwd_dq.comp): neighbouring workgroups take a row block from each end.
    const uint block = !causal ? w : ((w & 1u) == 0u ? w / 2u : pc.blocks - 1u - w / 2u);
    const uint row0 = block * BLOCK;
    const uint z = gl_WorkGroupID.z + pc.group_z + pc.z_first;  // (batch, query head)
    const uint dz = z - pc.dr_first;                            // its place in the dR scratch
    const uint batch = z / pc.heads, head = z % pc.heads;
    const uint kvz = batch * (pc.heads / pc.group) + head / pc.group;
    const uint lane = gl_LocalInvocationID.x;
    score_params sp = no_score_params();
    float slope = 0.0;
    if (FEATURES != 0u) sp = score_in;
    if ((FEATURES & SCORE_ALIBI) != 0u) slope = head_values[head].x;

    vec4 dq[RPI * D4];
    vec4 check[RPI];  // Σ P, Σ P·dP, Σ P·|dP|, keys allowed
    [[unroll]] for (uint x = 0; x < RPI * D4; ++x) dq[x] = vec4(0.0);
    [[unroll]] for (uint i = 0; i < RPI; ++i) check[i] = vec4(0.0);

    // This pipeline's (batch, head)s only: the others walk no block.
    const bool mine = (k_nonfinite[kvz] != 0u) == (CAREFUL != 0u);
    const uint key_blocks = (max(pc.kv_len, 1u) + KB - 1u) / KB;
    const uint row_last = min(row0 + BLOCK, max(pc.q_len, 1u)) - 1u;
    // Causal and the window: the key blocks no row of the block may see are not walked (as
    // flash_bwd_dq.comp's keys); within those walked, a row outside a block's visible rows reads nothing.
    const int p_first = int(row0) + pc.causal_offset;
    const int p_last = int(row_last) + pc.causal_offset;
    const uvec2 keys = visible_keys(p_first, p_last, FEATURES, causal, sp, 0u, pc.kv_len);
    const uint kb_first = keys.x / KB, kb_end = mine && keys.y > keys.x ? (keys.y + KB - 1u) / KB : 0u;
    for (uint kb = kb_first; kb < kb_end; ++kb) {
        const uint key0 = kb * KB;
        const uint key_last = min(key0 + KB, max(pc.kv_len, 1u)) - 1u;
        const uvec2 rows = visible_rows(int(key0), int(key_last), pc.causal_offset, FEATURES, causal, sp, pc.q_len);
        if (rows.y <= row0 || rows.x > row_last) continue;  // no row here sees the block: dk/dv wrote nothing
        // The rows' dR over the block's keys; a row the block cannot see, or a masked key: 0.
        float ds[RPI * KB];
        bool ok[RPI * KB];
        [[unroll]] for (uint i = 0; i < RPI; ++i) {
            const uint row = row0 + i * WG + lane;
            const bool seen = row >= rows.x && row < rows.y;
            const uint at = ((dz * key_blocks + kb) * pc.npad_q + row) * KB4;
            [[unroll]] for (uint c = 0; c < KB4; ++c) {
                const uvec4 x = seen ? dr[at + c] : uvec4(BWD_DR_MASKED);
                [[unroll]] for (uint e = 0; e < 4; ++e) {
                    const bool allowed = x[e] != BWD_DR_MASKED;
                    ok[i * KB + c * 4u + e] = allowed;
                    ds[i * KB + c * 4u + e] = allowed ? uintBitsToFloat(x[e]) : 0.0;
                }
            }
            if ((EXTRAS & BWD_CHECK) != 0u && seen) check[i] += dr_sums[(dz * key_blocks + kb) * pc.npad_q + row];
        }
        // dq += dR·k, the block's keys in order
        [[unroll]] for (uint c = 0; c < D4; ++c) {
            vec4 fetched[ROUNDS];
            [[unroll]] for (uint r = 0; r < ROUNDS; ++r) {
                const uint key = key0 + min(r * WG + gl_SubgroupInvocationID, KB - 1u);
                fetched[r] = texelFetch(k_tex, int((kvz * pc.npad_kv + key) * D4 + c));
            }
            [[unroll]] for (uint j = 0; j < KB; ++j) {
                const vec4 kv = subgroupShuffle(fetched[j / WG], j % WG);
                [[unroll]] for (uint i = 0; i < RPI; ++i) {
                    if (CAREFUL != 0u)
                        dq[i * D4 + c] += ok[i * KB + j] ? ds[i * KB + j] * kv : vec4(0.0);
                    else
                        dq[i * D4 + c] += ds[i * KB + j] * kv;
                }
            }
        }
    }

    // dq, the check, the verdict
    const uint rows_out = mine ? pc.q_len : 0u;
    bool nonfinite = false;
    [[unroll]] for (uint i = 0; i < RPI; ++i) {
        const uint row = row0 + i * WG + lane;
        if (row >= rows_out) continue;
        const uint r = z * pc.q_len + row;
        const uint ob = r * pc.d;
        [[unroll]] for (uint c = 0; c < D4; ++c) {
            const vec4 g = dq[i * D4 + c] * pc.scale;
            nonfinite = nonfinite || any(isnan(g)) || any(isinf(g));
            [[unroll]] for (uint e = 0; e < 4; ++e)
                if (c + 1u < D4 || c * 4u + e < pc.d) dq_out[ob + c * 4u + e] = g[e];
        }
        if ((EXTRAS & BWD_CHECK) == 0u) continue;
        const uint bad = saved_row_verdict(texelFetch(stats, int(z * pc.npad_q + row)), check[i],
                                           int(row) + pc.causal_offset, pc.kv_len, FEATURES, sp, slope, head);
        if (bad != 0u) {
            atomicOr(verdict[0], bad);
            atomicMin(verdict[1], r);
        }
    }
    if (nonfinite) atomicOr(verdict[0], BWD_FLAG_NONFINITE_GRADIENT);
}
