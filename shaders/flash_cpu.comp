#version 450
#extension GL_GOOGLE_include_directive : require
// texelFetch on textureBuffer: uniform texel buffers as plain images (a sampled image of Dim Buffer is
// invalid SPIR-V, which Mesa 25 warns about)
#extension GL_EXT_samplerless_texture_functions : require
#extension GL_EXT_control_flow_attributes : enable
#ifdef QKV_SHUFFLE
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#endif
// Fused attention, CPU-device family (lavapipe / llvmpipe and other VK_PHYSICAL_DEVICE_TYPE_CPU
// drivers): the same results as flash.comp, shaped for a device that runs one workgroup on one
// CPU thread with the invocations of a subgroup as the lanes of a SIMD vector.
//
//   - one subgroup per workgroup (WG invocations, the device's subgroup size): no shared memory,
//     no barriers;
//   - each invocation owns RPI query rows (row0 + i·WG + lane) with their own online softmax
//     (running maximum m, sum l, accumulator) in registers;
//   - every step takes KPS keys; K and V rows are read through uniform texel buffers (RGBA32F or
//     RGBA16F, prepared by flash_cpu_pack.comp). The texel a step needs is the same for every
//     lane, but inside a loop llvmpipe cannot prove that the first lane is active, so it fetches
//     such a texel once per lane, like any gather. With QKV_SHUFFLE (the host's choice where the
//     workgroup is one subgroup that offers subgroupShuffle, src/kernels/flash_cpu.cpp) lane i
//     fetches texel c of key j0 + i, one gather for up to WG keys, and subgroupShuffle(x, j), with
//     j a constant once unrolled, hands key j's texel to every lane: an extract and a broadcast.
//     That made the kernel 1.6x faster on lavapipe (docs/devices.md);
//   - every inner loop has a constant trip count (specialization constants), so it is unrolled:
//     the key-step loop is the only loop of the shader.
//
// Shapes and layouts as flash.comp (contract/flash.h): L query rows per (batch, query head), S
// keys per (batch, K/V head), query head h reading K/V head h / group, a signed causal offset, and
// broadcast mask strides. flash_cpu_pack.comp has put Q (npad_q rows per (batch, query head)) and
// K, V (npad_kv rows per (batch, K/V head)) into zero-padded texel rows.
//
// Semantics (as flash.comp): scores q·k·scale (+ additive mask), masked -> -inf and weight 0; a
// row with nothing to attend gets zeros; a NaN or +inf allowed score makes the row NaN (it turns
// the running sum into NaN, which stays NaN); a masked key adds nothing even if its value is NaN.
// That last rule costs a select per product, so it has its own pipeline (CAREFUL = 1), dispatched
// after the plain one (CAREFUL = 0): each handles the (batch, head)s whose V does (does not) hold
// a NaN or Inf, as flagged by flash_cpu_pack.comp, and runs no key step for the others.
//
// llvmpipe executes both sides of every branch under a lane mask, even where the condition is
// the same for all lanes; so what the host knows (the mask kinds) is a specialization constant,
// and what only the device knows (CAREFUL) empties the key loop rather than branching around it.
//
// Dropout (SCORE_DROPOUT, dropout.glsl): each weight is kept, scaled by 1 / (1 - p), or dropped
// after the row's softmax statistics have seen it; the lse and the sinks are not affected.
//
// Key chunks: a dispatch covers keys [kv_begin, kv_stop) (a multiple of KPS apart), resuming from
// (m, l) in `state` and the accumulator in the output (FLASH_RESUME) and handing them on (FLASH_PARTIAL); FLASH_STATS stores the last chunk's
// (m, l) for flash_weights.comp.
// llvmpipe ends every loop of an invocation after 65,535 iterations in total; the host keeps the
// steps of one dispatch below that (src/kernels/flash_cpu.cpp).
//
// Causal balance: llvmpipe gives each thread a contiguous range of workgroups. With a causal
// mask, workgroup w takes row block w/2 (w even) or nb-1-w/2 (w odd), so every pair of
// neighbouring workgroups costs the same and the threads finish together.

#include "contract/flash.h"
#include "contract/score.h"
#include "values.glsl"
#define QKV_SCORE_PARAMS_BINDING FLASH_CPU_BINDING_PARAMS
#include "score_rules.glsl"
#include "contract/philox.h"
#include "dropout.glsl"

