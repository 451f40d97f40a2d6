#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : enable
// Fused attention, GPU family (flash attention): softmax(Q·Kᵀ·scale + mask)·V for a block of BR
// query rows of one (batch, query head), streaming K and V through shared memory BC rows at a
// time with an online softmax. Nothing of size L x S is ever written: memory stays O(B·H·(L+S)·d).
// Tensors are addressed by element strides (contract/flash.h), so one kernel serves the
// self-attention path (projected Q|K|V rows, heads side by side) and scaled_dot_product_attention
// ((B, H, L, E) tensors, L != S, grouped-query heads, broadcast masks, both causal alignments).
//
// Work partitioning (FlashAttention-2 style): the WG invocations form RG = WG / T row teams of T
// lanes; team g owns RPG = BR / RG query rows for the whole key loop, so the softmax of a row
// never leaves its team. Per K/V tile (main's loop, one named step each):
//   load_tile       K and V tiles -> shared memory (vec4, fp32), barrier #1
//   score_tile      lane l takes keys l, l+T, ...: S[r][j] = q_r·k_j (q pre-scaled; in registers
//                   when small enough, else broadcast from shared memory)
//   mask_tile       masked -> -inf; each lane's maximum per row
//   reduce_max      row maxima by team reductions: subgroupMax when the team is exactly one full
//                   subgroup (checked at run time: gl_SubgroupSize == T, full subgroups), else
//                   through shared memory (one barrier). m and l stay in registers.
//   probabilities   P = exp(S - m) into the team's slice of shared memory, the rescale factors
//   reduce_sum      row sums (subgroupAdd or shared memory), l = l·alpha + sum
//   accumulate      lane takes (row, 4 output columns) pairs: O = O·alpha + Σ_j P[r][j]·v_j;
//                   barrier #2 before the next tile overwrites K/V.
// Statistics and accumulators are float32 (fp16 storage is converted on load). The output is
// written once, O / l: 0 for a row with nothing to attend to, NaN for a row with a NaN or +inf
// score (inside the kernel a poisoned row's maximum is +inf). A masked entry contributes
// nothing, not even 0·NaN: a tile whose V holds a NaN or Inf takes a loop that skips p == 0.
// With a causal mask the key loop stops at the block's last visible key: tiles above the
// diagonal are never loaded or computed.
//
// Dropout (SCORE_DROPOUT, dropout.glsl): a weight is kept, scaled by 1 / (1 - p), or dropped after
// the row's statistics have seen it.
//
// Key chunks: a dispatch may cover only the keys [kv_begin, kv_stop). Then the running maximum
// and sum go to `state` (NaN maximum = poisoned row) and the unnormalised accumulator to the
// output (FLASH_PARTIAL, more chunks follow); the next dispatch resumes from them (FLASH_RESUME).
// The host splits long key ranges this way on CPU devices (llvmpipe ends every loop of a shader
// after 65,535 iterations in total, silently); see flash_chunk_keys in src/kernels/flash_tiles.cpp. With
// FLASH_STATS the last dispatch also stores each row's final (max, sum), from which
// flash_weights.comp forms the attention weights.
//
// Specialization constants (chosen per device by src/kernels/flash_tiles.cpp, choose_flash_tiles): see
// below. QKV_SUBGROUP (a compile-time define: the capability must not appear in a module a
// device cannot run) enables the subgroup reductions.
#include "precision.glsl"
#include "contract/flash.h"
#include "contract/score.h"
#include "values.glsl"
#define QKV_SCORE_PARAMS_BINDING FLASH_BINDING_PARAMS
#include "score_rules.glsl"
#include "contract/philox.h"
#include "dropout.glsl"
#ifdef QKV_SUBGROUP
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#endif
#ifdef QKV_FP16
#define QKV4_T f16vec4
#else
#define QKV4_T vec4
#endif

