#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : enable
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_shader_16bit_storage : require
// Fused attention, cooperative-matrix family: softmax(Q·Kᵀ·scale + rules)·V with both products on
// the device's matrix units (VK_KHR_cooperative_matrix: NVIDIA tensor cores, AMD WMMA, Intel XMX,
// emulated by lavapipe), float16 operands and float32 accumulators, as FlashAttention-2 computes in
// fp16. The contract (push block, constants, bindings, the row packing and both routes) is
// contract/coop.h; the host side src/kernels/flash_coop_plan.cpp (tiles) and flash_coop.cpp (recording).
//
// A workgroup holds W subgroups; subgroup w owns ROW_TILES·M consecutive rows of its group (the G
// query heads of one K/V head × L query rows: GQA packed into M), whose queries stay in registers
// as A matrices for the whole key loop. K and V stream through shared memory BC keys at a time.
// Per tile (main's loop, one named step each):
//   load_tile      K and V rows -> shared float16 (zero beyond the keys and the widths), barrier 1
//   score_tile     S = Q·Kᵀ: coopMatMulAdd over d in steps of k, each M×N accumulator stored to the
//                  subgroup's float32 scratch (the accumulators' element order is the driver's)
//   softmax_tile   lanes own rows: scale, the score rules (score_rules.glsl), the row maximum and
//                  sum across the row's lanes (subgroupShuffleXor), P = exp(S − m) as float16 for
//                  the next product (and float32 for the careful path), the rescale factor α of
//                  each row broadcast to an M×N float32 tile
//   accumulate     O = O ∘ α (component-wise, α loaded as an accumulator) + P·V (coopMatMulAdd);
//                  barrier 2 before the next tile overwrites K and V
// The rows' statistics (m, l) and α are float32 in registers; the output accumulators O are
// M×N float32 matrices, written once at the end through the scratch tile (O / l, or the partial
// state). P rounded to float16 is what FlashAttention's fp16 kernels multiply too; l sums the
// float32 P.
//
// NaN and Inf in V (values.glsl): a masked key must add nothing, not 0·Inf, and an underflowed
// weight must keep V's infinities; the matrix units cannot skip a product, so a tile whose V holds
// a NaN or Inf (found while loading it) and every later tile of the workgroup (O may then hold
// infinities, which a rescale by an underflowed α must keep) take the careful path: each M×N tile
// of O goes through the scratch tile, rescaled and accumulated per element with values.glsl's
// rules in float32.
//
// Causal and the window skip every K/V tile outside what the block's rows may see (visible_keys).
// Key chunks (fused route, CPU devices' loop limit): the state (m, l) and the unnormalised O are
// handed from one dispatch to the next through `state` and the output, as flash.comp does.
#include "contract/coop.h"
#include "contract/score.h"
#include "values.glsl"
#define QKV_SCORE_PARAMS_BINDING COOP_BINDING_PARAMS
#include "score_rules.glsl"

layout(local_size_x_id = COOP_SPEC_WG, local_size_y = 1, local_size_z = 1) in;
layout(constant_id = COOP_SPEC_LANES) const uint T = 32;     // lanes per subgroup
layout(constant_id = COOP_SPEC_M) const uint M = 16;         // matrix rows (query rows)
layout(constant_id = COOP_SPEC_N) const uint N = 16;         // matrix columns (keys; output columns)
layout(constant_id = COOP_SPEC_K) const uint K = 16;         // the products' inner step (d; keys)
layout(constant_id = COOP_SPEC_ROW_TILES) const uint MT = 1;  // M-tiles of rows per subgroup
layout(constant_id = COOP_SPEC_BC) const uint BC = 32;       // keys per K/V tile
layout(constant_id = COOP_SPEC_D_PAD) const uint D_PAD = 64;    // E rounded up (multiple of K and 8)
layout(constant_id = COOP_SPEC_DV_PAD) const uint DV_PAD = 64;  // Ev rounded up (multiple of N and 8)
layout(constant_id = COOP_SPEC_VEC4) const uint VEC4 = 0;       // 1: f16vec4 loads of Q, K, V
layout(constant_id = COOP_SPEC_FEATURES) const uint FEATURES = 0;  // contract/score.h's SCORE_* bits
layout(constant_id = COOP_SPEC_SPLIT) const uint SPLIT = 0;       // 1: split-K decode partials
layout(constant_id = COOP_SPEC_CAREFUL) const uint CAREFUL = 1;   // contract/coop.h's COOP_CAREFUL_*