layout(local_size_x_id = FLASH_CPU_SPEC_WG, local_size_y = 1, local_size_z = 1) in;
layout(constant_id = FLASH_CPU_SPEC_RPI) const uint RPI = 4;   // query rows per invocation
layout(constant_id = FLASH_CPU_SPEC_KPS) const uint KPS = 8;   // keys per step
layout(constant_id = FLASH_CPU_SPEC_D4) const uint D4 = 16;   // texels (4 floats) per Q/K row: ceil(d / 4)
layout(constant_id = FLASH_CPU_SPEC_DV4) const uint DV4 = 16;  // texels per V row: ceil(dv / 4)
layout(constant_id = FLASH_CPU_SPEC_MASKS) const uint MASKS = 0;  // MASK_FLAG_CAUSAL | MASK_FLAG_BOOLEAN | MASK_FLAG_ADDITIVE
layout(constant_id = FLASH_CPU_SPEC_CAREFUL) const uint CAREFUL = 0;  // this pipeline's kind of (batch, head), see above
layout(constant_id = FLASH_CPU_SPEC_FEATURES) const uint FEATURES = 0;  // contract/score.h's SCORE_* rules of this call

layout(binding = FLASH_CPU_BINDING_Q) uniform textureBuffer q_tex;  // [batch·heads][npad_q][D4], zero-padded
layout(binding = FLASH_CPU_BINDING_K) uniform textureBuffer k_tex;  // [batch·kv_heads][npad_kv][D4]
layout(binding = FLASH_CPU_BINDING_V) uniform textureBuffer v_tex;  // [batch·kv_heads][npad_kv][DV4]
layout(std430, binding = FLASH_CPU_BINDING_MASK) readonly buffer MaskBits { uint mask_bits[]; };
layout(std430, binding = FLASH_CPU_BINDING_ADDITIVE) readonly buffer Additive { float additive[]; };
layout(std430, binding = FLASH_CPU_BINDING_OUT) buffer O { float o_out[]; };
layout(std430, binding = FLASH_CPU_BINDING_STATE) buffer State { float state[]; };  // (m, l) per (batch, head, row)
layout(std430, binding = FLASH_CPU_BINDING_VFLAGS) readonly buffer VFlags { uint v_nonfinite[]; };  // per (batch, kv head)
layout(std430, binding = FLASH_CPU_BINDING_LSE) writeonly buffer Lse { float lse_out[]; };  // per (batch, head, row)

layout(push_constant) uniform Push { flash_cpu_push pc; };

const uint WG = gl_WorkGroupSize.x;
const uint BLOCK = WG * RPI;
// Rules that change every score (not only the masked keys): the score step runs on every key step.
const bool EVERY_STEP = (FEATURES & SCORE_EVERY_STEP) != 0u;

#ifdef QKV_SHUFFLE
// Keys fetched per round: one per lane, KPS in ROUNDS rounds (KPS may exceed WG).
const uint ROUNDS = (KPS + WG - 1u) / WG;
#endif

