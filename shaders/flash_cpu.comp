#version 450
#extension GL_EXT_control_flow_attributes : enable
// Fused attention, CPU-device family (lavapipe / llvmpipe and other VK_PHYSICAL_DEVICE_TYPE_CPU
// drivers): the same results as flash.comp, shaped for a device that runs one workgroup on one
// CPU thread with the invocations of a subgroup as the lanes of a SIMD vector.
//
//   - one subgroup per workgroup (WG invocations, the device's subgroup size): no shared memory,
//     no barriers;
//   - each invocation owns RPI query rows (row0 + i·WG + lane) with their own online softmax
//     (running maximum m, sum l, accumulator) in registers;
//   - every step takes KPS keys; K and V rows are read through uniform texel buffers (RGBA32F or
//     RGBA16F, prepared by flash_cpu_pack.comp) at addresses that are the same for every lane, so
//     a load is one fetch and a broadcast, not a per-lane gather;
//   - every inner loop has a constant trip count (specialization constants), so it is unrolled:
//     the key-step loop is the only loop of the shader.
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
// Key chunks: a dispatch covers keys [kv_begin, kv_stop) (a multiple of KPS apart), resuming from
// (m, l) in `state` and the accumulator in the output (flag 8) and handing them on (flag 16).
// llvmpipe ends every loop of an invocation after 65,535 iterations in total; the host keeps the
// steps of one dispatch below that (src/flash_cpu.cpp).
//
// Causal balance: llvmpipe gives each thread a contiguous range of workgroups. With a causal
// mask, workgroup w takes row block w/2 (w even) or nb-1-w/2 (w odd), so every pair of
// neighbouring workgroups costs the same and the threads finish together.

layout(local_size_x_id = 0, local_size_y = 1, local_size_z = 1) in;
layout(constant_id = 1) const uint RPI = 4;   // query rows per invocation
layout(constant_id = 2) const uint KPS = 8;   // keys per step
layout(constant_id = 3) const uint D4 = 16;   // texels (4 floats) per Q/K row: ceil(d / 4)
layout(constant_id = 4) const uint DV4 = 16;  // texels per V row: ceil(dv / 4)
layout(constant_id = 5) const uint MASKS = 0;  // 1 causal, 2 boolean mask, 4 additive mask
layout(constant_id = 6) const uint CAREFUL = 0;  // this pipeline's kind of (batch, head), see above

layout(binding = 0) uniform samplerBuffer q_tex;  // [z][npad][D4], padded with zeros
layout(binding = 1) uniform samplerBuffer k_tex;  // [z][npad][D4]
layout(binding = 2) uniform samplerBuffer v_tex;  // [z][npad][DV4]
layout(std430, binding = 3) readonly buffer MaskBits { uint mask_bits[]; };
layout(std430, binding = 4) readonly buffer Additive { float additive[]; };
layout(std430, binding = 5) buffer O { float o_out[]; };
layout(std430, binding = 6) buffer State { float state[]; };  // (m, l) per (batch, head, row)
layout(std430, binding = 7) readonly buffer VFlags { uint v_nonfinite[]; };  // per (batch, head)

// Mirrored by struct flash_cpu_push in src/flash_cpu.hpp.
layout(push_constant) uniform Push {
    uint group_x, group_y, group_z;
    uint seq;          // N
    uint npad;         // rows per (batch, head) in the texel buffers
    uint dv;           // head width of V
    uint heads;
    uint o_rs, o_bs;   // output row and batch strides (head h writes columns h·dv ..)
    float scale;
    uint flags;        // 8 resume, 16 partial (the mask kinds are the constant MASKS)
    uint mask_bs, add_bs;
    uint kv_begin, kv_stop;
    uint blocks;       // row blocks per (batch, head)
} pc;

const uint WG = gl_WorkGroupSize.x;
const uint BLOCK = WG * RPI;

