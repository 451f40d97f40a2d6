#version 450
#extension GL_GOOGLE_include_directive : require
// Prepares the texel buffers of the CPU-device fused kernel (flash_cpu.comp): copies one tensor
// (Q, K or V, addressed by element strides as in contract/flash.h) into rows of whole texels (4
// values, zero-padded), npad rows per (batch, head) with zero rows after the last, so that the
// kernel reads one row as aligned texel fetches. HALF = 1 writes RGBA16F texels (2 words each),
// else RGBA32F (4 words). With mark_nonfinite (V) it also flags each (batch, head) whose rows hold
// a NaN or Inf, for which the kernel takes its careful path (the words are zeroed by the host).
#include "precision.glsl"
#include "contract/flash.h"

layout(local_size_x_id = FLASH_PACK_SPEC_WG, local_size_y = 1, local_size_z = 1) in;
layout(constant_id = FLASH_PACK_SPEC_FP16) const uint HALF = 0;

layout(std430, binding = FLASH_PACK_BINDING_SRC) readonly buffer Src { QKV_T src[]; };
layout(std430, binding = FLASH_PACK_BINDING_TEXELS) writeonly buffer Packed { uint packed[]; };
layout(std430, binding = FLASH_PACK_BINDING_FLAGS) buffer Flags { uint v_nonfinite[]; };

layout(push_constant) uniform Push { flash_pack_push pc; };

void main() {
    const uint t = (gl_WorkGroupID.x + pc.group_x) * gl_WorkGroupSize.x + gl_LocalInvocationID.x;
    const uint z = gl_WorkGroupID.z + pc.group_z;
    if (t >= pc.npad * pc.w4) return;
    const uint row = t / pc.w4, c = t % pc.w4;
    const uint batch = z / pc.heads, head = z % pc.heads;
    const uint texel = pc.at + (z * pc.stride + row) * pc.w4 + c;
    vec4 v = vec4(0.0);
    if (row < pc.rows) {
        const uint base = pc.off + batch * pc.bs + head * pc.hs + row * pc.rs + c * 4u;
        for (uint e = 0; e < 4u; ++e)
            if (c * 4u + e < pc.width) v[e] = float(src[base + e]);
    }
    if (pc.mark_nonfinite != 0u && (any(isnan(v)) || any(isinf(v)))) v_nonfinite[z] = 1u;
    if (HALF != 0u) {
        packed[2u * texel] = packHalf2x16(v.xy);
        packed[2u * texel + 1u] = packHalf2x16(v.zw);
    } else {
        for (uint e = 0; e < 4u; ++e) packed[4u * texel + e] = floatBitsToUint(v[e]);
    }
}
