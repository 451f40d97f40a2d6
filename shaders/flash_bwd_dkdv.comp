#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_samplerless_texture_functions : require
#extension GL_EXT_control_flow_attributes : enable
#ifdef QKV_SHUFFLE
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#endif
// The backward pass, dk and dv (contract/backward.h): for the KPI keys each invocation owns (keys
// key0 + lane·KPI .. + KPI - 1: a lane's keys share their dropout counters), stream the query rows
// of every query head of the key's K/V head (GQA: their sums) RPS at a time and accumulate
//   s = scale·q·k (then the score rules)      P = e^(s - lse')      dP = Z·dO·v
//   dS = P·(dP - D)      dR = dS·(1 - tanh²(r / C)) with a softcap
//   dv += P·Z·dO         dk += dR·(scale·q)
// and write dk and dv once, heads and rows in order: one writer per key, no atomics. Shaped like
// flash_bwd_dq.comp with the roles of rows and keys exchanged: keys in registers, Q and dO rows
// read through texel buffers (shared across the subgroup by subgroupShuffle with QKV_SHUFFLE),
// every inner loop unrolled.
//
// Streamed rows are slots t = u·npad_q + i over the group's query heads u and rows i (Q and dO of a
// K/V head's query heads lie side by side in the texels), the rows each head may see this key
// block from (causal, window: backward.glsl's visible_rows) and no others. A dispatch covers slots
// [begin, stop) (the host keeps its steps below llvmpipe's 65,535 loop iterations), resuming from
// dk and dv as it finds them (BWD_RESUME). The CAREFUL pipeline, for the (batch, K/V head)s whose Q
// or dO rows hold a NaN or an Inf, selects per product, so that a masked key's 0 never multiplies
// one.
#include "contract/backward.h"
#include "contract/score.h"
#define QKV_SCORE_PARAMS_BINDING BWD_DKDV_BINDING_PARAMS
#include "score_rules.glsl"
#include "contract/philox.h"
#include "dropout.glsl"
#include "backward.glsl"

layout(local_size_x_id = BWD_SPEC_WG, local_size_y = 1, local_size_z = 1) in;
layout(constant_id = BWD_SPEC_OWN) const uint KPI = 2;     // keys per invocation (1, 2, 4 or 8)
layout(constant_id = BWD_SPEC_STEP) const uint RPS = 8;    // streamed rows per step
layout(constant_id = BWD_SPEC_D4) const uint D4 = 16;
layout(constant_id = BWD_SPEC_DV4) const uint DV4 = 16;
layout(constant_id = BWD_SPEC_MASKS) const uint MASKS = 0;
layout(constant_id = BWD_SPEC_FEATURES) const uint FEATURES = 0;
layout(constant_id = BWD_SPEC_CAREFUL) const uint CAREFUL = 0;
layout(constant_id = BWD_SPEC_EXTRAS) const uint EXTRAS = 0;  // BWD_STORE_DR (shuffles only), BWD_CHECK with it

layout(binding = BWD_DKDV_BINDING_Q) uniform textureBuffer q_tex;
layout(binding = BWD_DKDV_BINDING_K) uniform textureBuffer k_tex;
layout(binding = BWD_DKDV_BINDING_V) uniform textureBuffer v_tex;
layout(binding = BWD_DKDV_BINDING_DO) uniform textureBuffer do_tex;
layout(std430, binding = BWD_DKDV_BINDING_MASK) readonly buffer MaskBits { uint mask_bits[]; };
layout(std430, binding = BWD_DKDV_BINDING_ADDITIVE) readonly buffer Additive { float additive[]; };
layout(binding = BWD_DKDV_BINDING_STATS) uniform textureBuffer stats;  // [B·Hq][npad_q] RGBA32F
layout(std430, binding = BWD_DKDV_BINDING_DK) buffer DK { float dk_out[]; };  // (B, Hkv, S, E)
layout(std430, binding = BWD_DKDV_BINDING_DV) buffer DV { float dv_out[]; };  // (B, Hkv, S, Ev)
layout(std430, binding = BWD_DKDV_BINDING_FLAGS) readonly buffer Flags { uint q_nonfinite[]; };  // per (batch, query head)
layout(std430, binding = BWD_DKDV_BINDING_VERDICT) buffer Verdict { uint verdict[]; };
layout(std430, binding = BWD_DKDV_BINDING_DR) writeonly buffer DR { uint dr_out[]; };  // with BWD_STORE_DR: bits
layout(std430, binding = BWD_DKDV_BINDING_DR_SUMS) writeonly buffer DRSums { vec4 dr_sums[]; };