layout(std430, binding = COOP_BINDING_Q) readonly buffer Q { float16_t q_in[]; };
layout(std430, binding = COOP_BINDING_Q) readonly buffer Q4 { f16vec4 q4_in[]; };
layout(std430, binding = COOP_BINDING_K) readonly buffer Kb { float16_t k_in[]; };
layout(std430, binding = COOP_BINDING_K) readonly buffer K4 { f16vec4 k4_in[]; };
layout(std430, binding = COOP_BINDING_V) readonly buffer Vb { float16_t v_in[]; };
layout(std430, binding = COOP_BINDING_V) readonly buffer V4 { f16vec4 v4_in[]; };
layout(std430, binding = COOP_BINDING_MASK) readonly buffer MaskBits { uint mask_bits[]; };
layout(std430, binding = COOP_BINDING_ADDITIVE) readonly buffer Additive { float additive[]; };
layout(std430, binding = COOP_BINDING_OUT) buffer O { float o_out[]; };
layout(std430, binding = COOP_BINDING_STATE) buffer State { float state[]; };  // (m, l) per (batch, head, row)
layout(std430, binding = COOP_BINDING_LSE) writeonly buffer Lse { float lse_out[]; };
layout(std430, binding = COOP_BINDING_STATS) writeonly buffer Stats { vec2 stats[]; };
layout(std430, binding = COOP_BINDING_ACC) writeonly buffer Acc { float acc_out[]; };

layout(push_constant) uniform Push { coop_push pc; };

#define MAT_A coopmat<float16_t, gl_ScopeSubgroup, M, K, gl_MatrixUseA>
#define MAT_B coopmat<float16_t, gl_ScopeSubgroup, K, N, gl_MatrixUseB>
#define MAT_C coopmat<float, gl_ScopeSubgroup, M, N, gl_MatrixUseAccumulator>

const uint WG = gl_WorkGroupSize.x;
const uint W = WG / T;          // subgroups
const uint RS = MT * M;         // rows per subgroup
const uint BR = W * RS;         // rows per workgroup
const uint KS = D_PAD + COOP_PAD_HALVES;   // row strides of the shared tiles (elements)
const uint VS = DV_PAD + COOP_PAD_HALVES;
const uint SS = BC + COOP_PAD_FLOATS;
const uint PS = BC + COOP_PAD_HALVES;
const uint NS = N + COOP_PAD_FLOATS;
const uint DT = D_PAD / K;      // inner steps of Q·Kᵀ
const uint CT = BC / N;         // score tiles per M-tile
const uint KT = BC / K;         // inner steps of P·V
const uint VT = DV_PAD / N;     // output tiles per M-tile
// The softmax step's lanes: LPR lanes share a row (T >= RS), or a lane owns RPL rows (RS > T).
const uint LPR = T >= RS ? T / RS : 1;
const uint RPL = RS > T ? RS / T : 1;
const uint CPL = BC / LPR;      // a lane's columns of a score row
const uint NPL = N / LPR;       // a lane's columns of an M×N tile row
const uint D4 = D_PAD / 4, DV4 = DV_PAD / 4;
const uint QROUNDS = (BR + BC - 1) / BC;  // Q is staged through the K tile, BC rows at a time

