#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_samplerless_texture_functions : require
#extension GL_EXT_control_flow_attributes : enable
#ifdef QKV_SHUFFLE
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#endif
// The backward pass, dq (contract/backward.h): for the RPI query rows each invocation owns, stream
// the keys the rows may attend KPS at a time and accumulate
//   s = scale·q·k (then the score rules)      P = e^(s - lse')      dP = Z·dO·v
//   dS = P·(dP - D)      dR = dS·(1 - tanh²(r / C)) with a softcap      dq += dR·k
// and write dq = scale·Σ_j dR·k once, in key order: one writer per row, no atomics. Shaped like the
// forward's cpu family (flash_cpu.comp): one subgroup per workgroup, rows in registers, K and V rows
// read through texel buffers, every inner loop unrolled (the key-step loop is the only loop), K and
// V texels shared across the subgroup by subgroupShuffle with QKV_SHUFFLE.
//
// A masked key (the score rules, or beyond this dispatch's keys) has P = 0 and adds nothing, by a
// select per (row, key); where the (batch, K/V head)'s K holds a NaN or Inf (flash_cpu_pack.comp's
// flags) the CAREFUL pipeline also selects per product, so that 0·NaN never reaches dq.
//
// Extras: BWD_WRITE_DS writes every dS (the logits' gradient, which is the additive mask's) into a
// (B, Hq, L, S) scratch zeroed by the host; BWD_CHECK sums Σ_j P, Σ_j P·dP and Σ_j P·|dP| over the
// row's keys and, after the last chunk, flags a row whose saved lse or out are not this problem's
// forward results (BWD_FLAG_BAD_LSE, BAD_OUT, NO_KEY: the CPU reference's rules, within 1 %).
//
// Key chunks: a dispatch covers keys [begin, stop) (a multiple of KPS apart, which the host keeps a
// multiple of 4 with dropout), resuming from dq and the sums it finds (BWD_RESUME) and leaving them
// unscaled for the next (BWD_PARTIAL); llvmpipe ends every loop of an invocation after 65,535
// iterations in total, and the host keeps the steps of one dispatch below that.
#include "contract/backward.h"
#include "contract/score.h"
#define QKV_SCORE_PARAMS_BINDING BWD_DQ_BINDING_PARAMS
#include "score_rules.glsl"
#include "contract/philox.h"
#include "dropout.glsl"
#include "backward.glsl"

layout(local_size_x_id = BWD_SPEC_WG, local_size_y = 1, local_size_z = 1) in;
layout(constant_id = BWD_SPEC_OWN) const uint RPI = 2;     // query rows per invocation
layout(constant_id = BWD_SPEC_STEP) const uint KPS = 8;    // keys per step
layout(constant_id = BWD_SPEC_D4) const uint D4 = 16;      // texels per Q/K row
layout(constant_id = BWD_SPEC_DV4) const uint DV4 = 16;    // texels per V / dO row
layout(constant_id = BWD_SPEC_MASKS) const uint MASKS = 0;
layout(constant_id = BWD_SPEC_FEATURES) const uint FEATURES = 0;
layout(constant_id = BWD_SPEC_CAREFUL) const uint CAREFUL = 0;
layout(constant_id = BWD_SPEC_EXTRAS) const uint EXTRAS = 0;

layout(binding = BWD_DQ_BINDING_Q) uniform textureBuffer q_tex;   // [B·Hq][npad_q][D4]
layout(binding = BWD_DQ_BINDING_K) uniform textureBuffer k_tex;   // [B·Hkv][npad_kv][D4]
layout(binding = BWD_DQ_BINDING_V) uniform textureBuffer v_tex;   // [B·Hkv][npad_kv][DV4]
layout(binding = BWD_DQ_BINDING_DO) uniform textureBuffer do_tex;  // [B·Hq][npad_q][DV4]
layout(std430, binding = BWD_DQ_BINDING_MASK) readonly buffer MaskBits { uint mask_bits[]; };
layout(std430, binding = BWD_DQ_BINDING_ADDITIVE) readonly buffer Additive { float additive[]; };
layout(binding = BWD_DQ_BINDING_STATS) uniform textureBuffer stats;  // [B·Hq][npad_q] RGBA32F
layout(std430, binding = BWD_DQ_BINDING_DQ) buffer DQ { float dq_out[]; };              // (B, Hq, L, E)
layout(std430, binding = BWD_DQ_BINDING_DS) writeonly buffer DS { float ds_out[]; };     // (B, Hq, L, S)
layout(std430, binding = BWD_DQ_BINDING_SUMS) buffer Sums { vec4 sums[]; };             // (B·Hq·L)
layout(std430, binding = BWD_DQ_BINDING_FLAGS) readonly buffer Flags { uint k_nonfinite[]; };  // per (batch, K/V head)
layout(std430, binding = BWD_DQ_BINDING_VERDICT) buffer Verdict { uint verdict[]; };

