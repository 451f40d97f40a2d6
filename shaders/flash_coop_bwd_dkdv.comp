#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_samplerless_texture_functions : require
#extension GL_EXT_control_flow_attributes : enable
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_shader_16bit_storage : require
// The backward pass's dk and dv, cooperative-matrix family (contract/backward.h: coop_bwd_spec;
// the plan src/kernels/flash_coop_backward_plan.hpp). A workgroup of W subgroups owns W·M keys of
// one (batch, K/V head), subgroup w keys w·M .. w·M + M - 1, and streams the query rows of the K/V
// head's query heads ROWS at a time (the slots of flash_bwd_dkdv.comp: u·npad_q + i, the rows each
// head may see this block from, [begin, stop) per dispatch, resuming from dk and dv). Per step:
//   load_step   Q and dO rows -> shared float16 (zero beyond the widths), lse' and D, barrier
//   products    Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ (M x N float32 accumulators over the width in steps of
//               K), stored to shared float32, barrier
//   elements    s = scale·Sᵀ, the score rules, Pᵀ = e^(s - lse') and dSᵀ = scale·Pᵀ∘(dPᵀ - D)·
//               (1 - tanh²) with a softcap, both as float16 (a key a row may not see: exactly 0),
//               barrier
//   accumulate  dV += Pᵀ·dO, dK += dSᵀ·Q (each subgroup its keys' M x N accumulators), barrier
// dk and dv are written once at the end through a staging tile: one writer per key, no atomics.
// The (batch, K/V head)s whose Q or dO rows hold a NaN or Inf are the scalar kernel's careful
// pipeline's (flash_bwd_dkdv.comp, CAREFUL): a matrix product cannot select per term.
#include "contract/backward.h"
#include "contract/coop.h"
#include "contract/score.h"
#define QKV_SCORE_PARAMS_BINDING BWD_DKDV_BINDING_PARAMS
#include "score_rules.glsl"
#include "backward.glsl"

layout(local_size_x_id = COOP_BWD_SPEC_WG, local_size_y = 1, local_size_z = 1) in;
layout(constant_id = COOP_BWD_SPEC_LANES) const uint LANES = 8;
layout(constant_id = COOP_BWD_SPEC_M) const uint M = 8;
layout(constant_id = COOP_BWD_SPEC_N) const uint N = 8;
layout(constant_id = COOP_BWD_SPEC_K) const uint K = 8;
layout(constant_id = COOP_BWD_SPEC_D_PAD) const uint D_PAD = 64;
layout(constant_id = COOP_BWD_SPEC_DV_PAD) const uint DV_PAD = 64;
layout(constant_id = COOP_BWD_SPEC_STEP) const uint ROWS = 8;
layout(constant_id = COOP_BWD_SPEC_MASKS) const uint MASKS = 0;
layout(constant_id = COOP_BWD_SPEC_FEATURES) const uint FEATURES = 0;

layout(binding = BWD_DKDV_BINDING_Q) uniform textureBuffer q_tex;
layout(binding = BWD_DKDV_BINDING_K) uniform textureBuffer k_tex;
layout(binding = BWD_DKDV_BINDING_V) uniform textureBuffer v_tex;
layout(binding = BWD_DKDV_BINDING_DO) uniform textureBuffer do_tex;
layout(std430, binding = BWD_DKDV_BINDING_MASK) readonly buffer MaskBits { uint mask_bits[]; };
layout(std430, binding = BWD_DKDV_BINDING_ADDITIVE) readonly buffer Additive { float additive[]; };
layout(binding = BWD_DKDV_BINDING_STATS) uniform textureBuffer stats;  // [B·Hq][npad_q] RGBA32F
layout(std430, binding = BWD_DKDV_BINDING_DK) buffer DK { float dk_out[]; };  // (B, Hkv, S, E)
layout(std430, binding = BWD_DKDV_BINDING_DV) buffer DV { float dv_out[]; };  // (B, Hkv, S, Ev)
layout(std430, binding = BWD_DKDV_BINDING_FLAGS) readonly buffer Flags { uint q_nonfinite[]; };
layout(std430, binding = BWD_DKDV_BINDING_VERDICT) buffer Verdict { uint verdict[]; };