shared float16_t k_sh[BC * KS];
shared float16_t v_sh[BC * VS];
shared float s_sh[W * RS * SS];    // scores, then the float32 weights (careful path)
shared float16_t p_sh[W * RS * PS];  // the weights as float16, the A operand of P·V
shared float mn_sh[W * RS * NS];   // α broadcast per row; the staging of O's tiles
shared bool v_nonfinite[2];        // per tile parity: the V tile holds a NaN or Inf

#define neg_inf uintBitsToFloat(0xff800000u)
#define pos_inf uintBitsToFloat(0x7f800000u)
#define nan_value uintBitsToFloat(0x7fc00000u)

// This invocation's place.
uint z, batch, kv_head, heads, group, kv_heads, rows_total, row0, sg, lane, t, d, dv, chunk_index;
bool causal, has_mask, has_add;
score_params sp;
// O may hold a NaN or Inf once a careful tile ran (or a resumed chunk brought one): from then on
// every tile is careful. Uniform in the subgroup, as the careful path's barriers need.
bool dirty = false;
// The queries (qm) and the accumulators (o) are main()'s, passed to each step by reference: held in
// function scope, not at module scope.
struct queries { MAT_A m[MT * DT]; };
struct accumulators { MAT_C m[MT * VT]; };
#define QM_ARRAY queries qm
#define O_ARRAY accumulators o
float m_run[RPL], l_run[RPL], alpha[RPL];

// The group's row r: its query head and query row.
uint head_of(uint r) { return kv_head * group + r / pc.q_len; }
uint qrow_of(uint r) { return r % pc.q_len; }
// Row i of the rows this lane owns in the softmax step (0 .. RS - 1 within its subgroup).
uint owned_row(uint i) { return (lane / LPR) * RPL + i; }
// The group's row of a subgroup row.
uint group_row(uint rl) { return row0 + sg * RS + rl; }

// Whether any lane of the subgroup has `x` (a butterfly over all lanes: needs shuffles only).
bool subgroup_any(bool x) {
    uint v = x ? 1u : 0u;
    [[unroll]] for (uint s = T / 2; s > 0; s /= 2) v |= subgroupShuffleXor(v, s);
    return v != 0u;
}

// 4 float16 values at element `at` + c of a Q, K or V row, the first `width - c` of them (0 beyond).
#define LOAD4(NAME, BUF, BUF4)                                                    \
    vec4 NAME(uint at, uint c, uint width) {                                      \
        if (VEC4 != 0) return c < width ? vec4(BUF4[(at + c) >> 2]) : vec4(0.0); \
        vec4 v = vec4(0.0);                                                       \
        [[unroll]] for (uint e = 0; e < 4; ++e)                                   \
            if (c + e < width) v[e] = float(BUF[at + c + e]);                     \
        return v;                                                                 \
    }
LOAD4(load_q4, q_in, q4_in)
LOAD4(load_k4, k_in, k4_in)
LOAD4(load_v4, v_in, v4_in)

void store4_half(uint at, vec4 v, bool to_k) {
    [[unroll]] for (uint e = 0; e < 4; ++e) {
        if (to_k)
            k_sh[at + e] = float16_t(v[e]);
        else
            v_sh[at + e] = float16_t(v[e]);
    }
}

void locate() {
    t = gl_LocalInvocationID.x;
    sg = gl_SubgroupID;
    lane = gl_SubgroupInvocationID;
    d = pc.dims & 0xffffu;
    dv = pc.dims >> 16;
    heads = pc.heads_group & 0xffffu;
    group = pc.heads_group >> 16;
    kv_heads = heads / group;
    rows_total = group * pc.q_len;
    z = gl_WorkGroupID.z + pc.group_z;
    batch = z / kv_heads;
    kv_head = z % kv_heads;
    row0 = (gl_WorkGroupID.x + pc.group_x) * BR;
    chunk_index = gl_WorkGroupID.y + pc.group_y;
    causal = (pc.flags & MASK_FLAG_CAUSAL) != 0u;
    has_mask = (pc.flags & MASK_FLAG_BOOLEAN) != 0u;
    has_add = (pc.flags & MASK_FLAG_ADDITIVE) != 0u;
    sp = no_score_params();
    if (FEATURES != 0u) sp = score_in;
}

