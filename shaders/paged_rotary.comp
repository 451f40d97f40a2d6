#version 450
#extension GL_GOOGLE_include_directive : require
// The fused rotary embedding of a paged_call (contract/paged.h): each invocation turns the first
// rotary_dim values of one texel row in place, pair by pair, so no two invocations write one word.
#include "contract/paged.h"

layout(local_size_x = PAGED_ROTARY_WORKGROUP, local_size_y = 1, local_size_z = 1) in;
layout(std430, binding = PAGED_ROTARY_BINDING_ROWS) buffer Rows { uint rows[]; };
layout(std430, binding = PAGED_ROTARY_BINDING_ANGLES) readonly buffer Angles { float angles[]; };
layout(std430, binding = PAGED_ROTARY_BINDING_POS) readonly buffer Pos { uint pos[]; };
layout(push_constant) uniform Push { paged_rotary_push pc; };

// Value e of the row starting at value `base` (4 per texel).
float get(uint base, uint e) {
    const uint i = base + e;
    if (pc.half_texels != 0u) {
        const vec2 two = unpackHalf2x16(rows[i >> 1]);
        return (i & 1u) != 0u ? two.y : two.x;
    }
    return uintBitsToFloat(rows[i]);
}

void put(uint base, uint e, float x) {
    const uint i = base + e;
    if (pc.half_texels != 0u) {
        vec2 two = unpackHalf2x16(rows[i >> 1]);
        if ((i & 1u) != 0u) two.y = x; else two.x = x;
        rows[i >> 1] = packHalf2x16(two);
    } else {
        rows[i] = floatBitsToUint(x);
    }
}

void main() {
    const uint r = (gl_WorkGroupID.x + pc.group_x) * PAGED_ROTARY_WORKGROUP + gl_LocalInvocationID.x;
    if (r >= pc.rows) return;
    const uint base = (pc.at + r * pc.w4) * 4u;
    const uint t = pos[pc.pos_off + (r / pc.pos_div) % pc.pos_mod];
    for (uint j = 0u; j < pc.rotary_half; ++j) {
        const uint a = pc.interleaved != 0u ? 2u * j : j;
        const uint z = pc.interleaved != 0u ? 2u * j + 1u : j + pc.rotary_half;
        const float c = angles[pc.cos_off + t * pc.rotary_half + j];
        const float s = angles[pc.sin_off + t * pc.rotary_half + j];
        const float x1 = get(base, a), x2 = get(base, z);
        put(base, a, x1 * c - x2 * s);
        put(base, z, x1 * s + x2 * c);
    }
}