layout(push_constant) uniform Push { bwd_push pc; };

#define MAT_A coopmat<float16_t, gl_ScopeSubgroup, M, K, gl_MatrixUseA>
#define MAT_B coopmat<float16_t, gl_ScopeSubgroup, K, N, gl_MatrixUseB>
#define MAT_C coopmat<float, gl_ScopeSubgroup, M, N, gl_MatrixUseAccumulator>

const uint WG = gl_WorkGroupSize.x;
const uint W = WG / LANES;          // subgroups
const uint KEYS = W * M;            // keys per workgroup
const uint QS = D_PAD + COOP_PAD_HALVES;   // row strides of the shared tiles (elements)
const uint VS = DV_PAD + COOP_PAD_HALVES;
const uint SS = ROWS + COOP_PAD_FLOATS;
const uint PS = ROWS + COOP_PAD_HALVES;
const uint NS = N + COOP_PAD_FLOATS;
const uint DT = D_PAD / N, VT = DV_PAD / N;  // accumulator tiles of dK and dV per subgroup

shared float16_t k_sh[KEYS * QS];
shared float16_t v_sh[KEYS * VS];
shared float16_t q_sh[ROWS * QS];
shared float16_t do_sh[ROWS * VS];
shared float s_sh[KEYS * SS];     // Sᵀ
shared float dp_sh[KEYS * SS];    // dPᵀ
shared float16_t p_sh[KEYS * PS];   // Pᵀ, the A operand of dV += Pᵀ·dO
shared float16_t ds_sh[KEYS * PS];  // scale·dSᵀ, the A operand of dK += dSᵀ·Q
shared vec2 st_sh[ROWS];            // lse', D of the step's rows
shared float stage[W * M * NS];     // per subgroup: an accumulator on its way in or out