// The queries of the workgroup's rows as A matrices (unscaled float16, zero beyond the rows and
// E), staged through the K tile BC rows at a time; the running statistics and accumulators, from
// the previous key chunk's state when resuming.
void load_queries_and_state(inout QM_ARRAY, inout O_ARRAY) {
    [[unroll]] for (uint round = 0; round < QROUNDS; ++round) {
        [[unroll]] for (uint k = 0; k < (BC * D4 + WG - 1) / WG; ++k) {
            const uint idx = t + k * WG;
            if (idx < BC * D4) {
                const uint j = idx / D4, c4 = idx % D4, r = row0 + round * BC + j;
                vec4 v = vec4(0.0);
                if (round * BC + j < BR && r < rows_total)
                    v = load_q4(pc.q_off + batch * pc.q_bs + head_of(r) * pc.q_hs + qrow_of(r) * pc.q_rs, 4 * c4, d);
                store4_half(j * KS + 4 * c4, v, true);
            }
        }
        barrier();
        [[unroll]] for (uint mt = 0; mt < MT; ++mt) {
            const uint first = sg * RS + mt * M;  // the M-tile's first row in the workgroup
            if (first >= round * BC && first < round * BC + BC) {
                [[unroll]] for (uint dt = 0; dt < DT; ++dt)
                    coopMatLoad(qm.m[mt * DT + dt], k_sh, (first - round * BC) * KS + dt * K, KS,
                                gl_CooperativeMatrixLayoutRowMajor);
            }
        }
        barrier();  // the K tile is overwritten next
    }
    const bool resume = SPLIT == 0u && (pc.flags & FLASH_RESUME) != 0u;
    [[unroll]] for (uint i = 0; i < RPL; ++i) {
        m_run[i] = neg_inf;
        l_run[i] = 0.0;
        const uint r = group_row(owned_row(i));
        if (resume && r < rows_total) {  // NaN as the maximum marks a poisoned row: +inf here
            const uint at = 2 * (z * rows_total + r);
            m_run[i] = isnan(state[at]) ? pos_inf : state[at];
            l_run[i] = state[at + 1];
        }
    }
    [[unroll]] for (uint k = 0; k < MT * VT; ++k) o.m[k] = MAT_C(0.0);
    if (resume) {  // the unnormalised accumulator of the previous chunks, through the staging tile
        bool nonfinite = false;
        [[unroll]] for (uint mt = 0; mt < MT; ++mt) {
            [[unroll]] for (uint vt = 0; vt < VT; ++vt) {
                [[unroll]] for (uint i = 0; i < RPL; ++i) {
                    const uint rl = owned_row(i), r = group_row(rl);
                    if (rl / M != mt) continue;
                    [[unroll]] for (uint c = 0; c < NPL; ++c) {
                        const uint col = vt * N + lane % LPR + c * LPR;
                        float v = 0.0;
                        if (r < rows_total && col < dv)
                            v = o_out[batch * heads * pc.q_len * dv + head_of(r) * pc.o_hs + qrow_of(r) * pc.o_rs + col];
                        nonfinite = nonfinite || isnan(v) || isinf(v);
                        mn_sh[(sg * RS + rl) * NS + lane % LPR + c * LPR] = v;
                    }
                }
                subgroupMemoryBarrierShared();
                subgroupBarrier();
                coopMatLoad(o.m[mt * VT + vt], mn_sh, (sg * RS + mt * M) * NS, NS, gl_CooperativeMatrixLayoutRowMajor);
                subgroupBarrier();
            }
        }
        if (CAREFUL != 0u) dirty = subgroup_any(nonfinite);
    }
    if (t == 0) {
        v_nonfinite[0] = false;
        v_nonfinite[1] = false;
    }
    barrier();
}