layout(local_size_x_id = FLASH_SPEC_WG, local_size_y = 1, local_size_z = 1) in;
layout(constant_id = FLASH_SPEC_BR) const uint BR = 16;      // query rows per workgroup
layout(constant_id = FLASH_SPEC_BC) const uint BC = 32;      // key/value rows per tile
layout(constant_id = FLASH_SPEC_D_MAX) const uint D_MAX = 64;   // >= head width of Q and K, a multiple of 4
layout(constant_id = FLASH_SPEC_DV_MAX) const uint DV_MAX = 64;  // >= head width of V, a multiple of 4 (see host)
layout(constant_id = FLASH_SPEC_TEAM) const uint T = 32;       // lanes per row team (the subgroup size aimed at)
layout(constant_id = FLASH_SPEC_Q_REGS) const uint Q_REGS = 0;   // 1: each lane keeps its team's query rows in registers
layout(constant_id = FLASH_SPEC_VEC4) const uint VEC4 = 0;     // 1: widths, strides and offsets are multiples of 4: vec4 loads
layout(constant_id = FLASH_SPEC_FALLBACK) const uint FALLBACK = 1; // 0: the pipeline requires subgroups of T lanes, all full
layout(constant_id = FLASH_SPEC_FEATURES) const uint FEATURES = 0;  // contract/score.h's SCORE_* rules of this call

layout(std430, binding = FLASH_BINDING_QKV) readonly buffer QKV { QKV_T qkv[]; };
layout(std430, binding = FLASH_BINDING_QKV) readonly buffer QKV4 { QKV4_T qkv4[]; };  // the same, 4 at a time
layout(std430, binding = FLASH_BINDING_MASK) readonly buffer MaskBits { uint mask_bits[]; };
layout(std430, binding = FLASH_BINDING_ADDITIVE) readonly buffer Additive { float additive[]; };
layout(std430, binding = FLASH_BINDING_OUT) buffer O { float o_out[]; };
layout(std430, binding = FLASH_BINDING_STATE) buffer State { float state[]; };  // (m, l) per (batch, head, row)
layout(std430, binding = FLASH_BINDING_LSE) writeonly buffer Lse { float lse_out[]; };  // per (batch, head, row)

layout(push_constant) uniform Push { flash_push pc; };

const uint WG = gl_WorkGroupSize.x;
const uint RG = WG / T;                 // row teams
const uint RPG = BR / RG;               // rows per team
const uint KPL = (BC + T - 1) / T;      // keys per lane in the scores
const uint D4 = D_MAX / 4, DV4 = DV_MAX / 4;
const uint KS = D4 + 1;                 // K tile row stride in vec4: odd, so lanes hit distinct banks
// Values: lane takes vec4 columns o_lane + m·O_LANES of its team's rows o_group + k·O_GROUPS.
// The host keeps T % O_LANES == 0 and DV4 % O_LANES == 0.
const uint O_LANES = DV4 < T ? DV4 : T;
const uint O_GROUPS = T / O_LANES;
const uint O_ROWS = (RPG + O_GROUPS - 1) / O_GROUPS;
const uint O_COLS = DV4 / O_LANES;
const uint LOAD_K = (BC * D4 + WG - 1) / WG, LOAD_V = (BC * DV4 + WG - 1) / WG;
const uint Q_SHARED = Q_REGS != 0 ? 1 : BR * D4;
const uint Q_REG = Q_REGS != 0 ? RPG * D4 : 1;

shared vec4 k_tile[BC * KS];
shared vec4 v_tile[BC * DV4];
shared vec4 q_tile[Q_SHARED];          // pre-scaled queries, when not in registers
shared float p_tile[BR * BC];          // probabilities, each team's rows written and read by it alone
shared float alpha_tile[BR];           // this tile's rescale factor per row
const uint RED = FALLBACK != 0 ? BR * T : 1;
shared float red_max[RED], red_sum[RED];  // team reductions without subgroup operations
shared bool v_nonfinite[2];            // per tile parity: the V tile holds a NaN or Inf

#define neg_inf uintBitsToFloat(0xff800000u)
#define pos_inf uintBitsToFloat(0x7f800000u)

// This invocation's place (set once by locate()).
uint row0, z, batch, head, t, team, lane, r_first, o_lane, o_group;
uint q_base, k_base, v_base, o_base, m_base, a_base, state_base;
bool sg, causal, has_mask, has_add;
score_params sp;      // the score rules' values (contract/score.h), where FEATURES uses them
float slope, sink;    // this head's ALiBi slope and sink logit
// Its registers: queries, running statistics, accumulators, this tile's scores and reductions.
vec4 q_reg[Q_REG];
float m_run[RPG], l_run[RPG];
vec4 o[O_ROWS * O_COLS];
float s[RPG * KPL];
float red[RPG];
float alpha[RPG];