void main() {
    const bool causal = (MASKS & MASK_FLAG_CAUSAL) != 0u, has_mask = (MASKS & MASK_FLAG_BOOLEAN) != 0u;
    const bool has_add = (MASKS & MASK_FLAG_ADDITIVE) != 0u;
    const bool resume = (pc.flags & FLASH_RESUME) != 0u, partial = (pc.flags & FLASH_PARTIAL) != 0u;
    const bool stats = (pc.flags & FLASH_STATS) != 0u;
    const float neg_inf = uintBitsToFloat(0xff800000u);
    const uint w = gl_WorkGroupID.x + pc.group_x;
    const uint block = !causal ? w : ((w & 1u) == 0u ? w / 2u : pc.blocks - 1u - w / 2u);
    const uint row0 = block * BLOCK;
    const uint z = gl_WorkGroupID.z + pc.group_z;
    const uint batch = z / pc.heads, head = z % pc.heads;
    const uint kvz = batch * (pc.heads / pc.group) + head / pc.group;  // (batch, K/V head)
    const uint lane = gl_LocalInvocationID.x;
    const uint qbase = z * pc.npad_q, kvbase = kvz * pc.npad_kv;
    const uint obase = batch * pc.heads * pc.q_len * pc.dv + head * pc.o_hs;
    const uint mbase = batch * pc.m_bs + head * pc.m_hs, abase = batch * pc.a_bs + head * pc.m_hs;
    score_params sp = no_score_params();
    float slope = 0.0, sink = neg_inf;
    if (FEATURES != 0u) sp = score_in;
    if ((FEATURES & SCORE_ALIBI) != 0u) slope = head_values[head].x;
    if ((FEATURES & SCORE_SINKS) != 0u) sink = head_values[head].y;

    vec4 q[RPI * D4];
    [[unroll]] for (uint i = 0; i < RPI; ++i)
        [[unroll]] for (uint c = 0; c < D4; ++c)
            q[i * D4 + c] = texelFetch(q_tex, int((qbase + row0 + i * WG + lane) * D4 + c)) * pc.scale;

    // Output columns: every texel but the last is whole (DV4 = ceil(dv / 4)), so only the last one's
    // stores and loads test the width: a branch per element would cost LLVM seconds to compile at
    // wide heads (4·DV4 of them per row; docs/devices.md).
    float m[RPI], l[RPI];
    vec4 acc[RPI * DV4];
    [[unroll]] for (uint i = 0; i < RPI; ++i) {
        const uint row = row0 + i * WG + lane;
        m[i] = neg_inf;
        l[i] = 0.0;
        [[unroll]] for (uint c = 0; c < DV4; ++c) acc[i * DV4 + c] = vec4(0.0);
        if (resume && row < pc.q_len) {
            const uint si = 2u * (z * pc.q_len + row);
            m[i] = state[si];
            l[i] = state[si + 1u];
            const uint ob = obase + row * pc.o_rs;
            [[unroll]] for (uint c = 0; c < DV4; ++c)
                [[unroll]] for (uint e = 0; e < 4; ++e)
                    if (c + 1u < DV4 || c * 4u + e < pc.dv) acc[i * DV4 + c][e] = o_out[ob + c * 4u + e];
        }
    }

    // This pipeline's (batch, head)s only: the others get no key step and no output.
    const bool mine = (v_nonfinite[kvz] != 0u) == (CAREFUL != 0u);
    const uint rows_out = mine ? pc.q_len : 0u;
    const bool any_mask = has_mask || has_add;
    // Causal and the window: keys outside what the block's rows may see are masked for every row of
    // the block; no step runs for them (the first step starts at a multiple of KPS from kv_begin).
    const int p_first = int(row0) + pc.causal_offset;
    const int p_last = int(min(row0 + BLOCK, max(pc.q_len, 1u))) - 1 + pc.causal_offset;
    const uvec2 keys = visible_keys(p_first, p_last, FEATURES, causal, sp, pc.kv_begin, min(pc.kv_stop, pc.kv_len));
    uint kv_end = keys.y;
    if (!mine) kv_end = 0u;
    const uint kv_first = pc.kv_begin + (keys.x - pc.kv_begin) / KPS * KPS;
    // The first key step that the causal limit can cut (the first row's last key is row0 + offset).
    const int diagonal = int(row0) + pc.causal_offset + 1;
    for (uint j0 = kv_first; j0 < kv_end; j0 += KPS) {
        // scores of RPI rows x KPS keys
        float s[RPI * KPS];
        [[unroll]] for (uint k = 0; k < RPI * KPS; ++k) s[k] = 0.0;
#ifdef QKV_SHUFFLE
        // Lane i fetches key j0 + r·WG + i (the last key of the step where that is past it).
        uint mine[ROUNDS];
        [[unroll]] for (uint r = 0; r < ROUNDS; ++r)
            mine[r] = kvbase + j0 + min(r * WG + gl_SubgroupInvocationID, KPS - 1u);
#endif
        [[unroll]] for (uint c = 0; c < D4; ++c) {
#ifdef QKV_SHUFFLE
            vec4 fetched[ROUNDS];
            [[unroll]] for (uint r = 0; r < ROUNDS; ++r) fetched[r] = texelFetch(k_tex, int(mine[r] * D4 + c));
#endif
            [[unroll]] for (uint j = 0; j < KPS; ++j) {
#ifdef QKV_SHUFFLE
                const vec4 kv = subgroupShuffle(fetched[j / WG], j % WG);
#else
                const vec4 kv = texelFetch(k_tex, int((kvbase + j0 + j) * D4 + c));
#endif
                [[unroll]] for (uint i = 0; i < RPI; ++i) {
                    const vec4 qv = q[i * D4 + c];
                    s[i * KPS + j] += qv.x * kv.x + qv.y * kv.y + qv.z * kv.z + qv.w * kv.w;
                }
            }
        }
        // the score rules (score_rules.glsl): only on the steps that need them (the last keys, the
        // causal diagonal, explicit masks; every step with a softcap, ALiBi or a window)
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
        // online softmax, per row
        [[unroll]] for (uint i = 0; i < RPI; ++i) {
            float mx = s[i * KPS];
            [[unroll]] for (uint j = 1; j < KPS; ++j) mx = max(mx, s[i * KPS + j]);
            const float m_new = max(m[i], mx);
            const float m_use = m_new == neg_inf ? 0.0 : m_new;  // nothing allowed yet: no NaN from -inf - -inf
            const float alpha = exp(m[i] - m_use);
            float sum = 0.0;
            [[unroll]] for (uint j = 0; j < KPS; ++j) {
                const float x = s[i * KPS + j];
                const float p = x == neg_inf ? MASKED_WEIGHT : exp(x - m_use);
                s[i * KPS + j] = p;
                sum += p;
            }
            l[i] = l[i] * alpha + sum;
            m[i] = m_new;
            // Dropout (dropout.glsl): the softmax's sum saw every weight; the values see the kept
            // ones, scaled, and a dropped one as a masked key (nothing added, even to a NaN value).
            // The host keeps KPS and every step's first key multiples of 4 (one Philox per 4 keys).
            if ((FEATURES & SCORE_DROPOUT) != 0u) {
                const uint r = z * pc.q_len + row0 + i * WG + lane;
                [[unroll]] for (uint q4 = 0; q4 < KPS / 4u; ++q4) {
                    const uvec4 x = dropout_draws(r, j0 / 4u + q4, sp);
                    [[unroll]] for (uint e = 0; e < 4u; ++e) {
                        const float p = s[i * KPS + q4 * 4u + e];
                        s[i * KPS + q4 * 4u + e] = x[e] >= sp.dropout_threshold ? p * sp.dropout_scale : MASKED_WEIGHT;
                    }
                }
            }
            if (CAREFUL != 0u)
                [[unroll]] for (uint c = 0; c < DV4; ++c) acc[i * DV4 + c] = rescaled(acc[i * DV4 + c], alpha);
            else
                [[unroll]] for (uint c = 0; c < DV4; ++c) acc[i * DV4 + c] *= alpha;
        }
        // values
        if (CAREFUL != 0u) {  // values.glsl: a masked key adds nothing, an underflowed weight keeps infinities
            [[unroll]] for (uint c = 0; c < DV4; ++c) {
#ifdef QKV_SHUFFLE
                vec4 fetched[ROUNDS];
                [[unroll]] for (uint r = 0; r < ROUNDS; ++r) fetched[r] = texelFetch(v_tex, int(mine[r] * DV4 + c));
#endif
                [[unroll]] for (uint j = 0; j < KPS; ++j) {
#ifdef QKV_SHUFFLE
                    const vec4 vv = subgroupShuffle(fetched[j / WG], j % WG);
#else
                    const vec4 vv = texelFetch(v_tex, int((kvbase + j0 + j) * DV4 + c));
#endif
                    [[unroll]] for (uint i = 0; i < RPI; ++i) acc[i * DV4 + c] += weighted(s[i * KPS + j], vv);
                }
            }
        } else {
            [[unroll]] for (uint c = 0; c < DV4; ++c) {
#ifdef QKV_SHUFFLE
                vec4 fetched[ROUNDS];
                [[unroll]] for (uint r = 0; r < ROUNDS; ++r) fetched[r] = texelFetch(v_tex, int(mine[r] * DV4 + c));
#endif
                [[unroll]] for (uint j = 0; j < KPS; ++j) {
#ifdef QKV_SHUFFLE
                    const vec4 vv = subgroupShuffle(fetched[j / WG], j % WG);
#else
                    const vec4 vv = texelFetch(v_tex, int((kvbase + j0 + j) * DV4 + c));
#endif
                    [[unroll]] for (uint i = 0; i < RPI; ++i) acc[i * DV4 + c] += s[i * KPS + j] * vv;
                }
            }
        }
    }

    const float nan = uintBitsToFloat(0x7fc00000u);
    [[unroll]] for (uint i = 0; i < RPI; ++i) {
        const uint row = row0 + i * WG + lane;
        if (row >= rows_out) continue;
        const uint ob = obase + row * pc.o_rs;
        if (partial || stats) {  // hand the running state to the next chunk (or the weights kernel)
            const uint si = 2u * (z * pc.q_len + row);
            state[si] = isnan(l[i]) ? nan : m[i];
            state[si + 1u] = l[i];
        }
        if (partial) {
            [[unroll]] for (uint c = 0; c < DV4; ++c)
                [[unroll]] for (uint e = 0; e < 4; ++e)
                    if (c + 1u < DV4 || c * 4u + e < pc.dv) o_out[ob + c * 4u + e] = acc[i * DV4 + c][e];
        } else {
            // l = 0: nothing to attend (zeros); l NaN: a NaN or +inf score (NaN row); a sink joins l
            // ALiBi's part left out of the row's scores: off its lse, onto its sink (score_rules.glsl)
            const float drop = alibi_drop(int(row) + pc.causal_offset, pc.kv_len, FEATURES, sp, slope);
            const float inv = row_normaliser(m[i], l[i], FEATURES, sink + drop);
            if ((FEATURES & SCORE_LSE) != 0u) lse_out[z * pc.q_len + row] = row_lse(m[i], l[i], false, drop);
            [[unroll]] for (uint c = 0; c < DV4; ++c)
                [[unroll]] for (uint e = 0; e < 4; ++e)
                    if (c + 1u < DV4 || c * 4u + e < pc.dv)
                        o_out[ob + c * 4u + e] = isnan(l[i]) ? nan : acc[i * DV4 + c][e] * inv;
        }
    }
}