// K and V rows j0 .. j0 + bc - 1 into shared memory as float16, zero beyond them and beyond the
// widths. Returns whether the V tile holds a NaN or Inf.
bool load_tile(uint j0, uint bc, uint parity) {
    const uint k_base = pc.k_off + batch * pc.k_bs + kv_head * pc.k_hs;
    const uint v_base = pc.v_off + batch * pc.v_bs + kv_head * pc.v_hs;
    [[unroll]] for (uint k = 0; k < (BC * D4 + WG - 1) / WG; ++k) {
        const uint idx = t + k * WG;
        if (idx < BC * D4) {
            const uint j = idx / D4, c4 = idx % D4;
            store4_half(j * KS + 4 * c4, j < bc ? load_k4(k_base + (j0 + j) * pc.k_rs, 4 * c4, d) : vec4(0.0), true);
        }
    }
    bool nonfinite = false;
    [[unroll]] for (uint k = 0; k < (BC * DV4 + WG - 1) / WG; ++k) {
        const uint idx = t + k * WG;
        if (idx < BC * DV4) {
            const uint j = idx / DV4, c4 = idx % DV4;
            const vec4 v = j < bc ? load_v4(v_base + (j0 + j) * pc.v_rs, 4 * c4, dv) : vec4(0.0);
            if (CAREFUL != 0u) nonfinite = nonfinite || any(isnan(v)) || any(isinf(v));
            store4_half(j * VS + 4 * c4, v, false);
        }
    }
    if (nonfinite) v_nonfinite[parity] = true;
    barrier();  // #1: tiles loaded
    const bool careful = CAREFUL != COOP_CAREFUL_NONE && (v_nonfinite[parity] || CAREFUL == COOP_CAREFUL_EVERY_TILE);
    if (t == 0) v_nonfinite[parity ^ 1u] = false;  // last read before the previous barrier #2
    return careful;
}

// S = Q·Kᵀ of the subgroup's rows against the tile's keys, into its float32 scratch.
void score_tile(in QM_ARRAY) {
    [[unroll]] for (uint mt = 0; mt < MT; ++mt) {
        [[unroll]] for (uint ct = 0; ct < CT; ++ct) {
            MAT_C s = MAT_C(0.0);
            [[unroll]] for (uint dt = 0; dt < DT; ++dt) {
                MAT_B kt;  // element (e, n) = K[key ct·N + n][dt·K + e]: K's rows are Kᵀ's columns
                coopMatLoad(kt, k_sh, ct * N * KS + dt * K, KS, gl_CooperativeMatrixLayoutColumnMajor);
                s = coopMatMulAdd(qm.m[mt * DT + dt], kt, s);
            }
            coopMatStore(s, s_sh, (sg * RS + mt * M) * SS + ct * N, SS, gl_CooperativeMatrixLayoutRowMajor);
        }
    }
    subgroupMemoryBarrierShared();
    subgroupBarrier();
}

// The row reductions across the LPR lanes that share a row (a butterfly; nothing where LPR = 1).
float row_max(float x) {
    [[unroll]] for (uint s = LPR / 2; s > 0; s /= 2) x = max(x, subgroupShuffleXor(x, s));
    return x;
}
float row_sum(float x) {
    [[unroll]] for (uint s = LPR / 2; s > 0; s /= 2) x += subgroupShuffleXor(x, s);
    return x;
}

