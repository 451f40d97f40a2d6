#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : enable
// Fused attention (flash attention): softmax(Q_h·K_hᵀ·scale + mask)·V_h for a block of BR query
// rows of one (batch, head), streaming K and V through shared memory BC rows at a time with an
// online softmax. Nothing of size seq x seq is ever written: device memory stays O(B·H·N·d).
//
// Per K/V tile, the workgroup cooperates in three steps:
//   1. scores  S[r][j] = q_r·k_j·scale (+ additive mask), masked -> -inf        (all invocations)
//   2. softmax m' = max(m, max_j S[r][j]), alpha = exp(m - m'), P = exp(S - m'),
//              l = l·alpha + Σ_j P[r][j]                                         (one invocation per row)
//   3. values  O[r][c] = O[r][c]·alpha_r + Σ_j P[r][j]·v_j[c]                   (all invocations)
// Statistics and accumulators are float32. At the end output = O / l: 0 for a row with nothing
// to attend to, NaN for a row with a NaN or +inf score (as the staged softmax does). A masked
// entry contributes nothing, not even 0·NaN. With a causal mask the loop stops at the block's last
// row: tiles above the diagonal are never loaded or computed.
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
layout(std430, binding = 3) writeonly buffer O { float o_out[]; };

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
} pc;

const uint WG = gl_WorkGroupSize.x;
const uint KV_MAX = D_MAX > DV_MAX ? D_MAX : DV_MAX;
const uint O_PER_INVOCATION = (BR * DV_MAX + WG - 1) / WG;

shared float tile_q[BR * D_MAX];   // this block's queries, pre-multiplied by scale
shared float tile_kv[BC * KV_MAX]; // K tile, then V tile
shared float tile_p[BR * BC];      // scores, then probabilities
shared float row_m[BR], row_l[BR], row_alpha[BR];
shared bool row_poisoned[BR];

void main() {
    const uint row0 = (gl_WorkGroupID.x + pc.group_x) * BR;
    const uint z = gl_WorkGroupID.z + pc.group_z;
    const uint batch = z / pc.heads, head = z % pc.heads;
    const uint t = gl_LocalInvocationID.x;
    const uint base = batch * pc.seq * pc.ld;
    const float neg_inf = uintBitsToFloat(0xff800000u), pos_inf = uintBitsToFloat(0x7f800000u);
    const bool causal = (pc.flags & 1u) != 0u, has_mask = (pc.flags & 2u) != 0u, has_add = (pc.flags & 4u) != 0u;
    const uint q_col = head * pc.d, k_col = pc.k_off + head * pc.d, v_col = pc.v_off + head * pc.dv;

    for (uint idx = t; idx < BR * pc.d; idx += WG) {
        const uint r = idx / pc.d, c = idx % pc.d;
        tile_q[r * D_MAX + c] = row0 + r < pc.seq ? float(qkv[base + (row0 + r) * pc.ld + q_col + c]) * pc.scale : 0.0;
    }
    for (uint r = t; r < BR; r += WG) {
        row_m[r] = neg_inf;
        row_l[r] = 0.0;
        row_poisoned[r] = false;
    }
    float o[O_PER_INVOCATION];
    [[unroll]] for (uint k = 0; k < O_PER_INVOCATION; ++k) o[k] = 0.0;

    // Causal: keys beyond the block's last row are masked for every row of the block.
    const uint kv_end = causal ? min(pc.seq, row0 + BR) : pc.seq;
    for (uint j0 = 0; j0 < kv_end; j0 += BC) {
        const uint bc = min(BC, kv_end - j0);
        for (uint idx = t; idx < bc * pc.d; idx += WG) {
            const uint j = idx / pc.d, c = idx % pc.d;
            tile_kv[j * D_MAX + c] = float(qkv[base + (j0 + j) * pc.ld + k_col + c]);
        }
        barrier();
        // 1. scores
        for (uint idx = t; idx < BR * BC; idx += WG) {
            const uint r = idx / BC, j = idx % BC, row = row0 + r, key = j0 + j;
            float s = neg_inf;
            if (row < pc.seq && j < bc && (!causal || key <= row)) {
                float acc = 0.0;
                for (uint c = 0; c < pc.d; ++c) acc = fma(tile_q[r * D_MAX + c], tile_kv[j * D_MAX + c], acc);
                const uint mi = row * pc.seq + key;
                bool allowed = true;
                if (has_mask) {
                    const uint bit = batch * pc.mask_bs + mi;
                    allowed = ((mask_bits[bit >> 5] >> (bit & 31u)) & 1u) != 0u;
                }
                if (allowed) s = has_add ? acc + additive[batch * pc.add_bs + mi] : acc;
            }
            tile_p[idx] = s;
        }
        barrier();
        // 2. online softmax, one invocation per row; meanwhile the others may not touch tile_kv
        for (uint r = t; r < BR; r += WG) {
            float tile_max = neg_inf;
            bool poisoned = row_poisoned[r];
            for (uint j = 0; j < bc; ++j) {
                const float s = tile_p[r * BC + j];
                if (isnan(s) || s == pos_inf) poisoned = true;
                else tile_max = max(tile_max, s);
            }
            row_poisoned[r] = poisoned;
            const float m_old = row_m[r];
            const float m_new = max(m_old, tile_max);
            float alpha = 1.0, sum = 0.0;
            if (m_new != neg_inf && !poisoned) {
                alpha = exp(m_old - m_new);  // 0 while nothing was allowed before
                for (uint j = 0; j < bc; ++j) {
                    const float s = tile_p[r * BC + j];
                    const float p = s == neg_inf ? 0.0 : exp(s - m_new);
                    tile_p[r * BC + j] = p;
                    sum += p;
                }
                row_m[r] = m_new;
                row_l[r] = row_l[r] * alpha + sum;
            } else {
                for (uint j = 0; j < bc; ++j) tile_p[r * BC + j] = 0.0;
            }
            row_alpha[r] = alpha;
        }
        barrier();
        for (uint idx = t; idx < bc * pc.dv; idx += WG) {
            const uint j = idx / pc.dv, c = idx % pc.dv;
            tile_kv[j * DV_MAX + c] = float(qkv[base + (j0 + j) * pc.ld + v_col + c]);
        }
        barrier();
        // 3. values
        [[unroll]] for (uint k = 0; k < O_PER_INVOCATION; ++k) {
            const uint e = t + k * WG, r = e / DV_MAX, c = e % DV_MAX;
            if (r < BR && c < pc.dv) {
                float acc = o[k] * row_alpha[r];
                for (uint j = 0; j < bc; ++j) {
                    const float p = tile_p[r * BC + j];
                    if (p != 0.0) acc = fma(p, tile_kv[j * DV_MAX + c], acc);  // masked: nothing, not 0·NaN
                }
                o[k] = acc;
            }
        }
        barrier();
    }
    const float nan = uintBitsToFloat(0x7fc00000u);
    [[unroll]] for (uint k = 0; k < O_PER_INVOCATION; ++k) {
        const uint e = t + k * WG, r = e / DV_MAX, c = e % DV_MAX, row = row0 + r;
        if (r < BR && c < pc.dv && row < pc.seq) {
            const float l = row_l[r];
            o_out[batch * pc.o_bs + row * pc.o_rs + head * pc.dv + c] =
                row_poisoned[r] ? nan : (l > 0.0 ? o[k] / l : 0.0);
        }
    }
}