layout(push_constant) uniform Push { bwd_push pc; };

const uint WG = gl_WorkGroupSize.x;
const uint BLOCK = WG * KPI;
const bool EVERY_STEP = (FEATURES & SCORE_EVERY_STEP) != 0u;
#ifdef QKV_SHUFFLE
const bool STORE_DR = (EXTRAS & BWD_STORE_DR) != 0u;
const bool STORE_SUMS = (EXTRAS & (BWD_STORE_DR | BWD_CHECK)) == (BWD_STORE_DR | BWD_CHECK);
const uint ROUNDS = (RPS + WG - 1u) / WG;  // rows fetched per round: one per lane
// Q and dO rows of a step in one gather per texel, where the subgroup has the lanes for both
// (q_tex is then a view over Q and dO, the host's choice: bwd_push::pair_offset).
const bool PAIRED = D4 == DV4 && 2u * RPS <= WG;
#endif

void main() {
    const bool causal = (MASKS & MASK_FLAG_CAUSAL) != 0u, has_mask = (MASKS & MASK_FLAG_BOOLEAN) != 0u;
    const bool has_add = (MASKS & MASK_FLAG_ADDITIVE) != 0u;
    const bool resume = (pc.flags & BWD_RESUME) != 0u;
    const float neg_inf = uintBitsToFloat(0xff800000u);
    const uint w = gl_WorkGroupID.x + pc.group_x;
    // Causal balance: the first key blocks are seen by the most rows; pair them with the last.
    const uint block = !causal ? w : ((w & 1u) == 0u ? w / 2u : pc.blocks - 1u - w / 2u);
    const uint key0 = block * BLOCK;
    const uint kvz = gl_WorkGroupID.z + pc.group_z + pc.z_first;  // (batch, K/V head)
    const uint kv_heads = pc.heads / pc.group;
    const uint batch = kvz / kv_heads, kv_head = kvz % kv_heads;
    const uint qz0 = batch * pc.heads + kv_head * pc.group;  // its first query head's (batch, head)
    const uint lane = gl_LocalInvocationID.x;
    const uint kfirst = key0 + lane * KPI;  // this lane's keys: kfirst .. kfirst + KPI - 1
    score_params sp = no_score_params();
    if (FEATURES != 0u) sp = score_in;

    // The owned keys: k, v, and the accumulators.
    vec4 k[KPI * D4], v[KPI * DV4], dk[KPI * D4], dv[KPI * DV4];
    [[unroll]] for (uint n = 0; n < KPI; ++n) {
        const uint key = kfirst + n;
        [[unroll]] for (uint c = 0; c < D4; ++c) k[n * D4 + c] = texelFetch(k_tex, int((kvz * pc.npad_kv + key) * D4 + c));
        [[unroll]] for (uint c = 0; c < DV4; ++c) v[n * DV4 + c] = texelFetch(v_tex, int((kvz * pc.npad_kv + key) * DV4 + c));
        [[unroll]] for (uint c = 0; c < D4; ++c) dk[n * D4 + c] = vec4(0.0);
        [[unroll]] for (uint c = 0; c < DV4; ++c) dv[n * DV4 + c] = vec4(0.0);
        if (resume && key < pc.kv_len) {
            const uint kb = (kvz * pc.kv_len + key) * pc.d, vb = (kvz * pc.kv_len + key) * pc.dv;
            [[unroll]] for (uint c = 0; c < D4; ++c)
                [[unroll]] for (uint e = 0; e < 4; ++e)
                    if (c + 1u < D4 || c * 4u + e < pc.d) dk[n * D4 + c][e] = dk_out[kb + c * 4u + e];
            [[unroll]] for (uint c = 0; c < DV4; ++c)
                [[unroll]] for (uint e = 0; e < 4; ++e)
                    if (c + 1u < DV4 || c * 4u + e < pc.dv) dv[n * DV4 + c][e] = dv_out[vb + c * 4u + e];
        }
    }

    // This pipeline's (batch, K/V head)s only: careful where any of the group's Q or dO rows holds
    // a NaN or an Inf.
    bool flagged = false;
    for (uint u = 0; u < pc.group; ++u) flagged = flagged || q_nonfinite[qz0 + u] != 0u;
    const bool mine = flagged == (CAREFUL != 0u);
    // The rows that may see some key of the block; the block's last key is below kv_len.
    const uint key_last = min(key0 + BLOCK, max(pc.kv_len, 1u)) - 1u;
    const uvec2 rows = visible_rows(int(key0), int(key_last), pc.causal_offset, FEATURES, causal, sp, pc.q_len);
    const uint i_first = rows.x / RPS * RPS, i_end = rows.y;
    const bool any_mask = has_mask || has_add;
    const uint t_end = mine && i_end > i_first ? pc.stop : 0u;
    uint t = pc.begin;
    while (t < t_end) {
        const uint u = t / pc.npad_q, i0 = t - u * pc.npad_q;  // head u of the group, its row i0
        if (i0 < i_first) {
            t = u * pc.npad_q + i_first;
            continue;
        }
        if (i0 >= i_end) {
            t = (u + 1u) * pc.npad_q + i_first;
            continue;
        }
        const uint qz = qz0 + u, head = kv_head * pc.group + u;
        const uint tex0 = qz * pc.npad_q + i0;  // texel row (and stats) of the step's first row
        const uint mbase = batch * pc.m_bs + head * pc.m_hs, abase = batch * pc.a_bs + head * pc.m_hs;
        const float slope = (FEATURES & SCORE_ALIBI) != 0u ? head_values[head].x : 0.0;
#ifdef QKV_SHUFFLE
        uint at[ROUNDS];
        [[unroll]] for (uint r = 0; r < ROUNDS; ++r) at[r] = tex0 + min(r * WG + gl_SubgroupInvocationID, RPS - 1u);
        vec4 qf[ROUNDS * D4], of[ROUNDS * DV4], sf[ROUNDS];
        if (PAIRED) {
            // One gather per texel for both: lanes below RPS fetch the step's Q rows, the next RPS
            // lanes its dO rows, through the one view over Q and dO (q_tex; dO from pair_offset).
            const uint lane_row = tex0 + gl_SubgroupInvocationID % RPS;
            const uint base = gl_SubgroupInvocationID < RPS ? lane_row * D4 : pc.pair_offset + lane_row * D4;
            const float factor = gl_SubgroupInvocationID < RPS ? pc.scale : 1.0;
            [[unroll]] for (uint c = 0; c < D4; ++c) qf[c] = texelFetch(q_tex, int(base + c)) * factor;
            sf[0] = texelFetch(stats, int(at[0]));
        } else {
            [[unroll]] for (uint r = 0; r < ROUNDS; ++r) {
                [[unroll]] for (uint c = 0; c < D4; ++c) qf[r * D4 + c] = texelFetch(q_tex, int(at[r] * D4 + c)) * pc.scale;
                [[unroll]] for (uint c = 0; c < DV4; ++c) of[r * DV4 + c] = texelFetch(do_tex, int(at[r] * DV4 + c));
                sf[r] = texelFetch(stats, int(at[r]));
            }
        }
#endif
        // s = (scale·q)·k for the step's rows and this lane's keys
        float s[RPS * KPI];
        [[unroll]] for (uint x = 0; x < RPS * KPI; ++x) s[x] = 0.0;
        [[unroll]] for (uint c = 0; c < D4; ++c) {
            [[unroll]] for (uint r = 0; r < RPS; ++r) {
#ifdef QKV_SHUFFLE
                const vec4 qv = subgroupShuffle(qf[(r / WG) * D4 + c], r % WG);
#else
                const vec4 qv = texelFetch(q_tex, int((tex0 + r) * D4 + c)) * pc.scale;
#endif
                [[unroll]] for (uint n = 0; n < KPI; ++n) {
                    const vec4 kv = k[n * D4 + c];
                    s[r * KPI + n] += qv.x * kv.x + qv.y * kv.y + qv.z * kv.z + qv.w * kv.w;
                }
            }
        }
        float cap[RPS * KPI];
        [[unroll]] for (uint x = 0; x < RPS * KPI; ++x) cap[x] = 1.0;
        if ((FEATURES & SCORE_SOFTCAP) != 0u)
            [[unroll]] for (uint x = 0; x < RPS * KPI; ++x) cap[x] = softcap_slope(s[x], sp);
        // The score rules where a row or key of the step may be cut (rows past q_len, keys past
        // kv_len, the causal diagonal, masks; every step with a softcap, ALiBi or a window).
        const bool edge = i0 + RPS > pc.q_len || key0 + BLOCK > pc.kv_len ||
                          (causal && int(key0 + BLOCK) - 1 > int(i0) + pc.causal_offset);
        if (EVERY_STEP || any_mask || edge) {
            [[unroll]] for (uint r = 0; r < RPS; ++r) {
                const uint row = i0 + r;
                const uint mrow = min(row, pc.q_len - 1u);
                [[unroll]] for (uint n = 0; n < KPI; ++n) {
                    const uint key = kfirst + n;
                    const uint mi = mrow * pc.m_rs + min(key, pc.kv_len - 1u) * pc.m_cs, bit = mbase + mi;
                    bool allowed = true;
                    float add = 0.0;
                    if (has_mask) allowed = ((mask_bits[bit >> 5] >> (bit & 31u)) & 1u) != 0u;
                    if (has_add) add = additive[abase + mi];
                    const int p = int(row) + pc.causal_offset;
                    const float x = rule_score(s[r * KPI + n], int(key) - p, nearest_key_distance(p, pc.kv_len),
                                               FEATURES, MASKS, sp, slope, allowed, add);
                    s[r * KPI + n] = key < pc.kv_len && row < pc.q_len ? x : neg_inf;
                }
            }
        }
        // dP = dO·v
        float dp[RPS * KPI];
        [[unroll]] for (uint x = 0; x < RPS * KPI; ++x) dp[x] = 0.0;
        [[unroll]] for (uint c = 0; c < DV4; ++c) {
            [[unroll]] for (uint r = 0; r < RPS; ++r) {
#ifdef QKV_SHUFFLE
                const vec4 ov = PAIRED ? subgroupShuffle(qf[c], RPS + r) : subgroupShuffle(of[(r / WG) * DV4 + c], r % WG);
#else
                const vec4 ov = texelFetch(do_tex, int((tex0 + r) * DV4 + c));
#endif
                [[unroll]] for (uint n = 0; n < KPI; ++n) {
                    const vec4 vv = v[n * DV4 + c];
                    dp[r * KPI + n] += ov.x * vv.x + ov.y * vv.y + ov.z * vv.z + ov.w * vv.w;
                }
            }
        }
        // P·Z (in dp) and dR (in s); a masked key gets exactly 0
        bool ok[RPS * KPI];
        [[unroll]] for (uint r = 0; r < RPS; ++r) {
#ifdef QKV_SHUFFLE
            const vec4 st = subgroupShuffle(sf[r / WG], r % WG);
#else
            const vec4 st = texelFetch(stats, int(tex0 + r));
#endif
            uvec4 drawn = uvec4(0u);
            vec4 check = vec4(0.0);  // Σ P, Σ P·dP, Σ P·|dP|, keys allowed (STORE_SUMS)
            [[unroll]] for (uint n = 0; n < KPI; ++n) {
                const uint x = r * KPI + n;
                const bool allowed = s[x] != neg_inf;
                const float p = allowed ? exp(s[x] - st.x) : 0.0;
                float z = 1.0;
                if ((FEATURES & SCORE_DROPOUT) != 0u) {  // a lane's keys share their counters (KPI divides 4, or 4 divides KPI)
                    const uint key = kfirst + n;
                    if (n % 4u == 0u) drawn = dropout_draws(qz * pc.q_len + i0 + r, key / 4u, sp);
                    z = drawn[key % 4u] >= sp.dropout_threshold ? sp.dropout_scale : 0.0;
                }
                const float ds = allowed ? p * (z * dp[x] - st.y) : 0.0;
#ifdef QKV_SHUFFLE
                if (STORE_SUMS && allowed) check += vec4(p, p * z * dp[x], p * abs(z * dp[x]), 1.0);
#endif
                s[x] = ds * cap[x];
                dp[x] = allowed ? p * z : 0.0;
                ok[x] = allowed;
            }
#ifdef QKV_SHUFFLE
            // The fused order (contract/backward.h): dR's bits for flash_bwd_dq_dr.comp, a masked
            // key's as the sentinel it skips (a NaN as the quiet NaN, never the sentinel); the
            // block's check sums, added across the subgroup lane by lane, in lane order.
            if (STORE_DR) {
                const uint dz = qz - pc.dr_first;  // the chunk's (batch, query head)s (fused_heads)
                const uint at = ((dz * pc.blocks + block) * pc.npad_q + i0 + r) * BLOCK + lane * KPI;
                [[unroll]] for (uint n = 0; n < KPI; ++n) {
                    const uint x = r * KPI + n;
                    dr_out[at + n] = !ok[x] ? BWD_DR_MASKED : isnan(s[x]) ? 0x7fc00000u : floatBitsToUint(s[x]);
                }
            }
            if (STORE_SUMS) {
                vec4 total = vec4(0.0);
                [[unroll]] for (uint m = 0u; m < WG; ++m) total += subgroupShuffle(check, m);
                if (lane == 0u) dr_sums[((qz - pc.dr_first) * pc.blocks + block) * pc.npad_q + i0 + r] = total;
            }
#endif
        }
        // dv += P·Z·dO, dk += dR·(scale·q)
        [[unroll]] for (uint c = 0; c < DV4; ++c) {
            [[unroll]] for (uint r = 0; r < RPS; ++r) {
#ifdef QKV_SHUFFLE
                const vec4 ov = PAIRED ? subgroupShuffle(qf[c], RPS + r) : subgroupShuffle(of[(r / WG) * DV4 + c], r % WG);
#else
                const vec4 ov = texelFetch(do_tex, int((tex0 + r) * DV4 + c));
#endif
                [[unroll]] for (uint n = 0; n < KPI; ++n) {
                    if (CAREFUL != 0u)
                        dv[n * DV4 + c] += ok[r * KPI + n] ? dp[r * KPI + n] * ov : vec4(0.0);
                    else
                        dv[n * DV4 + c] += dp[r * KPI + n] * ov;
                }
            }
        }
        [[unroll]] for (uint c = 0; c < D4; ++c) {
            [[unroll]] for (uint r = 0; r < RPS; ++r) {
#ifdef QKV_SHUFFLE
                const vec4 qv = subgroupShuffle(qf[(r / WG) * D4 + c], r % WG);
#else
                const vec4 qv = texelFetch(q_tex, int((tex0 + r) * D4 + c)) * pc.scale;
#endif
                [[unroll]] for (uint n = 0; n < KPI; ++n) {
                    if (CAREFUL != 0u)
                        dk[n * D4 + c] += ok[r * KPI + n] ? s[r * KPI + n] * qv : vec4(0.0);
                    else
                        dk[n * D4 + c] += s[r * KPI + n] * qv;
                }
            }
        }
        t += RPS;
    }

    // dk and dv of the lane's keys
    bool nonfinite = false;
    [[unroll]] for (uint n = 0; n < KPI; ++n) {
        const uint key = kfirst + n;
        if (!mine || key >= pc.kv_len) continue;
        const uint kb = (kvz * pc.kv_len + key) * pc.d, vb = (kvz * pc.kv_len + key) * pc.dv;
        [[unroll]] for (uint c = 0; c < D4; ++c) {
            nonfinite = nonfinite || any(isnan(dk[n * D4 + c])) || any(isinf(dk[n * D4 + c]));
            [[unroll]] for (uint e = 0; e < 4; ++e)
                if (c + 1u < D4 || c * 4u + e < pc.d) dk_out[kb + c * 4u + e] = dk[n * D4 + c][e];
        }
        [[unroll]] for (uint c = 0; c < DV4; ++c) {
            nonfinite = nonfinite || any(isnan(dv[n * DV4 + c])) || any(isinf(dv[n * DV4 + c]));
            [[unroll]] for (uint e = 0; e < 4; ++e)
                if (c + 1u < DV4 || c * 4u + e < pc.dv) dv_out[vb + c * 4u + e] = dv[n * DV4 + c][e];
        }
    }
    if (nonfinite) atomicOr(verdict[0], BWD_FLAG_NONFINITE_GRADIENT);
}