// The score rules and the online softmax of the subgroup's rows over keys j0 .. j0 + bc - 1.
void softmax_tile(uint j0, uint bc) {
    const uint masks = pc.flags & (MASK_FLAG_CAUSAL | MASK_FLAG_BOOLEAN | MASK_FLAG_ADDITIVE);
    [[unroll]] for (uint i = 0; i < RPL; ++i) {
        const uint rl = owned_row(i), r = group_row(rl);
        const bool valid = r < rows_total;
        const uint head = head_of(r), qi = qrow_of(r);
        const float slope = (FEATURES & SCORE_ALIBI) != 0u && valid ? head_values[head].x : 0.0;
        const uint m_base = batch * pc.m_bs + head * pc.m_hs + qi * pc.m_rs;
        const uint a_base = batch * pc.a_bs + head * pc.m_hs + qi * pc.m_rs;
        float sv[CPL];
        float mx = neg_inf;
        [[unroll]] for (uint c = 0; c < CPL; ++c) {
            const uint j = lane % LPR + c * LPR, key = j0 + j;
            float v = neg_inf;
            if (valid && j < bc) {
                bool allowed = true;
                float add = 0.0;
                if (has_mask) {
                    const uint bit = m_base + key * pc.m_cs;
                    allowed = ((mask_bits[bit >> 5] >> (bit & 31u)) & 1u) != 0u;
                }
                if (has_add) add = additive[a_base + key * pc.m_cs];
                const int p = int(qi) + pc.causal_offset;  // the row's position (reduced: contract/score.h)
                v = rule_score(s_sh[(sg * RS + rl) * SS + j] * pc.scale, int(key) - p,
                               nearest_key_distance(p, pc.kv_len), FEATURES, masks, sp, slope, allowed, add);
            }
            sv[c] = v;
            mx = max(mx, (isnan(v) || v == pos_inf) ? pos_inf : v);
        }
        mx = row_max(mx);
        const float m_old = m_run[i], m_new = max(m_old, mx);
        const bool live = m_new != neg_inf && m_new != pos_inf;  // something allowed, not poisoned
        alpha[i] = live ? exp(m_old - m_new) : 1.0;
        m_run[i] = m_new;
        float sum = 0.0;
        [[unroll]] for (uint c = 0; c < CPL; ++c) {
            const uint j = lane % LPR + c * LPR;
            const float p = (live && sv[c] != neg_inf) ? exp(sv[c] - m_new) : MASKED_WEIGHT;
            s_sh[(sg * RS + rl) * SS + j] = p;
            p_sh[(sg * RS + rl) * PS + j] = float16_t(p);
            sum += p;
        }
        l_run[i] = l_run[i] * alpha[i] + row_sum(sum);
        [[unroll]] for (uint c = 0; c < NPL; ++c) mn_sh[(sg * RS + rl) * NS + lane % LPR + c * LPR] = alpha[i];
    }
    subgroupMemoryBarrierShared();
    subgroupBarrier();
}

// O = O ∘ α per element through the staging tile (COOP_CAREFUL_STAGED_RESCALE: fault finding).
void rescale_through_staging(uint mt, inout O_ARRAY) {
    [[unroll]] for (uint vt = 0; vt < VT; ++vt) {
        coopMatStore(o.m[mt * VT + vt], mn_sh, (sg * RS + mt * M) * NS, NS, gl_CooperativeMatrixLayoutRowMajor);
        subgroupMemoryBarrierShared();
        subgroupBarrier();
        [[unroll]] for (uint i = 0; i < RPL; ++i) {
            const uint rl = owned_row(i);
            if (rl / M != mt) continue;
            [[unroll]] for (uint c = 0; c < NPL; ++c) mn_sh[(sg * RS + rl) * NS + lane % LPR + c * LPR] *= alpha[i];
        }
        subgroupMemoryBarrierShared();
        subgroupBarrier();
        coopMatLoad(o.m[mt * VT + vt], mn_sh, (sg * RS + mt * M) * NS, NS, gl_CooperativeMatrixLayoutRowMajor);
        subgroupBarrier();
    }
}