// 4 consecutive elements of Q|K|V from element `at`, the first `width - c` of them (0 beyond).
vec4 load4(uint at, uint c, uint width) {
    if (VEC4 != 0) return c < width ? vec4(qkv4[(at + c) >> 2]) : vec4(0.0);
    vec4 v = vec4(0.0);
    [[unroll]] for (uint k = 0; k < 4; ++k)
        if (c + k < width) v[k] = float(qkv[at + c + k]);
    return v;
}

void locate() {
    row0 = (gl_WorkGroupID.x + pc.group_x) * BR;
    z = gl_WorkGroupID.z + pc.group_z;
    batch = z / pc.heads;
    head = z % pc.heads;
    const uint kv_head = head / pc.group;
    t = gl_LocalInvocationID.x;
    causal = (pc.flags & MASK_FLAG_CAUSAL) != 0u;
    has_mask = (pc.flags & MASK_FLAG_BOOLEAN) != 0u;
    has_add = (pc.flags & MASK_FLAG_ADDITIVE) != 0u;
    q_base = batch * pc.q_bs + head * pc.q_hs;
    k_base = pc.k_off + batch * pc.k_bs + kv_head * pc.k_hs;
    v_base = pc.v_off + batch * pc.v_bs + kv_head * pc.v_hs;
    o_base = batch * pc.heads * pc.q_len * pc.dv + head * pc.o_hs;
    m_base = batch * pc.m_bs + head * pc.m_hs;
    a_base = batch * pc.a_bs + head * pc.m_hs;
    state_base = z * pc.q_len;
    sp = no_score_params();
    slope = 0.0;
    sink = score_neg_inf();
    if (FEATURES != 0u) sp = score_in;
    if ((FEATURES & SCORE_ALIBI) != 0u) slope = head_values[head].x;
    if ((FEATURES & SCORE_SINKS) != 0u) sink = head_values[head].y;
    // The team is one subgroup when the device runs subgroups of exactly T lanes, all full; this
    // is uniform across the workgroup, so the barriers of the other branch stay uniform too.
#ifdef QKV_SUBGROUP
    sg = FALLBACK == 0 || (gl_SubgroupSize == T && gl_NumSubgroups * T == WG);
    team = sg ? gl_SubgroupID : t / T;
    lane = sg ? gl_SubgroupInvocationID : t % T;
#else
    sg = false;
    team = t / T;
    lane = t % T;
#endif
    r_first = team * RPG;  // the team's first row in the block
    o_lane = lane % O_LANES;
    o_group = lane / O_LANES;
}

// Queries (pre-scaled) into registers or shared memory; running statistics and accumulators,
// from the state of the previous key chunk when resuming.
void load_queries_and_state() {
    if (Q_REGS != 0) {
        [[unroll]] for (uint i = 0; i < RPG; ++i) {
            const uint row = row0 + r_first + i;
            [[unroll]] for (uint c4 = 0; c4 < D4; ++c4)
                q_reg[i * D4 + c4] = row < pc.q_len ? load4(q_base + row * pc.q_rs, 4 * c4, pc.d) * pc.scale : vec4(0.0);
        }
    } else {
        [[unroll]] for (uint k = 0; k < (BR * D4 + WG - 1) / WG; ++k) {
            const uint idx = t + k * WG;
            if (idx < BR * D4) {
                const uint r = idx / D4, c4 = idx % D4, row = row0 + r;
                q_tile[idx] = row < pc.q_len ? load4(q_base + row * pc.q_rs, 4 * c4, pc.d) * pc.scale : vec4(0.0);
            }
        }
    }
    const bool resume = (pc.flags & FLASH_RESUME) != 0u;
    [[unroll]] for (uint i = 0; i < RPG; ++i) {
        m_run[i] = neg_inf;
        l_run[i] = 0.0;
        const uint row = row0 + r_first + i;
        if (resume && row < pc.q_len) {  // NaN as the maximum marks a poisoned row: +inf here
            const float m = state[2 * (state_base + row)];
            m_run[i] = isnan(m) ? pos_inf : m;
            l_run[i] = state[2 * (state_base + row) + 1];
        }
    }
    [[unroll]] for (uint k = 0; k < O_ROWS * O_COLS; ++k) o[k] = vec4(0.0);
    if (resume) {
        [[unroll]] for (uint k = 0; k < O_ROWS; ++k) {
            const uint ri = o_group + k * O_GROUPS, row = row0 + r_first + ri;
            [[unroll]] for (uint m = 0; m < O_COLS; ++m) {
                const uint c = 4 * (o_lane + m * O_LANES);
                if (ri < RPG && row < pc.q_len) {
                    const uint at = o_base + row * pc.o_rs + c;
                    [[unroll]] for (uint e = 0; e < 4; ++e)
                        if (c + e < pc.dv) o[k * O_COLS + m][e] = o_out[at + e];
                }
            }
        }
    }
    if (t == 0) {
        v_nonfinite[0] = false;
        v_nonfinite[1] = false;
    }
    barrier();  // q_tile and the flags
}