/// `rows` rows of a texel buffer from texel row `first` (`texels` texels each, `width` elements
/// used) into a shared float16 tile of stride `stride` and `padded` columns, zero beyond `width`.
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
    const bool resume = (pc.flags & BWD_RESUME) != 0u;
    const float neg_inf = uintBitsToFloat(0xff800000u);
    const uint w = gl_WorkGroupID.x + pc.group_x;
    const uint block = !causal ? w : ((w & 1u) == 0u ? w / 2u : pc.blocks - 1u - w / 2u);
    const uint key0 = block * KEYS;
    const uint kvz = gl_WorkGroupID.z + pc.group_z;
    const uint kv_heads = pc.heads / pc.group;
    const uint batch = kvz / kv_heads, kv_head = kvz % kv_heads;
    const uint qz0 = batch * pc.heads + kv_head * pc.group;
    const uint sg = gl_SubgroupID, me = gl_LocalInvocationID.x;
    const uint d4 = (pc.d + 3u) / 4u, dv4 = (pc.dv + 3u) / 4u;
    score_params sp = no_score_params();
    if (FEATURES != 0u) sp = score_in;

    // The block's K and V, and the subgroup's accumulators (dk and dv as an earlier chunk left them).
    LOAD_ROWS(k_tex, k_sh, kvz * pc.npad_kv + key0, KEYS, d4, pc.d, D_PAD, QS)
    LOAD_ROWS(v_tex, v_sh, kvz * pc.npad_kv + key0, KEYS, dv4, pc.dv, DV_PAD, VS)
    MAT_C dk[DT], dv[VT];
    const uint lane = gl_SubgroupInvocationID, kfirst = key0 + sg * M;
    [[unroll]] for (uint t = 0; t < DT; ++t) {
        dk[t] = MAT_C(0.0);
        if (resume) {
            for (uint x = lane; x < M * N; x += LANES) {
                const uint key = kfirst + x / N, col = t * N + x % N;
                stage[(sg * M + x / N) * NS + x % N] =
                    key < pc.kv_len && col < pc.d ? dk_out[(kvz * pc.kv_len + key) * pc.d + col] : 0.0;
            }
            subgroupMemoryBarrierShared();
            coopMatLoad(dk[t], stage, sg * M * NS, NS, gl_CooperativeMatrixLayoutRowMajor);
            subgroupMemoryBarrierShared();
        }
    }
    [[unroll]] for (uint t = 0; t < VT; ++t) {
        dv[t] = MAT_C(0.0);
        if (resume) {
            for (uint x = lane; x < M * N; x += LANES) {
                const uint key = kfirst + x / N, col = t * N + x % N;
                stage[(sg * M + x / N) * NS + x % N] =
                    key < pc.kv_len && col < pc.dv ? dv_out[(kvz * pc.kv_len + key) * pc.dv + col] : 0.0;
            }
            subgroupMemoryBarrierShared();
            coopMatLoad(dv[t], stage, sg * M * NS, NS, gl_CooperativeMatrixLayoutRowMajor);
            subgroupMemoryBarrierShared();
        }
    }
    barrier();

    // This pipeline's (batch, K/V head)s: those whose Q and dO rows are all finite.
    bool flagged = false;
    for (uint u = 0; u < pc.group; ++u) flagged = flagged || q_nonfinite[qz0 + u] != 0u;
    const uint key_last = min(key0 + KEYS, max(pc.kv_len, 1u)) - 1u;
    const uvec2 rows = visible_rows(int(key0), int(key_last), pc.causal_offset, FEATURES, causal, sp, pc.q_len);
    const uint i_first = rows.x / ROWS * ROWS, i_end = rows.y;
    const uint t_end = !flagged && i_end > i_first ? pc.stop : 0u;
    uint t = pc.begin;
    while (t < t_end) {
        const uint u = t / pc.npad_q, i0 = t - u * pc.npad_q;
        if (i0 < i_first) {
            t = u * pc.npad_q + i_first;
            continue;
        }
        if (i0 >= i_end) {
            t = (u + 1u) * pc.npad_q + i_first;
            continue;
        }
        const uint qz = qz0 + u, head = kv_head * pc.group + u;
        const uint tex0 = qz * pc.npad_q + i0;
        const uint mbase = batch * pc.m_bs + head * pc.m_hs, abase = batch * pc.a_bs + head * pc.m_hs;
        const float slope = (FEATURES & SCORE_ALIBI) != 0u ? head_values[head].x : 0.0;

        // load_step
        LOAD_ROWS(q_tex, q_sh, tex0, ROWS, d4, pc.d, D_PAD, QS)
        LOAD_ROWS(do_tex, do_sh, tex0, ROWS, dv4, pc.dv, DV_PAD, VS)
        for (uint r = me; r < ROWS; r += WG) st_sh[r] = texelFetch(stats, int(tex0 + r)).xy;
        barrier();

        // products: Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ for the subgroup's keys
        [[unroll]] for (uint ct = 0; ct < ROWS / N; ++ct) {
            MAT_C s = MAT_C(0.0), dp = MAT_C(0.0);
            [[unroll]] for (uint kt = 0; kt < D_PAD / K; ++kt) {
                MAT_A a;
                MAT_B b;
                coopMatLoad(a, k_sh, sg * M * QS + kt * K, QS, gl_CooperativeMatrixLayoutRowMajor);
                coopMatLoad(b, q_sh, ct * N * QS + kt * K, QS, gl_CooperativeMatrixLayoutColumnMajor);
                s = coopMatMulAdd(a, b, s);
            }
            [[unroll]] for (uint kt = 0; kt < DV_PAD / K; ++kt) {
                MAT_A a;
                MAT_B b;
                coopMatLoad(a, v_sh, sg * M * VS + kt * K, VS, gl_CooperativeMatrixLayoutRowMajor);
                coopMatLoad(b, do_sh, ct * N * VS + kt * K, VS, gl_CooperativeMatrixLayoutColumnMajor);
                dp = coopMatMulAdd(a, b, dp);
            }
            coopMatStore(s, s_sh, sg * M * SS + ct * N, SS, gl_CooperativeMatrixLayoutRowMajor);
            coopMatStore(dp, dp_sh, sg * M * SS + ct * N, SS, gl_CooperativeMatrixLayoutRowMajor);
        }
        barrier();

        // elements: Pᵀ and scale·dSᵀ (times the softcap's slope) as float16
        for (uint x = me; x < KEYS * ROWS; x += WG) {
            const uint kx = x / ROWS, r = x % ROWS;
            const uint key = key0 + kx, row = i0 + r;
            const float s = s_sh[kx * SS + r] * pc.scale;
            const float cap = (FEATURES & SCORE_SOFTCAP) != 0u ? softcap_slope(s, sp) : 1.0;
            const uint mrow = min(row, pc.q_len - 1u);
            const uint mi = mrow * pc.m_rs + min(key, max(pc.kv_len, 1u) - 1u) * pc.m_cs, bit = mbase + mi;
            bool allowed = true;
            float add = 0.0;
            if (has_mask) allowed = ((mask_bits[bit >> 5] >> (bit & 31u)) & 1u) != 0u;
            if (has_add) add = additive[abase + mi];
            const int p = int(row) + pc.causal_offset;
            const float y = rule_score(s, int(key) - p, nearest_key_distance(p, pc.kv_len), FEATURES, MASKS, sp,
                                       slope, allowed, add);
            const bool ok = key < pc.kv_len && row < pc.q_len && y != neg_inf;
            const vec2 st = st_sh[r];
            const float pr = ok ? exp(y - st.x) : 0.0;
            const float ds = ok ? pr * (dp_sh[kx * SS + r] - st.y) * cap * pc.scale : 0.0;
            p_sh[kx * PS + r] = float16_t(pr);
            ds_sh[kx * PS + r] = float16_t(ds);
        }
        barrier();

        // accumulate: dV += Pᵀ·dO, dK += (scale·dSᵀ)·Q
        [[unroll]] for (uint kt = 0; kt < ROWS / K; ++kt) {
            MAT_A pa, da;
            coopMatLoad(pa, p_sh, sg * M * PS + kt * K, PS, gl_CooperativeMatrixLayoutRowMajor);
            coopMatLoad(da, ds_sh, sg * M * PS + kt * K, PS, gl_CooperativeMatrixLayoutRowMajor);
            [[unroll]] for (uint vt = 0; vt < VT; ++vt) {
                MAT_B b;
                coopMatLoad(b, do_sh, kt * K * VS + vt * N, VS, gl_CooperativeMatrixLayoutRowMajor);
                dv[vt] = coopMatMulAdd(pa, b, dv[vt]);
            }
            [[unroll]] for (uint dt = 0; dt < DT; ++dt) {
                MAT_B b;
                coopMatLoad(b, q_sh, kt * K * QS + dt * N, QS, gl_CooperativeMatrixLayoutRowMajor);
                dk[dt] = coopMatMulAdd(da, b, dk[dt]);
            }
        }
        barrier();
        t += ROWS;
    }

    // dk and dv of the subgroup's keys, through its staging tile
    bool nonfinite = false;
    [[unroll]] for (uint dt = 0; dt < DT; ++dt) {
        coopMatStore(dk[dt], stage, sg * M * NS, NS, gl_CooperativeMatrixLayoutRowMajor);
        subgroupMemoryBarrierShared();
        for (uint x = lane; x < M * N; x += LANES) {
            const uint key = kfirst + x / N, col = dt * N + x % N;
            const float val = stage[(sg * M + x / N) * NS + x % N];
            if (flagged || key >= pc.kv_len || col >= pc.d) continue;
            nonfinite = nonfinite || isnan(val) || isinf(val);
            dk_out[(kvz * pc.kv_len + key) * pc.d + col] = val;
        }
        subgroupMemoryBarrierShared();
    }
    [[unroll]] for (uint vt = 0; vt < VT; ++vt) {
        coopMatStore(dv[vt], stage, sg * M * NS, NS, gl_CooperativeMatrixLayoutRowMajor);
        subgroupMemoryBarrierShared();
        for (uint x = lane; x < M * N; x += LANES) {
            const uint key = kfirst + x / N, col = vt * N + x % N;
            const float val = stage[(sg * M + x / N) * NS + x % N];
            if (flagged || key >= pc.kv_len || col >= pc.dv) continue;
            nonfinite = nonfinite || isnan(val) || isinf(val);
            dv_out[(kvz * pc.kv_len + key) * pc.dv + col] = val;
        }
        subgroupMemoryBarrierShared();
    }
    if (nonfinite) atomicOr(verdict[0], BWD_FLAG_NONFINITE_GRADIENT);
}