// O = O ∘ α + P·V on the matrix units (every value of V finite, O finite).
void accumulate_tile(inout O_ARRAY) {
    [[unroll]] for (uint mt = 0; mt < MT; ++mt) {
        if (CAREFUL == COOP_CAREFUL_STAGED_RESCALE) {
            rescale_through_staging(mt, o);
        } else {
            MAT_C a;
            coopMatLoad(a, mn_sh, (sg * RS + mt * M) * NS, NS, gl_CooperativeMatrixLayoutRowMajor);
            [[unroll]] for (uint vt = 0; vt < VT; ++vt) o.m[mt * VT + vt] = o.m[mt * VT + vt] * a;
        }
        [[unroll]] for (uint kt = 0; kt < KT; ++kt) {
            MAT_A p;
            coopMatLoad(p, p_sh, (sg * RS + mt * M) * PS + kt * K, PS, gl_CooperativeMatrixLayoutRowMajor);
            [[unroll]] for (uint vt = 0; vt < VT; ++vt) {
                MAT_B v;
                coopMatLoad(v, v_sh, kt * K * VS + vt * N, VS, gl_CooperativeMatrixLayoutRowMajor);
                o.m[mt * VT + vt] = coopMatMulAdd(p, v, o.m[mt * VT + vt]);
            }
        }
    }
    subgroupBarrier();  // mn_sh is read: the next tile's softmax writes it
}

// The same per element in float32 with values.glsl's rules, each M×N tile of O through the
// staging tile: α that underflowed keeps O's infinities, a masked key adds nothing, an allowed
// key whose weight underflowed keeps V's infinities.
void accumulate_tile_carefully(inout O_ARRAY) {
    [[unroll]] for (uint mt = 0; mt < MT; ++mt) {
        [[unroll]] for (uint vt = 0; vt < VT; ++vt) {
            coopMatStore(o.m[mt * VT + vt], mn_sh, (sg * RS + mt * M) * NS, NS, gl_CooperativeMatrixLayoutRowMajor);
            subgroupMemoryBarrierShared();
            subgroupBarrier();
            [[unroll]] for (uint i = 0; i < RPL; ++i) {
                const uint rl = owned_row(i);
                if (rl / M != mt) continue;
                [[unroll]] for (uint c = 0; c < NPL; ++c) {
                    const uint col = lane % LPR + c * LPR, at = (sg * RS + rl) * NS + col;
                    float acc = rescaled(vec4(mn_sh[at]), alpha[i]).x;
                    // Every key of the tile (beyond bc: a masked weight and a zero row, adding nothing),
                    // so that the loop unrolls and adds nothing to lavapipe's loop count.
                    [[unroll]] for (uint j = 0; j < BC; ++j)
                        acc += weighted(s_sh[(sg * RS + rl) * SS + j], vec4(float(v_sh[j * VS + vt * N + col]))).x;
                    mn_sh[at] = acc;
                }
            }
            subgroupMemoryBarrierShared();
            subgroupBarrier();
            coopMatLoad(o.m[mt * VT + vt], mn_sh, (sg * RS + mt * M) * NS, NS, gl_CooperativeMatrixLayoutRowMajor);
            subgroupBarrier();
        }
    }
}

// ALiBi's part left out of row r's scores (score_rules.glsl: alibi_drop): the fused route's lse
// is lower by it and its sink higher; the split route's merge applies it as the decode's does.
float row_drop(uint r) {
    if ((FEATURES & SCORE_ALIBI) == 0u) return 0.0;
    return alibi_drop(int(qrow_of(r)) + pc.causal_offset, pc.kv_len, FEATURES, sp, head_values[head_of(r)].x);
}