// K (row stride KS) and V tiles of keys j0 .. j0 + bc - 1 into shared memory, zero beyond the
// tile's keys and the widths. Returns whether the V tile holds a NaN or Inf.
bool load_tile(uint j0, uint bc, uint parity) {
    bool nonfinite = false;
    [[unroll]] for (uint k = 0; k < LOAD_K; ++k) {
        const uint idx = t + k * WG;
        if (idx < BC * D4) {
            const uint j = idx / D4, c4 = idx % D4;
            k_tile[j * KS + c4] = j < bc ? load4(k_base + (j0 + j) * pc.k_rs, 4 * c4, pc.d) : vec4(0.0);
        }
    }
    [[unroll]] for (uint k = 0; k < LOAD_V; ++k) {
        const uint idx = t + k * WG;
        if (idx < BC * DV4) {
            const uint j = idx / DV4, c4 = idx % DV4;
            const vec4 v = j < bc ? load4(v_base + (j0 + j) * pc.v_rs, 4 * c4, pc.dv) : vec4(0.0);
            nonfinite = nonfinite || any(isnan(v)) || any(isinf(v));
            v_tile[idx] = v;
        }
    }
    if (nonfinite) v_nonfinite[parity] = true;
    barrier();  // #1: tiles loaded
    const bool careful = v_nonfinite[parity];
    if (t == 0) v_nonfinite[parity ^ 1u] = false;  // last read before the previous barrier #2
    return careful;
}

// s[i][n] = q_i · k_(lane + n·T) for the team's rows.
void score_tile() {
    [[unroll]] for (uint k = 0; k < RPG * KPL; ++k) s[k] = 0.0;
    [[unroll]] for (uint c4 = 0; c4 < D4; ++c4) {
        vec4 kv[KPL];
        [[unroll]] for (uint n = 0; n < KPL; ++n) kv[n] = k_tile[min(lane + n * T, BC - 1) * KS + c4];
        [[unroll]] for (uint i = 0; i < RPG; ++i) {
            vec4 q;
            if (Q_REGS != 0) q = q_reg[i * D4 + c4];
            else q = q_tile[(r_first + i) * D4 + c4];
            [[unroll]] for (uint n = 0; n < KPL; ++n) s[i * KPL + n] += dot(q, kv[n]);
        }
    }
}

// The score rules (score_rules.glsl: softcap, ALiBi, the additive mask; causal, the window, the bool
// mask): masked scores -> -inf; red[i] = this lane's maximum of row i (a NaN or +inf score counts
// as +inf: the row is poisoned).
void mask_tile(uint j0, uint bc) {
    const uint masks = pc.flags & (MASK_FLAG_CAUSAL | MASK_FLAG_BOOLEAN | MASK_FLAG_ADDITIVE);
    [[unroll]] for (uint i = 0; i < RPG; ++i) {
        const uint row = row0 + r_first + i;
        float mx = neg_inf;
        [[unroll]] for (uint n = 0; n < KPL; ++n) {
            const uint j = lane + n * T, key = j0 + j;
            float v = neg_inf;
            if (row < pc.q_len && j < bc) {
                const uint mi = row * pc.m_rs + key * pc.m_cs, bit = m_base + mi;
                bool allowed = true;
                float add = 0.0;
                if (has_mask) allowed = ((mask_bits[bit >> 5] >> (bit & 31u)) & 1u) != 0u;
                if (has_add) add = additive[a_base + mi];
                const int p = int(row) + pc.causal_offset;
                v = rule_score(s[i * KPL + n], int(key) - p, nearest_key_distance(p, pc.kv_len), FEATURES, masks, sp, slope,
                               allowed, add);
            }
            s[i * KPL + n] = v;
            mx = max(mx, (isnan(v) || v == pos_inf) ? pos_inf : v);
        }
        red[i] = mx;
    }
}

