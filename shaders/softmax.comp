#version 450
#extension GL_GOOGLE_include_directive : require
// Stage 3, softmax over each row of the scores, in place: the scores become the weights.
// One workgroup per row. The row maximum is subtracted before exp; max and sum are float32.
// Masked entries hold -inf and get weight 0; a row with no finite maximum (fully masked) becomes
// all zeros; a NaN anywhere in the row makes the whole row NaN, as in PyTorch.
// The workgroup size (a power of two) is a specialization constant (contract/softmax.h).
#include "contract/softmax.h"
layout(local_size_x_id = SOFTMAX_SPEC_WORKGROUP, local_size_y = 1, local_size_z = 1) in;
#include "reduce.glsl"

layout(std430, binding = SOFTMAX_BINDING_S) buffer S { float s[]; };

layout(push_constant) uniform Push { softmax_push pc; };

void main() {
    const uint row = gl_WorkGroupID.x + pc.group_x;
    if (row >= pc.rows) return;  // uniform per workgroup
    const uint base = row * pc.cols, t = gl_LocalInvocationID.x, step = gl_WorkGroupSize.x;
    const float neg_inf = uintBitsToFloat(0xff800000u), pos_inf = uintBitsToFloat(0x7f800000u);

    // Row maximum. A NaN counts as +inf, so it reaches the check below (GLSL's max may drop NaN).
    float m = neg_inf;
    for (uint j = t; j < pc.cols; j += step) {
        const float v = s[base + j];
        m = isnan(v) ? pos_inf : max(m, v);
    }
    m = workgroup_max(m);

    if (m == neg_inf) {  // every entry masked: zero weights (-0.0: masked, shaders/values.glsl)
        for (uint j = t; j < pc.cols; j += step) s[base + j] = uintBitsToFloat(0x80000000u);
        return;
    }
    if (m == pos_inf) {  // a NaN or +inf score: PyTorch's softmax gives NaN for the whole row
        for (uint j = t; j < pc.cols; j += step) s[base + j] = uintBitsToFloat(0x7fc00000u);
        return;
    }
    float sum = 0.0;
    for (uint j = t; j < pc.cols; j += step) {
        // A masked entry's weight is -0.0 (shaders/values.glsl), told apart from an underflow.
        const float e = s[base + j] == neg_inf ? uintBitsToFloat(0x80000000u) : exp(s[base + j] - m);
        s[base + j] = e;
        sum += e;
    }
    sum = workgroup_sum(sum);
    for (uint j = t; j < pc.cols; j += step) s[base + j] = s[base + j] / sum;
}