// The results: fused, the output (O / l, or O as it is where more chunks follow), the state
// and the lse; split, each row's partial (m, l) and accumulator for the merge.
void write_results(in O_ARRAY) {
    const bool partial = SPLIT == 0u && (pc.flags & FLASH_PARTIAL) != 0u;
    const uint chunks = SPLIT != 0u ? max(1u, (pc.kv_stop - pc.kv_begin + pc.chunk - 1u) / pc.chunk) : 1u;
    const uint dv_stride = 4u * ((dv + 3u) / 4u);
    [[unroll]] for (uint i = 0; i < RPL; ++i) {
        const uint r = group_row(owned_row(i));
        if (r >= rows_total || lane % LPR != 0u) continue;
        const bool poisoned = m_run[i] == pos_inf;
        if (SPLIT != 0u) {
            stats[(z * rows_total + r) * chunks + chunk_index] = poisoned ? vec2(pos_inf, nan_value) : vec2(m_run[i], l_run[i]);
        } else {
            const uint at = z * rows_total + r;  // = (batch·Hq + head)·L + i
            if (partial || (pc.flags & FLASH_STATS) != 0u) {
                state[2 * at] = poisoned ? nan_value : m_run[i];
                state[2 * at + 1] = l_run[i];
            }
            if ((FEATURES & SCORE_LSE) != 0u && !partial) lse_out[at] = row_lse(m_run[i], l_run[i], poisoned, row_drop(r));
        }
    }
    [[unroll]] for (uint mt = 0; mt < MT; ++mt) {
        [[unroll]] for (uint vt = 0; vt < VT; ++vt) {
            coopMatStore(o.m[mt * VT + vt], mn_sh, (sg * RS + mt * M) * NS, NS, gl_CooperativeMatrixLayoutRowMajor);
            subgroupMemoryBarrierShared();
            subgroupBarrier();
            [[unroll]] for (uint i = 0; i < RPL; ++i) {
                const uint rl = owned_row(i), r = group_row(rl);
                if (rl / M != mt || r >= rows_total) continue;
                const bool poisoned = m_run[i] == pos_inf;
                const float sink =
                    (FEATURES & SCORE_SINKS) != 0u ? head_values[head_of(r)].y + (SPLIT != 0u ? 0.0 : row_drop(r)) : neg_inf;
                [[unroll]] for (uint c = 0; c < NPL; ++c) {
                    const uint col = vt * N + lane % LPR + c * LPR;
                    if (col >= dv) continue;
                    const float acc = mn_sh[(sg * RS + rl) * NS + lane % LPR + c * LPR];
                    if (SPLIT != 0u) {
                        acc_out[((z * rows_total + r) * chunks + chunk_index) * dv_stride + col] = acc;
                    } else {
                        const float v = partial ? acc
                                        : poisoned ? nan_value
                                                   : normalised(vec4(acc), m_run[i], l_run[i], FEATURES, sink).x;
                        o_out[batch * heads * pc.q_len * dv + head_of(r) * pc.o_hs + qrow_of(r) * pc.o_rs + col] = v;
                    }
                }
            }
            subgroupBarrier();  // the staging tile is overwritten next
        }
    }
}

void main() {
    locate();
    QM_ARRAY;
    O_ARRAY;
    load_queries_and_state(qm, o);
    // The keys of this dispatch (split: of this chunk), and of those the ones the block's rows may
    // see by causal and the window: tiles outside are never loaded or computed.
    uint lo = pc.kv_begin, hi = min(pc.kv_stop, pc.kv_len);
    if (SPLIT != 0u) {
        lo = min(hi, pc.kv_begin + chunk_index * pc.chunk);
        hi = min(hi, lo + pc.chunk);
    }
    const uint r_first = row0, r_last = min(row0 + BR, rows_total) - 1u;
    const bool one_head = r_first / pc.q_len == r_last / pc.q_len;
    const int q_first = one_head ? int(qrow_of(r_first)) : 0;
    const int q_last = one_head ? int(qrow_of(r_last)) : int(pc.q_len) - 1;
    const uvec2 keys =
        visible_keys(q_first + pc.causal_offset, q_last + pc.causal_offset, FEATURES, causal, sp, lo, hi);
    uint parity = 0;
    for (uint j0 = keys.x; j0 < keys.y; j0 += BC, parity ^= 1u) {
        const uint bc = min(BC, keys.y - j0);
        const bool careful = load_tile(j0, bc, parity);
        score_tile(qm);
        softmax_tile(j0, bc);
        if (CAREFUL != 0u && (careful || dirty)) {
            accumulate_tile_carefully(o);
            dirty = true;
        } else {
            accumulate_tile(o);
        }
        barrier();  // #2: every read of this tile's K and V is done
    }
    write_results(o);
}
