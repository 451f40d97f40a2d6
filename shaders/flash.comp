#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : enable
// Fused attention (flash attention): softmax(Q_h·K_hᵀ·scale + mask)·V_h for a block of BR query
// rows of one (batch, head), streaming K and V through shared memory BC rows at a time with an
// online softmax. Nothing of size seq x seq is ever written: device memory stays O(B·H·N·d).
//
// Per K/V tile, the workgroup cooperates in three steps:
//   1. scores  S[r][j] = q_r·k_j·scale (+ additive mask), masked -> -inf        (all invocations)
//   2. softmax m' = max(m, max_j S[r][j]), alpha = exp(m - m')                 (one invocation per row)
//              P = exp(S - m')                                                 (all invocations)
//              l = l·alpha + Σ_j P[r][j]                                       (one invocation per row)
//   3. values  O[r][c] = O[r][c]·alpha_r + Σ_j P[r][j]·v_j[c]                   (all invocations)
// Statistics and accumulators are float32. At the end output = O / l: 0 for a row with nothing
// to attend to, NaN for a row with a NaN or +inf score (as the staged softmax does). A masked
// entry contributes nothing, not even 0·NaN. With a causal mask the loop stops at the block's last
// row: tiles above the diagonal are never loaded or computed.
//
// Key chunks: a dispatch may cover only the keys [kv_begin, kv_stop). Then the running maximum and
// sum go to `state` and the unnormalised accumulator to the output (flag 16, more chunks follow),
// and the next dispatch resumes from them (flag 8). The host splits long sequences this way on
// devices that bound the loop iterations of one invocation: llvmpipe (lavapipe) ends every loop
// of a shader after 65,535 iterations in total, silently, which would drop the last keys.
//
// Specialization constants (chosen per device by src/stages.cpp): the workgroup size, BR, BC,
// and D_MAX / DV_MAX, the head widths rounded up, which size the shared tiles. Loops run to the
// actual widths from push constants.
#include "precision.glsl"

layout(local_size_x_id = 0, local_size_y = 1, local_size_z = 1) in;
layout(constant_id = 1) const uint BR = 16;      // query rows per workgroup
layout(constant_id = 2) const uint BC = 16;      // key/value rows per tile
layout(constant_id = 3) const uint D_MAX = 64;   // >= head width of Q and K
layout(constant_id = 4) const uint DV_MAX = 64;  // >= head width of V

layout(std430, binding = 0) readonly buffer QKV { QKV_T qkv[]; };
layout(std430, binding = 1) readonly buffer MaskBits { uint mask_bits[]; };
layout(std430, binding = 2) readonly buffer Additive { float additive[]; };
layout(std430, binding = 3) buffer O { float o_out[]; };
layout(std430, binding = 4) buffer State { float state[]; };  // (m, l) per (batch, head, row)

// Mirrored by struct flash_push in src/stages.hpp.
layout(push_constant) uniform Push {
    uint group_x, group_y, group_z;
    uint seq;          // N
    uint d, dv;        // head widths of Q/K and of V
    uint ld;           // row stride of Q|K|V
    uint heads;
    uint k_off, v_off; // column offsets of K and V in a Q|K|V row (Q is at 0)
    uint o_rs, o_bs;   // output row and batch strides (head h writes columns h·dv ..)
    float scale;
    uint flags;        // 1 causal, 2 boolean mask, 4 additive mask
    uint mask_bs, add_bs;
    uint kv_begin, kv_stop;  // this dispatch's keys
} pc;

