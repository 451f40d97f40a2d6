#version 450
#extension GL_GOOGLE_include_directive : require
// texelFetch on textureBuffer: uniform texel buffers as plain images (a sampled image of Dim Buffer is
// invalid SPIR-V, which Mesa 25 warns about)
#extension GL_EXT_samplerless_texture_functions : require
// Stage 3, softmax over each row of the scores, in place, for CPU devices (llvmpipe-like: a
// workgroup is one subgroup, its invocations the lanes of one SIMD vector): lane l owns row
// row0 + l, reads it through an RGBA32F uniform texel view of the scores (four per fetch, a
// gather across the lanes, where softmax.comp's storage-buffer loads are one loop over the lanes
// each) and writes it back four at a time. Two passes: the running maximum m and the sum l of
// exp(s - m), rescaled whenever m grows (online softmax), then exp(s - m) / l. The host takes it
// where rows are whole texels (seq % 4 == 0) and 2·seq/4 steps stay under the loop limit.
// Same results as softmax.comp: masked entries (-inf) get weight 0, a row with no finite maximum
// becomes all zeros, a NaN or +inf score anywhere makes the whole row NaN.
// Each lane writes only what it has read, and reads nothing after it wrote it: the texel view and
// the storage binding of the same buffer never see one element in both orders.
#include "contract/softmax.h"
layout(local_size_x_id = SOFTMAX_SPEC_WORKGROUP, local_size_y = 1, local_size_z = 1) in;
layout(constant_id = SOFTMAX_SPEC_EXACT) const uint EXACT = 0;  // 1: rows is a multiple of the workgroup

layout(std430, binding = SOFTMAX_BINDING_S) buffer S4 { vec4 s4[]; };
layout(binding = SOFTMAX_BINDING_TEXELS) uniform textureBuffer s_tex;

layout(push_constant) uniform Push { softmax_push pc; };

void main() {
    const uint row = (gl_WorkGroupID.x + pc.group_x) * gl_WorkGroupSize.x + gl_LocalInvocationID.x;
    const uint cols4 = pc.cols / 4u;
    const uint base = min(row, pc.rows - 1u) * cols4;  // rows past the end read the last one, store nothing
    const float neg_inf = uintBitsToFloat(0xff800000u), pos_inf = uintBitsToFloat(0x7f800000u);

    float m = neg_inf, l = 0.0;
    for (uint c = 0; c < cols4; ++c) {
        vec4 v = texelFetch(s_tex, int(base + c));
        v = mix(v, vec4(pos_inf), isnan(v));  // a NaN counts as +inf, so it reaches the check below
        const float m_new = max(m, max(max(v.x, v.y), max(v.z, v.w)));
        const float m_use = m_new == neg_inf ? 0.0 : m_new;  // nothing allowed yet: no -inf - -inf
        const vec4 e = exp(v - m_use);
        l = l * exp(m - m_use) + ((e.x + e.y) + (e.z + e.w));
        m = m_new;
    }
    const float nan = uintBitsToFloat(0x7fc00000u);
    if (EXACT == 0u && row >= pc.rows) return;
    for (uint c = 0; c < cols4; ++c) {
        const vec4 v = texelFetch(s_tex, int(base + c));
        // all masked: zeros; a NaN or +inf score: PyTorch's softmax gives NaN for the whole row
        // A masked entry's weight is -0.0 (shaders/values.glsl), told apart from an underflow.
        const vec4 masked = vec4(uintBitsToFloat(0x80000000u));
        s4[base + c] = m == neg_inf ? masked : m == pos_inf ? vec4(nan) : mix(exp(v - m) / l, masked, equal(v, vec4(neg_inf)));
    }
}
