#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_samplerless_texture_functions : require
#extension GL_EXT_control_flow_attributes : enable
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_shader_16bit_storage : require
// The backward pass's dq, cooperative-matrix family (contract/backward.h: coop_bwd_spec; the plan
// src/kernels/flash_coop_backward_plan.hpp). A workgroup of W subgroups owns W·M query rows of one
// (batch, query head), subgroup w rows w·M .. w·M + M - 1, and streams the keys [begin, stop) that
// its rows may see STEP at a time (flash_bwd_dq.comp's chunks: resuming from dq and the check's
// sums as an earlier chunk left them, dq scaled after the last). Per step:
//   load_step   K and V rows -> shared float16 (zero beyond the widths), barrier
//   products    S = Q·Kᵀ and dP = dO·Vᵀ (M x N float32 accumulators), stored to shared, barrier
//   elements    the score rules, P = e^(s - lse'), dS = P∘(dP - D)·(1 - tanh²) as float16, P (or
//               -1 for a key the row may not see) kept for the check, barrier; with BWD_CHECK one
//               invocation per row adds Σ P, Σ P·dP, Σ P·|dP| and the keys allowed, keys in order
//   accumulate  dQ += dS·K (each subgroup its rows' M x N accumulators), barrier
// One writer per element of dq, no atomics but the verdict's. The (batch, K/V head)s whose K holds
// a NaN or Inf are the scalar kernel's careful pipeline's (flash_bwd_dq.comp, CAREFUL).
#include "contract/backward.h"
#include "contract/coop.h"
#include "contract/score.h"
#define QKV_SCORE_PARAMS_BINDING BWD_DQ_BINDING_PARAMS
#include "score_rules.glsl"
#include "backward.glsl"

layout(local_size_x_id = COOP_BWD_SPEC_WG, local_size_y = 1, local_size_z = 1) in;
layout(constant_id = COOP_BWD_SPEC_LANES) const uint LANES = 8;
layout(constant_id = COOP_BWD_SPEC_M) const uint M = 8;
layout(constant_id = COOP_BWD_SPEC_N) const uint N = 8;
layout(constant_id = COOP_BWD_SPEC_K) const uint K = 8;
layout(constant_id = COOP_BWD_SPEC_D_PAD) const uint D_PAD = 64;
layout(constant_id = COOP_BWD_SPEC_DV_PAD) const uint DV_PAD = 64;
layout(constant_id = COOP_BWD_SPEC_STEP) const uint BC = 8;  // keys per step
layout(constant_id = COOP_BWD_SPEC_MASKS) const uint MASKS = 0;
layout(constant_id = COOP_BWD_SPEC_FEATURES) const uint FEATURES = 0;
layout(constant_id = COOP_BWD_SPEC_EXTRAS) const uint EXTRAS = 0;

layout(binding = BWD_DQ_BINDING_Q) uniform textureBuffer q_tex;
layout(binding = BWD_DQ_BINDING_K) uniform textureBuffer k_tex;
layout(binding = BWD_DQ_BINDING_V) uniform textureBuffer v_tex;
layout(binding = BWD_DQ_BINDING_DO) uniform textureBuffer do_tex;
layout(std430, binding = BWD_DQ_BINDING_MASK) readonly buffer MaskBits { uint mask_bits[]; };
layout(std430, binding = BWD_DQ_BINDING_ADDITIVE) readonly buffer Additive { float additive[]; };
layout(binding = BWD_DQ_BINDING_STATS) uniform textureBuffer stats;
layout(std430, binding = BWD_DQ_BINDING_DQ) buffer DQ { float dq_out[]; };  // (B, Hq, L, E)
layout(std430, binding = BWD_DQ_BINDING_DS) writeonly buffer DS { float ds_out[]; };
layout(std430, binding = BWD_DQ_BINDING_SUMS) buffer Sums { vec4 sums[]; };
layout(std430, binding = BWD_DQ_BINDING_FLAGS) readonly buffer Flags { uint k_nonfinite[]; };
layout(std430, binding = BWD_DQ_BINDING_VERDICT) buffer Verdict { uint verdict[]; };

