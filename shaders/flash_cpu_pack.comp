#version 450
#extension GL_GOOGLE_include_directive : require
// Prepares the texel buffers of the CPU-device fused kernel (flash_cpu.comp): copies each
// (batch, head)'s Q, K and V out of the projected Q|K|V rows into rows of whole texels (4 values,
// zero-padded), npad rows per (batch, head) with zero rows after the last, so that the kernel
// reads one key row as D4 aligned texel fetches. HALF = 1 writes RGBA16F texels (2 words each),
// else RGBA32F (4 words). Also marks each (batch, head) whose V holds a NaN or Inf, for which the
// kernel takes its careful path (the word is zeroed by the host before this runs).
#include "precision.glsl"

layout(local_size_x_id = 0, local_size_y = 1, local_size_z = 1) in;
layout(constant_id = 1) const uint HALF = 0;

layout(std430, binding = 0) readonly buffer QKV { QKV_T qkv[]; };
layout(std430, binding = 1) writeonly buffer Packed { uint packed[]; };
layout(std430, binding = 2) buffer Flags { uint v_nonfinite[]; };

// Mirrored by struct flash_cpu_pack_push in src/flash_cpu.cpp.
layout(push_constant) uniform Push {
    uint group_x, group_y, group_z;
    uint seq, npad;
    uint d, dv, d4, dv4;  // head widths, and in texels
    uint ld, heads;
    uint k_col, v_col;    // column offsets of K and V in a Q|K|V row
    uint q_at, k_at, v_at;  // first texel of each region in `packed`
} pc;

void main() {
    const uint t = (gl_WorkGroupID.x + pc.group_x) * gl_WorkGroupSize.x + gl_LocalInvocationID.x;
    const uint z = gl_WorkGroupID.z + pc.group_z;
    const uint per_row = 2u * pc.d4 + pc.dv4;
    if (t >= pc.npad * per_row) return;
    const uint row = t / per_row, r = t % per_row;
    const uint batch = z / pc.heads, head = z % pc.heads;
    uint width, col, c, texel;
    if (r < pc.d4) {
        width = pc.d, c = r, col = head * pc.d;
        texel = pc.q_at + (z * pc.npad + row) * pc.d4 + c;
    } else if (r < 2u * pc.d4) {
        width = pc.d, c = r - pc.d4, col = pc.k_col + head * pc.d;
        texel = pc.k_at + (z * pc.npad + row) * pc.d4 + c;
    } else {
        width = pc.dv, c = r - 2u * pc.d4, col = pc.v_col + head * pc.dv;
        texel = pc.v_at + (z * pc.npad + row) * pc.dv4 + c;
    }
    vec4 v = vec4(0.0);
    if (row < pc.seq) {
        const uint base = (batch * pc.seq + row) * pc.ld + col;
        for (uint e = 0; e < 4u; ++e)
            if (c * 4u + e < width) v[e] = float(qkv[base + c * 4u + e]);
    }
    if (r >= 2u * pc.d4 && (any(isnan(v)) || any(isinf(v)))) v_nonfinite[z] = 1u;
    if (HALF != 0u) {
        packed[2u * texel] = packHalf2x16(v.xy);
        packed[2u * texel + 1u] = packHalf2x16(v.zw);
    } else {
        for (uint e = 0; e < 4u; ++e) packed[4u * texel + e] = floatBitsToUint(v[e]);
    }
}