void reduce_max() {
#ifdef QKV_SUBGROUP
    if (sg) {
        [[unroll]] for (uint i = 0; i < RPG; ++i) red[i] = subgroupMax(red[i]);
        return;
    }
#endif
    [[unroll]] for (uint i = 0; i < RPG; ++i) red_max[(r_first + i) * T + lane] = red[i];
    barrier();
    [[unroll]] for (uint i = 0; i < RPG; ++i) {
        float mx = neg_inf;
        [[unroll]] for (uint u = 0; u < T; ++u) mx = max(mx, red_max[(r_first + i) * T + u]);
        red[i] = mx;
    }
}

// P = exp(S - m_new) into p_tile, the rescale factors alpha; red[i] = this lane's sum of row i.
// With dropout the sum sees every weight and p_tile the kept ones, scaled (a dropped one as a
// masked key: dropout.glsl).
void probabilities(uint j0) {
    [[unroll]] for (uint i = 0; i < RPG; ++i) {
        const float m_old = m_run[i], m_new = max(m_old, red[i]);
        const bool live = m_new != neg_inf && m_new != pos_inf;  // something allowed, not poisoned
        alpha[i] = live ? exp(m_old - m_new) : 1.0;
        m_run[i] = m_new;
        float sum = 0.0;
        [[unroll]] for (uint n = 0; n < KPL; ++n) {
            const float sv = s[i * KPL + n];
            const float p = (live && sv != neg_inf) ? exp(sv - m_new) : MASKED_WEIGHT;
            const uint j = lane + n * T;
            float kept = p;
            if ((FEATURES & SCORE_DROPOUT) != 0u)
                kept = dropout_keeps(state_base + row0 + r_first + i, j0 + j, sp) ? p * sp.dropout_scale : MASKED_WEIGHT;
            if (j < BC) p_tile[(r_first + i) * BC + j] = kept;
            sum += p;
        }
        red[i] = sum;
        if (lane == 0) alpha_tile[r_first + i] = alpha[i];
    }
}

void reduce_sum() {
#ifdef QKV_SUBGROUP
    if (sg) {
        [[unroll]] for (uint i = 0; i < RPG; ++i) red[i] = subgroupAdd(red[i]);
        subgroupMemoryBarrierShared();  // p_tile and alpha_tile: written and read by this subgroup
        subgroupBarrier();
    } else
#endif
    {
        [[unroll]] for (uint i = 0; i < RPG; ++i) red_sum[(r_first + i) * T + lane] = red[i];
        barrier();
        [[unroll]] for (uint i = 0; i < RPG; ++i) {
            float sum = 0.0;
            [[unroll]] for (uint u = 0; u < T; ++u) sum += red_sum[(r_first + i) * T + u];
            red[i] = sum;
        }
    }
    [[unroll]] for (uint i = 0; i < RPG; ++i) l_run[i] = l_run[i] * alpha[i] + red[i];
}

// O = O·alpha + P·V for this lane's (row, columns) pairs; then barrier #2.
void accumulate(bool careful, uint bc) {
    [[unroll]] for (uint k = 0; k < O_ROWS; ++k) {
        const float a = alpha_tile[r_first + min(o_group + k * O_GROUPS, RPG - 1)];
        // rescaled(): an earlier careful tile may have left an infinity that an underflowed alpha must keep
        [[unroll]] for (uint m = 0; m < O_COLS; ++m) o[k * O_COLS + m] = rescaled(o[k * O_COLS + m], a);
    }
    if (careful) {  // uniform; values.glsl: a masked key adds nothing, an underflowed weight keeps infinities
        for (uint j = 0; j < bc; ++j) {
            [[unroll]] for (uint k = 0; k < O_ROWS; ++k) {
                const float p = p_tile[(r_first + min(o_group + k * O_GROUPS, RPG - 1)) * BC + j];
                [[unroll]] for (uint m = 0; m < O_COLS; ++m)
                    o[k * O_COLS + m] += weighted(p, v_tile[j * DV4 + o_lane + m * O_LANES]);
            }
        }
    } else {  // keys beyond bc have p = 0 and a zero V row
        [[unroll]] for (uint j = 0; j < BC; ++j) {
            vec4 v[O_COLS];
            [[unroll]] for (uint m = 0; m < O_COLS; ++m) v[m] = v_tile[j * DV4 + o_lane + m * O_LANES];
            [[unroll]] for (uint k = 0; k < O_ROWS; ++k) {
                const float p = p_tile[(r_first + min(o_group + k * O_GROUPS, RPG - 1)) * BC + j];
                [[unroll]] for (uint m = 0; m < O_COLS; ++m) o[k * O_COLS + m] = fma(vec4(p), v[m], o[k * O_COLS + m]);
            }
        }
    }
    barrier();  // #2: every read of this tile's shared memory is done
}