void main() {
    const bool causal = (MASKS & 1u) != 0u, has_mask = (MASKS & 2u) != 0u, has_add = (MASKS & 4u) != 0u;
    const bool resume = (pc.flags & 8u) != 0u, partial = (pc.flags & 16u) != 0u;
    const float neg_inf = uintBitsToFloat(0xff800000u);
    const uint w = gl_WorkGroupID.x + pc.group_x;
    const uint block = !causal ? w : ((w & 1u) == 0u ? w / 2u : pc.blocks - 1u - w / 2u);
    const uint row0 = block * BLOCK;
    const uint z = gl_WorkGroupID.z + pc.group_z;
    const uint batch = z / pc.heads, head = z % pc.heads;
    const uint lane = gl_LocalInvocationID.x;
    const uint zbase = z * pc.npad;

    vec4 q[RPI * D4];
    [[unroll]] for (uint i = 0; i < RPI; ++i)
        [[unroll]] for (uint c = 0; c < D4; ++c)
            q[i * D4 + c] = texelFetch(q_tex, int((zbase + row0 + i * WG + lane) * D4 + c)) * pc.scale;

    float m[RPI], l[RPI];
    vec4 acc[RPI * DV4];
    [[unroll]] for (uint i = 0; i < RPI; ++i) {
        const uint row = row0 + i * WG + lane;
        m[i] = neg_inf;
        l[i] = 0.0;
        [[unroll]] for (uint c = 0; c < DV4; ++c) acc[i * DV4 + c] = vec4(0.0);
        if (resume && row < pc.seq) {
            const uint si = 2u * (z * pc.seq + row);
            m[i] = state[si];
            l[i] = state[si + 1u];
            const uint ob = batch * pc.o_bs + row * pc.o_rs + head * pc.dv;
            [[unroll]] for (uint c = 0; c < DV4; ++c)
                [[unroll]] for (uint e = 0; e < 4; ++e)
                    if (c * 4u + e < pc.dv) acc[i * DV4 + c][e] = o_out[ob + c * 4u + e];
        }
    }

    // This pipeline's (batch, head)s only: the others get no key step and no output.
    const bool mine = (v_nonfinite[z] != 0u) == (CAREFUL != 0u);
    const uint rows_out = mine ? pc.seq : 0u;
    const bool any_mask = has_mask || has_add;
    // Causal: keys beyond the block's last row are masked for every row of the block.
    const uint kv_end = mine ? min(pc.kv_stop, causal ? min(pc.seq, row0 + BLOCK) : pc.seq) : 0u;
    for (uint j0 = pc.kv_begin; j0 < kv_end; j0 += KPS) {
        // scores of RPI rows x KPS keys
        float s[RPI * KPS];
        [[unroll]] for (uint k = 0; k < RPI * KPS; ++k) s[k] = 0.0;
        [[unroll]] for (uint c = 0; c < D4; ++c) {
            [[unroll]] for (uint j = 0; j < KPS; ++j) {
                const vec4 kv = texelFetch(k_tex, int((zbase + j0 + j) * D4 + c));
                [[unroll]] for (uint i = 0; i < RPI; ++i) {
                    const vec4 qv = q[i * D4 + c];
                    s[i * KPS + j] += qv.x * kv.x + qv.y * kv.y + qv.z * kv.z + qv.w * kv.w;
                }
            }
        }
        // masks: only on the steps that need them (the last keys, the causal diagonal, explicit masks)
        if (any_mask || j0 + KPS > kv_end || (causal && j0 + KPS > row0 + 1u)) {
            [[unroll]] for (uint i = 0; i < RPI; ++i) {
                const uint row = row0 + i * WG + lane;
                const uint mrow = min(row, pc.seq - 1u);
                [[unroll]] for (uint j = 0; j < KPS; ++j) {
                    const uint key = j0 + j;
                    bool ok = key < kv_end && (!causal || key <= row);
                    const uint mi = mrow * pc.seq + min(key, pc.seq - 1u);
                    float a = s[i * KPS + j];
                    if (has_mask) {
                        const uint bit = batch * pc.mask_bs + mi;
                        ok = ok && ((mask_bits[bit >> 5] >> (bit & 31u)) & 1u) != 0u;
                    }
                    if (has_add) a += additive[batch * pc.add_bs + mi];
                    s[i * KPS + j] = ok ? a : neg_inf;
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
                const float p = x == neg_inf ? 0.0 : exp(x - m_use);
                s[i * KPS + j] = p;
                sum += p;
            }
            l[i] = l[i] * alpha + sum;
            m[i] = m_new;
            [[unroll]] for (uint c = 0; c < DV4; ++c) acc[i * DV4 + c] *= alpha;
        }
        // values
        if (CAREFUL != 0u) {  // a masked key's NaN or Inf value must add nothing, not 0·NaN
            [[unroll]] for (uint c = 0; c < DV4; ++c) {
                [[unroll]] for (uint j = 0; j < KPS; ++j) {
                    const vec4 vv = texelFetch(v_tex, int((zbase + j0 + j) * DV4 + c));
                    [[unroll]] for (uint i = 0; i < RPI; ++i) {
                        const float p = s[i * KPS + j];
                        if (p != 0.0) acc[i * DV4 + c] += p * vv;
                    }
                }
            }
        } else {
            [[unroll]] for (uint c = 0; c < DV4; ++c) {
                [[unroll]] for (uint j = 0; j < KPS; ++j) {
                    const vec4 vv = texelFetch(v_tex, int((zbase + j0 + j) * DV4 + c));
                    [[unroll]] for (uint i = 0; i < RPI; ++i) acc[i * DV4 + c] += s[i * KPS + j] * vv;
                }
            }
        }
    }

    const float nan = uintBitsToFloat(0x7fc00000u);
    [[unroll]] for (uint i = 0; i < RPI; ++i) {
        const uint row = row0 + i * WG + lane;
        if (row >= rows_out) continue;
        const uint ob = batch * pc.o_bs + row * pc.o_rs + head * pc.dv;
        if (partial) {  // hand the running state to the next chunk
            const uint si = 2u * (z * pc.seq + row);
            state[si] = m[i];
            state[si + 1u] = l[i];
            [[unroll]] for (uint c = 0; c < DV4; ++c)
                [[unroll]] for (uint e = 0; e < 4; ++e)
                    if (c * 4u + e < pc.dv) o_out[ob + c * 4u + e] = acc[i * DV4 + c][e];
        } else {
            // l = 0: nothing to attend (zeros); l NaN: a NaN or +inf score (NaN row)
            const float inv = l[i] == 0.0 ? 0.0 : 1.0 / l[i];
            [[unroll]] for (uint c = 0; c < DV4; ++c)
                [[unroll]] for (uint e = 0; e < 4; ++e)
                    if (c * 4u + e < pc.dv) o_out[ob + c * 4u + e] = isnan(l[i]) ? nan : acc[i * DV4 + c][e] * inv;
        }
    }
}