layout(push_constant) uniform Push { bwd_push pc; };

#define MAT_A coopmat<float16_t, gl_ScopeSubgroup, M, K, gl_MatrixUseA>
#define MAT_B coopmat<float16_t, gl_ScopeSubgroup, K, N, gl_MatrixUseB>
#define MAT_C coopmat<float, gl_ScopeSubgroup, M, N, gl_MatrixUseAccumulator>

const uint WG = gl_WorkGroupSize.x;
const uint W = WG / LANES;
const uint BR = W * M;  // rows per workgroup
const uint QS = D_PAD + COOP_PAD_HALVES;
const uint VS = DV_PAD + COOP_PAD_HALVES;
const uint SS = BC + COOP_PAD_FLOATS;
const uint PS = BC + COOP_PAD_HALVES;
const uint NS = N + COOP_PAD_FLOATS;
const uint DT = D_PAD / N;
const bool CHECK = (EXTRAS & BWD_CHECK) != 0u;

shared float16_t q_sh[BR * QS];
shared float16_t do_sh[BR * VS];
shared float16_t k_sh[BC * QS];
shared float16_t v_sh[BC * VS];
shared float s_sh[BR * SS];   // S, then P (-1: a key the row may not see)
shared float dp_sh[BR * SS];  // dP
shared float16_t ds_sh[BR * PS];
shared vec2 st_sh[BR];    // lse', D
shared vec4 chk_sh[BR];   // Σ P, Σ P·dP, Σ P·|dP|, keys allowed
shared float stage[W * M * NS];

#define LOAD_ROWS(tex, dst, first, rows, texels, width, padded, stride)                     \
    for (uint x = gl_LocalInvocationID.x; x < (rows) * ((padded) / 4u); x += WG) {         \
        const uint r = x / ((padded) / 4u), c = x % ((padded) / 4u);                        \
        vec4 t = vec4(0.0);                                                                 \
        if (c < (texels)) t = texelFetch(tex, int(((first) + r) * (texels) + c));           \
        [[unroll]] for (uint e = 0; e < 4u; ++e)                                            \
            dst[r * (stride) + c * 4u + e] = float16_t(c * 4u + e < (width) ? t[e] : 0.0);  \
    }