layout(push_constant) uniform Push { bwd_push pc; };

const uint WG = gl_WorkGroupSize.x;
const uint BLOCK = WG * RPI;
// Rules that change every score (not only the masked keys): the rules run on every key step.
const bool EVERY_STEP = (FEATURES & SCORE_EVERY_STEP) != 0u;
#ifdef QKV_SHUFFLE
const uint ROUNDS = (KPS + WG - 1u) / WG;  // keys fetched per round: one per lane
#endif

void main() {
    const bool causal = (MASKS & MASK_FLAG_CAUSAL) != 0u, has_mask = (MASKS & MASK_FLAG_BOOLEAN) != 0u;
    const bool has_add = (MASKS & MASK_FLAG_ADDITIVE) != 0u;
    const bool resume = (pc.flags & BWD_RESUME) != 0u, partial = (pc.flags & BWD_PARTIAL) != 0u;
    const float neg_inf = uintBitsToFloat(0xff800000u);
    const uint w = gl_WorkGroupID.x + pc.group_x;
    // Causal balance (as flash_cpu.comp): neighbouring workgroups take a row block from each end.
    const uint block = !causal ? w : ((w & 1u) == 0u ? w / 2u : pc.blocks - 1u - w / 2u);
    const uint row0 = block * BLOCK;
    const uint z = gl_WorkGroupID.z + pc.group_z;
    const uint batch = z / pc.heads, head = z % pc.heads;
    const uint kvz = batch * (pc.heads / pc.group) + head / pc.group;
    const uint lane = gl_LocalInvocationID.x;
    const uint qbase = z * pc.npad_q, kvbase = kvz * pc.npad_kv;
    const uint mbase = batch * pc.m_bs + head * pc.m_hs, abase = batch * pc.a_bs + head * pc.m_hs;
    score_params sp = no_score_params();
    float slope = 0.0;
    if (FEATURES != 0u) sp = score_in;
    if ((FEATURES & SCORE_ALIBI) != 0u) slope = head_values[head].x;

    // The owned rows: q (pre-scaled, as the forward's), dO, lse' and D, the accumulators.
    vec4 q[RPI * D4], dout[RPI * DV4], dq[RPI * D4];
    float lse[RPI], dd[RPI];
    vec4 check[RPI];  // Σ P, Σ P·dP, Σ P·|dP|, keys allowed
    [[unroll]] for (uint i = 0; i < RPI; ++i) {
        const uint row = row0 + i * WG + lane;
        [[unroll]] for (uint c = 0; c < D4; ++c) q[i * D4 + c] = texelFetch(q_tex, int((qbase + row) * D4 + c)) * pc.scale;
        [[unroll]] for (uint c = 0; c < DV4; ++c) dout[i * DV4 + c] = texelFetch(do_tex, int((qbase + row) * DV4 + c));
        const vec4 st = texelFetch(stats, int(qbase + row));
        lse[i] = st.x;
        dd[i] = st.y;
        check[i] = vec4(0.0);
        [[unroll]] for (uint c = 0; c < D4; ++c) dq[i * D4 + c] = vec4(0.0);
        if (resume && row < pc.q_len) {
            const uint ob = (z * pc.q_len + row) * pc.d;
            [[unroll]] for (uint c = 0; c < D4; ++c)
                [[unroll]] for (uint e = 0; e < 4; ++e)
                    if (c + 1u < D4 || c * 4u + e < pc.d) dq[i * D4 + c][e] = dq_out[ob + c * 4u + e];
            if ((EXTRAS & BWD_CHECK) != 0u) check[i] = sums[z * pc.q_len + row];
        }
    }

    // This pipeline's (batch, head)s only (see above): the others run no key step.
    const bool mine = (k_nonfinite[kvz] != 0u) == (CAREFUL != 0u);
    const bool any_mask = has_mask || has_add;
    // Causal and the window: keys no row of the block may see are skipped (as the forward).
    const int p_first = int(row0) + pc.causal_offset;
    const int p_last = int(min(row0 + BLOCK, max(pc.q_len, 1u))) - 1 + pc.causal_offset;
    const uvec2 keys = visible_keys(p_first, p_last, FEATURES, causal, sp, pc.begin, min(pc.stop, pc.kv_len));
    const uint kv_end = mine ? keys.y : 0u;
    const uint kv_first = pc.begin + (keys.x - pc.begin) / KPS * KPS;
    const int diagonal = int(row0) + pc.causal_offset + 1;  // the first key the causal limit can cut
    for (uint j0 = kv_first; j0 < kv_end; j0 += KPS) {
#ifdef QKV_SHUFFLE
        // Lane i fetches key j0 + r·WG + i (the step's last key where that is past it), once for
        // the scores and for dq.
        uint at[ROUNDS];
        [[unroll]] for (uint r = 0; r < ROUNDS; ++r) at[r] = kvbase + j0 + min(r * WG + gl_SubgroupInvocationID, KPS - 1u);
        vec4 kf[ROUNDS * D4];
        [[unroll]] for (uint c = 0; c < D4; ++c)
            [[unroll]] for (uint r = 0; r < ROUNDS; ++r) kf[r * D4 + c] = texelFetch(k_tex, int(at[r] * D4 + c));
#endif
        // s = q·k (q pre-scaled)
        float s[RPI * KPS];
        [[unroll]] for (uint k = 0; k < RPI * KPS; ++k) s[k] = 0.0;
        [[unroll]] for (uint c = 0; c < D4; ++c) {
            [[unroll]] for (uint j = 0; j < KPS; ++j) {
#ifdef QKV_SHUFFLE
                const vec4 kv = subgroupShuffle(kf[(j / WG) * D4 + c], j % WG);
#else
                const vec4 kv = texelFetch(k_tex, int((kvbase + j0 + j) * D4 + c));
#endif
                [[unroll]] for (uint i = 0; i < RPI; ++i) {
                    const vec4 qv = q[i * D4 + c];
                    s[i * KPS + j] += qv.x * kv.x + qv.y * kv.y + qv.z * kv.z + qv.w * kv.w;
                }
            }
        }
        // the softcap's derivative at the raw score, then the score rules (score_rules.glsl) on the
        // steps that need them (as the forward: the last keys, the causal diagonal, explicit masks;
        // every step with a softcap, ALiBi or a window)
        float cap[RPI * KPS];
        [[unroll]] for (uint k = 0; k < RPI * KPS; ++k) cap[k] = 1.0;
        if ((FEATURES & SCORE_SOFTCAP) != 0u)
            [[unroll]] for (uint k = 0; k < RPI * KPS; ++k) cap[k] = softcap_slope(s[k], sp);
        if (EVERY_STEP || any_mask || j0 + KPS > kv_end || (causal && int(j0 + KPS) > diagonal)) {
            [[unroll]] for (uint i = 0; i < RPI; ++i) {
                const uint row = row0 + i * WG + lane;
                const uint mrow = min(row, pc.q_len - 1u);
                [[unroll]] for (uint j = 0; j < KPS; ++j) {
                    const uint key = j0 + j;
                    const uint mi = mrow * pc.m_rs + min(key, pc.kv_len - 1u) * pc.m_cs, bit = mbase + mi;
                    bool allowed = true;
                    float add = 0.0;
                    if (has_mask) allowed = ((mask_bits[bit >> 5] >> (bit & 31u)) & 1u) != 0u;
                    if (has_add) add = additive[abase + mi];
                    const int p = int(row) + pc.causal_offset;
                    const float v = rule_score(s[i * KPS + j], int(key) - p, nearest_key_distance(p, pc.kv_len),
                                               FEATURES, MASKS, sp, slope, allowed, add);
                    s[i * KPS + j] = key < kv_end ? v : neg_inf;
                }
            }
        }
        // dP = dO·v
        float dp[RPI * KPS];
        [[unroll]] for (uint k = 0; k < RPI * KPS; ++k) dp[k] = 0.0;
        [[unroll]] for (uint c = 0; c < DV4; ++c) {
#ifdef QKV_SHUFFLE
            vec4 fetched[ROUNDS];
            [[unroll]] for (uint r = 0; r < ROUNDS; ++r) fetched[r] = texelFetch(v_tex, int(at[r] * DV4 + c));
#endif
            [[unroll]] for (uint j = 0; j < KPS; ++j) {
#ifdef QKV_SHUFFLE
                const vec4 vv = subgroupShuffle(fetched[j / WG], j % WG);
#else
                const vec4 vv = texelFetch(v_tex, int((kvbase + j0 + j) * DV4 + c));
#endif
                [[unroll]] for (uint i = 0; i < RPI; ++i) {
                    const vec4 ov = dout[i * DV4 + c];
                    dp[i * KPS + j] += ov.x * vv.x + ov.y * vv.y + ov.z * vv.z + ov.w * vv.w;
                }
            }
        }
        // P, dropout's Z, dS and dR (in s); a masked key gets exactly 0
        bool ok[RPI * KPS];
        [[unroll]] for (uint i = 0; i < RPI; ++i) {
            const uint row = row0 + i * WG + lane;
            uvec4 x = uvec4(0u);
            [[unroll]] for (uint j = 0; j < KPS; ++j) {
                const uint k = i * KPS + j;
                const bool allowed = s[k] != neg_inf;
                const float p = allowed ? exp(s[k] - lse[i]) : 0.0;
                float dpz = dp[k];
                if ((FEATURES & SCORE_DROPOUT) != 0u) {  // KPS and j0 multiples of 4
                    if (j % 4u == 0u) x = dropout_draws(z * pc.q_len + row, (j0 + j) / 4u, sp);
                    dpz = x[j % 4u] >= sp.dropout_threshold ? dpz * sp.dropout_scale : 0.0;
                }
                const float ds = allowed ? p * (dpz - dd[i]) : 0.0;
                if ((EXTRAS & BWD_CHECK) != 0u && allowed)
                    check[i] += vec4(p, p * dpz, p * abs(dpz), 1.0);
                if ((EXTRAS & BWD_WRITE_DS) != 0u && row < pc.q_len && j0 + j < kv_end)
                    ds_out[(z * pc.q_len + row) * pc.kv_len + j0 + j] = ds;
                s[k] = ds * cap[k];
                ok[k] = allowed;
            }
        }
        // dq += dR·k
        [[unroll]] for (uint c = 0; c < D4; ++c) {
            [[unroll]] for (uint j = 0; j < KPS; ++j) {
#ifdef QKV_SHUFFLE
                const vec4 kv = subgroupShuffle(kf[(j / WG) * D4 + c], j % WG);
#else
                const vec4 kv = texelFetch(k_tex, int((kvbase + j0 + j) * D4 + c));
#endif
                [[unroll]] for (uint i = 0; i < RPI; ++i) {
                    if (CAREFUL != 0u)
                        dq[i * D4 + c] += ok[i * KPS + j] ? s[i * KPS + j] * kv : vec4(0.0);
                    else
                        dq[i * D4 + c] += s[i * KPS + j] * kv;
                }
            }
        }
    }

    // dq (scaled after the last chunk), the check sums, the verdict
    const uint rows_out = mine ? pc.q_len : 0u;
    bool nonfinite = false;
    [[unroll]] for (uint i = 0; i < RPI; ++i) {
        const uint row = row0 + i * WG + lane;
        if (row >= rows_out) continue;
        const uint r = z * pc.q_len + row;
        const uint ob = r * pc.d;
        const float factor = partial ? 1.0 : pc.scale;
        [[unroll]] for (uint c = 0; c < D4; ++c) {
            const vec4 g = dq[i * D4 + c] * factor;
            nonfinite = nonfinite || any(isnan(g)) || any(isinf(g));
            [[unroll]] for (uint e = 0; e < 4; ++e)
                if (c + 1u < D4 || c * 4u + e < pc.d) dq_out[ob + c * 4u + e] = g[e];
        }
        if ((EXTRAS & BWD_CHECK) == 0u) continue;
        if (partial) {
            sums[r] = check[i];
            continue;
        }
        const uint bad = saved_row_verdict(texelFetch(stats, int(qbase + row)), check[i],
                                           int(row) + pc.causal_offset, pc.kv_len, FEATURES, sp, slope, head);
        if (bad != 0u) {
            atomicOr(verdict[0], bad);
            atomicMin(verdict[1], r);
        }
    }
    if (nonfinite) atomicOr(verdict[0], BWD_FLAG_NONFINITE_GRADIENT);
}