// ALiBi's part left out of query row `row`'s scores (score_rules.glsl: alibi_drop).
float row_drop(uint row) { return alibi_drop(int(row) + pc.causal_offset, pc.kv_len, FEATURES, sp, slope); }

// Hand the state to the next chunk (or to the weights kernel), and write the output: the
// accumulator as it is when more chunks follow, else O / l (O / (l + e^(sink - m)) with a sink),
// and with SCORE_LSE each row's log-sum-exp.
void write_results() {
    const float nan = uintBitsToFloat(0x7fc00000u);
    const bool partial = (pc.flags & FLASH_PARTIAL) != 0u;
    if ((partial || (pc.flags & FLASH_STATS) != 0u) && lane == 0) {
        [[unroll]] for (uint i = 0; i < RPG; ++i) {
            const uint row = row0 + r_first + i;
            if (row < pc.q_len) {
                state[2 * (state_base + row)] = m_run[i] == pos_inf ? nan : m_run[i];
                state[2 * (state_base + row) + 1] = l_run[i];
            }
        }
    }
    if ((FEATURES & SCORE_LSE) != 0u && !partial && lane == 0) {
        [[unroll]] for (uint i = 0; i < RPG; ++i) {
            const uint row = row0 + r_first + i;
            if (row < pc.q_len)
                lse_out[state_base + row] = row_lse(m_run[i], l_run[i], m_run[i] == pos_inf, row_drop(row));
        }
    }
    [[unroll]] for (uint k = 0; k < O_ROWS; ++k) {
        const uint ri = o_group + k * O_GROUPS, row = row0 + r_first + ri;
        if (ri >= RPG || row >= pc.q_len) continue;
        float l = 0.0, mr = neg_inf;
        bool poisoned = false;
        [[unroll]] for (uint i = 0; i < RPG; ++i) {  // registers, indexed by constants only
            if (i == ri) {
                l = l_run[i];
                mr = m_run[i];
                poisoned = m_run[i] == pos_inf;
            }
        }
        [[unroll]] for (uint m = 0; m < O_COLS; ++m) {
            const uint c = 4 * (o_lane + m * O_LANES);
            const vec4 r = partial ? o[k * O_COLS + m]
                                   : (poisoned ? vec4(nan) : normalised(o[k * O_COLS + m], mr, l, FEATURES, sink + row_drop(row)));
            const uint at = o_base + row * pc.o_rs + c;
            [[unroll]] for (uint e = 0; e < 4; ++e)
                if (c + e < pc.dv) o_out[at + e] = r[e];
        }
    }
}

void main() {
    locate();
    load_queries_and_state();
    // Causal and the window: keys outside what the block's rows may see are masked for the whole
    // block; their tiles are never loaded or computed.
    const int p_first = int(row0) + pc.causal_offset, p_last = int(min(row0 + BR, pc.q_len)) - 1 + pc.causal_offset;
    const uvec2 keys = visible_keys(p_first, p_last, FEATURES, causal, sp, pc.kv_begin, min(pc.kv_stop, pc.kv_len));
    const uint kv_end = keys.y;
    uint parity = 0;
    for (uint j0 = keys.x; j0 < kv_end; j0 += BC, parity ^= 1u) {
        const uint bc = min(BC, kv_end - j0);
        const bool careful = load_tile(j0, bc, parity);
        score_tile();
        mask_tile(j0, bc);
        reduce_max();
        probabilities(j0);
        reduce_sum();
        accumulate(careful, bc);
    }
    write_results();
}