const uint WG = gl_WorkGroupSize.x;
const uint KV_MAX = D_MAX > DV_MAX ? D_MAX : DV_MAX;
// Register blocking (the host keeps these exact: WG % BC == 0, BR % S_GROUPS == 0, ...).
// Scores: invocation t takes key columns t % S_LANES (+ multiples of S_LANES) and every
// S_GROUPS-th row from t / S_LANES.
const uint S_LANES = BC < WG ? BC : WG;
const uint S_GROUPS = WG / S_LANES;
const uint S_ROWS = BR / S_GROUPS;
const uint S_COLS = BC / S_LANES;
// Values: invocation t takes columns t % O_LANES (+ multiples of O_LANES) and every
// O_GROUPS-th row from t / O_LANES.
const uint O_LANES = DV_MAX < WG ? DV_MAX : WG;
const uint O_GROUPS = WG / O_LANES;
const uint O_ROWS = BR / O_GROUPS;
const uint O_COLS = (DV_MAX + O_LANES - 1) / O_LANES;

shared float tile_q[BR * D_MAX];   // this block's queries, pre-multiplied by scale
shared float tile_kv[BC * KV_MAX]; // K tile (transposed: [c][j]), then V tile ([j][c])
shared float tile_p[BR * BC];      // scores, then probabilities
shared float row_m[BR], row_l[BR], row_alpha[BR];
shared bool row_poisoned[BR];
shared bool tile_v_nonfinite;  // the V tile holds a NaN or Inf: take the careful loop

uint o_group_of(uint t) { return O_GROUPS == 1 ? 0 : t / O_LANES; }