void main() {
    const bool causal = (MASKS & MASK_FLAG_CAUSAL) != 0u, has_mask = (MASKS & MASK_FLAG_BOOLEAN) != 0u;
    const bool has_add = (MASKS & MASK_FLAG_ADDITIVE) != 0u;
    const bool resume = (pc.flags & BWD_RESUME) != 0u, partial = (pc.flags & BWD_PARTIAL) != 0u;
    const float neg_inf = uintBitsToFloat(0xff800000u);
    const uint w = gl_WorkGroupID.x + pc.group_x;
    const uint block = !causal ? w : ((w & 1u) == 0u ? w / 2u : pc.blocks - 1u - w / 2u);
    const uint row0 = block * BR;
    const uint z = gl_WorkGroupID.z + pc.group_z;
    const uint batch = z / pc.heads, head = z % pc.heads;
    const uint kvz = batch * (pc.heads / pc.group) + head / pc.group;
    const uint qbase = z * pc.npad_q, kvbase = kvz * pc.npad_kv;
    const uint mbase = batch * pc.m_bs + head * pc.m_hs, abase = batch * pc.a_bs + head * pc.m_hs;
    const uint sg = gl_SubgroupID, me = gl_LocalInvocationID.x, lane = gl_SubgroupInvocationID;
    const uint d4 = (pc.d + 3u) / 4u, dv4 = (pc.dv + 3u) / 4u;
    score_params sp = no_score_params();
    float slope = 0.0;
    if (FEATURES != 0u) sp = score_in;
    if ((FEATURES & SCORE_ALIBI) != 0u) slope = head_values[head].x;

    // The block's Q, dO, lse' and D, the check's sums and the subgroup's accumulators.
    LOAD_ROWS(q_tex, q_sh, qbase + row0, BR, d4, pc.d, D_PAD, QS)
    LOAD_ROWS(do_tex, do_sh, qbase + row0, BR, dv4, pc.dv, DV_PAD, VS)
    for (uint r = me; r < BR; r += WG) {
        st_sh[r] = texelFetch(stats, int(qbase + row0 + r)).xy;
        const uint row = row0 + r;
        chk_sh[r] = CHECK && resume && row < pc.q_len ? sums[z * pc.q_len + row] : vec4(0.0);
    }
    MAT_C dq[DT];
    const uint rfirst = row0 + sg * M;
    [[unroll]] for (uint t = 0; t < DT; ++t) {
        dq[t] = MAT_C(0.0);
        if (resume) {
            for (uint x = lane; x < M * N; x += LANES) {
                const uint row = rfirst + x / N, col = t * N + x % N;
                stage[(sg * M + x / N) * NS + x % N] =
                    row < pc.q_len && col < pc.d ? dq_out[(z * pc.q_len + row) * pc.d + col] : 0.0;
            }
            subgroupMemoryBarrierShared();
            coopMatLoad(dq[t], stage, sg * M * NS, NS, gl_CooperativeMatrixLayoutRowMajor);
            subgroupMemoryBarrierShared();
        }
    }
    barrier();

    // This pipeline's (batch, head)s: those whose K is finite.
    const bool mine = k_nonfinite[kvz] == 0u;
    const int p_first = int(row0) + pc.causal_offset;
    const int p_last = int(min(row0 + BR, max(pc.q_len, 1u))) - 1 + pc.causal_offset;
    const uvec2 keys = visible_keys(p_first, p_last, FEATURES, causal, sp, pc.begin, min(pc.stop, pc.kv_len));
    const uint kv_end = mine ? keys.y : 0u;
    const uint kv_first = pc.begin + (keys.x - pc.begin) / BC * BC;
    for (uint j0 = kv_first; j0 < kv_end; j0 += BC) {
        // load_step
        LOAD_ROWS(k_tex, k_sh, kvbase + j0, BC, d4, pc.d, D_PAD, QS)
        LOAD_ROWS(v_tex, v_sh, kvbase + j0, BC, dv4, pc.dv, DV_PAD, VS)
        barrier();

        // products: S = Q·Kᵀ, dP = dO·Vᵀ for the subgroup's rows
        [[unroll]] for (uint ct = 0; ct < BC / N; ++ct) {
            MAT_C s = MAT_C(0.0), dp = MAT_C(0.0);
            [[unroll]] for (uint kt = 0; kt < D_PAD / K; ++kt) {
                MAT_A a;
                MAT_B b;
                coopMatLoad(a, q_sh, sg * M * QS + kt * K, QS, gl_CooperativeMatrixLayoutRowMajor);
                coopMatLoad(b, k_sh, ct * N * QS + kt * K, QS, gl_CooperativeMatrixLayoutColumnMajor);
                s = coopMatMulAdd(a, b, s);
            }
            [[unroll]] for (uint kt = 0; kt < DV_PAD / K; ++kt) {
                MAT_A a;
                MAT_B b;
                coopMatLoad(a, do_sh, sg * M * VS + kt * K, VS, gl_CooperativeMatrixLayoutRowMajor);
                coopMatLoad(b, v_sh, ct * N * VS + kt * K, VS, gl_CooperativeMatrixLayoutColumnMajor);
                dp = coopMatMulAdd(a, b, dp);
            }
            coopMatStore(s, s_sh, sg * M * SS + ct * N, SS, gl_CooperativeMatrixLayoutRowMajor);
            coopMatStore(dp, dp_sh, sg * M * SS + ct * N, SS, gl_CooperativeMatrixLayoutRowMajor);
        }
        barrier();

        // elements: dS (times the softcap's slope) as float16, P kept for the check
        for (uint x = me; x < BR * BC; x += WG) {
            const uint rr = x / BC, j = x % BC;
            const uint row = row0 + rr, key = j0 + j;
            const float s = s_sh[rr * SS + j] * pc.scale;
            const float cap = (FEATURES & SCORE_SOFTCAP) != 0u ? softcap_slope(s, sp) : 1.0;
            const uint mrow = min(row, max(pc.q_len, 1u) - 1u);
            const uint mi = mrow * pc.m_rs + min(key, max(pc.kv_len, 1u) - 1u) * pc.m_cs, bit = mbase + mi;
            bool allowed = true;
            float add = 0.0;
            if (has_mask) allowed = ((mask_bits[bit >> 5] >> (bit & 31u)) & 1u) != 0u;
            if (has_add) add = additive[abase + mi];
            const int p = int(row) + pc.causal_offset;
            const float y = rule_score(s, int(key) - p, nearest_key_distance(p, pc.kv_len), FEATURES, MASKS, sp,
                                       slope, allowed, add);
            const bool ok = key < pc.stop && key < pc.kv_len && row < pc.q_len && y != neg_inf;
            const vec2 st = st_sh[rr];
            const float pr = ok ? exp(y - st.x) : 0.0;
            ds_sh[rr * PS + j] = float16_t(ok ? pr * (dp_sh[rr * SS + j] - st.y) * cap : 0.0);
            s_sh[rr * SS + j] = ok ? pr : -1.0;
        }
        barrier();
        if (CHECK) {
            for (uint rr = me; rr < BR; rr += WG) {
                vec4 c = chk_sh[rr];
                for (uint j = 0; j < BC; ++j) {
                    const float pr = s_sh[rr * SS + j], dpv = dp_sh[rr * SS + j];
                    if (!(pr < 0.0)) c += vec4(pr, pr * dpv, pr * abs(dpv), 1.0);
                }
                chk_sh[rr] = c;
            }
        }

        // accumulate: dQ += dS·K
        [[unroll]] for (uint kt = 0; kt < BC / K; ++kt) {
            MAT_A a;
            coopMatLoad(a, ds_sh, sg * M * PS + kt * K, PS, gl_CooperativeMatrixLayoutRowMajor);
            [[unroll]] for (uint dt = 0; dt < DT; ++dt) {
                MAT_B b;
                coopMatLoad(b, k_sh, kt * K * QS + dt * N, QS, gl_CooperativeMatrixLayoutRowMajor);
                dq[dt] = coopMatMulAdd(a, b, dq[dt]);
            }
        }
        barrier();
    }

    // dq (scaled after the last chunk), the check's sums, the verdict
    bool nonfinite = false;
    const float factor = partial ? 1.0 : pc.scale;
    [[unroll]] for (uint dt = 0; dt < DT; ++dt) {
        coopMatStore(dq[dt], stage, sg * M * NS, NS, gl_CooperativeMatrixLayoutRowMajor);
        subgroupMemoryBarrierShared();
        for (uint x = lane; x < M * N; x += LANES) {
            const uint row = rfirst + x / N, col = dt * N + x % N;
            const float val = stage[(sg * M + x / N) * NS + x % N] * factor;
            if (!mine || row >= pc.q_len || col >= pc.d) continue;
            nonfinite = nonfinite || isnan(val) || isinf(val);
            dq_out[(z * pc.q_len + row) * pc.d + col] = val;
        }
        subgroupMemoryBarrierShared();
    }
    if (CHECK && mine) {
        for (uint rr = me; rr < BR; rr += WG) {
            const uint row = row0 + rr;
            if (row >= pc.q_len) continue;
            const uint r = z * pc.q_len + row;
            if (partial) {
                sums[r] = chk_sh[rr];
                continue;
            }
            const uint bad = saved_row_verdict(texelFetch(stats, int(qbase + row)), chk_sh[rr],
                                               int(row) + pc.causal_offset, pc.kv_len, FEATURES, sp, slope, head);
            if (bad != 0u) {
                atomicOr(verdict[0], bad);
                atomicMin(verdict[1], r);
            }
        }
    }
    if (nonfinite) atomicOr(verdict[0], BWD_FLAG_NONFINITE_GRADIENT);
}