void main() {
    const uint row0 = (gl_WorkGroupID.x + pc.group_x) * BR;
    const uint z = gl_WorkGroupID.z + pc.group_z;
    const uint batch = z / pc.heads, head = z % pc.heads;
    const uint t = gl_LocalInvocationID.x;
    const uint base = batch * pc.seq * pc.ld;
    const float neg_inf = uintBitsToFloat(0xff800000u), pos_inf = uintBitsToFloat(0x7f800000u);
    const bool causal = (pc.flags & 1u) != 0u, has_mask = (pc.flags & 2u) != 0u, has_add = (pc.flags & 4u) != 0u;
    const bool resume = (pc.flags & 8u) != 0u, partial = (pc.flags & 16u) != 0u;
    const uint state_base = z * pc.seq;
    const uint q_col = head * pc.d, k_col = pc.k_off + head * pc.d, v_col = pc.v_off + head * pc.dv;

    for (uint idx = t; idx < BR * pc.d; idx += WG) {
        const uint r = idx / pc.d, c = idx % pc.d;
        tile_q[r * D_MAX + c] = row0 + r < pc.seq ? float(qkv[base + (row0 + r) * pc.ld + q_col + c]) * pc.scale : 0.0;
    }
    for (uint r = t; r < BR; r += WG) {
        row_m[r] = neg_inf;
        row_l[r] = 0.0;
        row_poisoned[r] = false;
        if (resume && row0 + r < pc.seq) {  // NaN as the maximum marks a poisoned row
            const float m = state[2 * (state_base + row0 + r)];
            row_poisoned[r] = isnan(m);
            row_m[r] = isnan(m) ? neg_inf : m;
            row_l[r] = state[2 * (state_base + row0 + r) + 1];
        }
    }
    float o[O_ROWS * O_COLS];
    [[unroll]] for (uint k = 0; k < O_ROWS * O_COLS; ++k) o[k] = 0.0;
    if (resume) {
        [[unroll]] for (uint i = 0; i < O_ROWS; ++i) {
            const uint row = row0 + o_group_of(t) + i * O_GROUPS;
            [[unroll]] for (uint m = 0; m < O_COLS; ++m) {
                const uint c = t % O_LANES + m * O_LANES;
                if (row < pc.seq && c < pc.dv) o[i * O_COLS + m] = o_out[batch * pc.o_bs + row * pc.o_rs + head * pc.dv + c];
            }
        }
    }
    // With one group the row index is a constant, so tile_q / tile_p reads are provably uniform
    // (a scalar load and broadcast, not a gather, on SIMD-per-invocation devices such as lavapipe).
    const uint s_lane = t % S_LANES, s_group = S_GROUPS == 1 ? 0 : t / S_LANES;
    const uint o_lane = t % O_LANES, o_group = O_GROUPS == 1 ? 0 : t / O_LANES;

    // Causal: keys beyond the block's last row are masked for every row of the block.
    const uint kv_end = min(pc.kv_stop, causal ? min(pc.seq, row0 + BR) : pc.seq);
    for (uint j0 = pc.kv_begin; j0 < kv_end; j0 += BC) {
        const uint bc = min(BC, kv_end - j0);
        for (uint idx = t; idx < bc * pc.d; idx += WG) {
            const uint j = idx / pc.d, c = idx % pc.d;
            tile_kv[c * BC + j] = float(qkv[base + (j0 + j) * pc.ld + k_col + c]);  // transposed
        }
        barrier();
        // 1. scores: a block of S_ROWS x S_COLS dot products per invocation, so each loaded query
        //    and key element serves several products
        {
            float acc[S_ROWS * S_COLS];
            [[unroll]] for (uint i = 0; i < S_ROWS * S_COLS; ++i) acc[i] = 0.0;
            for (uint c = 0; c < pc.d; ++c) {
                float k[S_COLS];
                [[unroll]] for (uint n = 0; n < S_COLS; ++n) k[n] = tile_kv[c * BC + s_lane + n * S_LANES];
                [[unroll]] for (uint i = 0; i < S_ROWS; ++i) {
                    const float q = tile_q[(s_group + i * S_GROUPS) * D_MAX + c];
                    [[unroll]] for (uint n = 0; n < S_COLS; ++n) acc[i * S_COLS + n] = fma(q, k[n], acc[i * S_COLS + n]);
                }
            }
            [[unroll]] for (uint i = 0; i < S_ROWS; ++i) {
                const uint r = s_group + i * S_GROUPS, row = row0 + r;
                [[unroll]] for (uint n = 0; n < S_COLS; ++n) {
                    const uint j = s_lane + n * S_LANES, key = j0 + j;
                    float s = neg_inf;
                    if (row < pc.seq && j < bc && (!causal || key <= row)) {
                        const uint mi = row * pc.seq + key;
                        bool allowed = true;
                        if (has_mask) {
                            const uint bit = batch * pc.mask_bs + mi;
                            allowed = ((mask_bits[bit >> 5] >> (bit & 31u)) & 1u) != 0u;
                        }
                        const float a = acc[i * S_COLS + n];
                        if (allowed) s = has_add ? a + additive[batch * pc.add_bs + mi] : a;
                    }
                    tile_p[r * BC + j] = s;
                }
            }
        }
        barrier();
        // 2a. new row maxima (one invocation per row: comparisons only)
        for (uint r = t; r < BR; r += WG) {
            float tile_max = neg_inf;
            bool poisoned = row_poisoned[r];
            for (uint j = 0; j < bc; ++j) {
                const float s = tile_p[r * BC + j];
                if (isnan(s) || s == pos_inf) poisoned = true;
                else tile_max = max(tile_max, s);
            }
            row_poisoned[r] = poisoned;
            const float m_old = row_m[r], m_new = max(m_old, tile_max);
            // alpha rescales what was accumulated under the old maximum (0 while nothing was allowed)
            row_alpha[r] = (m_new != neg_inf && !poisoned) ? exp(m_old - m_new) : 1.0;
            row_m[r] = m_new;
        }
        barrier();
        // 2b. probabilities, every invocation (the exponentials are the costly part)
        for (uint idx = t; idx < BR * BC; idx += WG) {
            const uint r = idx / BC;
            const float s = tile_p[idx], m = row_m[r];
            tile_p[idx] = (s == neg_inf || m == neg_inf || row_poisoned[r]) ? 0.0 : exp(s - m);
        }
        barrier();
        // 2c. running sums (one invocation per row), while the others load the V tile
        for (uint r = t; r < BR; r += WG) {
            float sum = 0.0;
            for (uint j = 0; j < bc; ++j) sum += tile_p[r * BC + j];
            row_l[r] = row_l[r] * row_alpha[r] + sum;
        }
        if (t == 0) tile_v_nonfinite = false;
        barrier();
        bool nonfinite = false;
        for (uint idx = t; idx < bc * pc.dv; idx += WG) {
            const uint j = idx / pc.dv, c = idx % pc.dv;
            const float v = float(qkv[base + (j0 + j) * pc.ld + v_col + c]);
            nonfinite = nonfinite || isnan(v) || isinf(v);
            tile_kv[j * DV_MAX + c] = v;
        }
        if (nonfinite) tile_v_nonfinite = true;
        barrier();
        // 3. values: each loaded value element serves O_ROWS rows
        [[unroll]] for (uint i = 0; i < O_ROWS; ++i) {
            const float alpha = row_alpha[o_group + i * O_GROUPS];
            [[unroll]] for (uint m = 0; m < O_COLS; ++m) o[i * O_COLS + m] *= alpha;
        }
        if (tile_v_nonfinite) {  // uniform: a masked key's NaN value must add nothing, not 0·NaN
            for (uint j = 0; j < bc; ++j) {
                [[unroll]] for (uint m = 0; m < O_COLS; ++m) {
                    const uint c = o_lane + m * O_LANES;
                    const float v = c < pc.dv ? tile_kv[j * DV_MAX + c] : 0.0;
                    [[unroll]] for (uint i = 0; i < O_ROWS; ++i) {
                        const float p = tile_p[(o_group + i * O_GROUPS) * BC + j];
                        if (p != 0.0) o[i * O_COLS + m] = fma(p, v, o[i * O_COLS + m]);
                    }
                }
            }
        } else {
            for (uint j = 0; j < bc; ++j) {
                [[unroll]] for (uint m = 0; m < O_COLS; ++m) {
                    const uint c = o_lane + m * O_LANES;
                    const float v = c < pc.dv ? tile_kv[j * DV_MAX + c] : 0.0;
                    [[unroll]] for (uint i = 0; i < O_ROWS; ++i)
                        o[i * O_COLS + m] = fma(tile_p[(o_group + i * O_GROUPS) * BC + j], v, o[i * O_COLS + m]);
                }
            }
        }
        barrier();
    }
    barrier();  // the row statistics, also when this chunk had no keys for the block
    const float nan = uintBitsToFloat(0x7fc00000u);
    if (partial) {  // hand the running state to the next chunk
        [[unroll]] for (uint i = 0; i < O_ROWS; ++i) {
            const uint row = row0 + o_group + i * O_GROUPS;
            [[unroll]] for (uint m = 0; m < O_COLS; ++m) {
                const uint c = o_lane + m * O_LANES;
                if (row < pc.seq && c < pc.dv) o_out[batch * pc.o_bs + row * pc.o_rs + head * pc.dv + c] = o[i * O_COLS + m];
            }
        }
        for (uint r = t; r < BR; r += WG) {
            if (row0 + r < pc.seq) {
                state[2 * (state_base + row0 + r)] = row_poisoned[r] ? nan : row_m[r];
                state[2 * (state_base + row0 + r) + 1] = row_l[r];
            }
        }
        return;
    }
    [[unroll]] for (uint i = 0; i < O_ROWS; ++i) {
        const uint r = o_group + i * O_GROUPS, row = row0 + r;
        [[unroll]] for (uint m = 0; m < O_COLS; ++m) {
            const uint c = o_lane + m * O_LANES;
            if (row < pc.seq && c < pc.dv) {
                const float l = row_l[r];
                o_out[batch * pc.o_bs + row * pc.o_rs + head * pc.dv + c] =
                    row_poisoned[r] ? nan : (l > 0.0 ? o[i * O_COLS + m] / l : 0.0);
            }
        }
    }
}
