#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : enable
// Appends into a paged pool (contract/paged.h): the new rows of every K/V head, already in the
// pool's texel form, each written to the pool row the block table gives it (src/run/run_paged.cpp
// records it before the decode that reads them); a row at PAGED_ROW_NONE, or past the pool, is not
// written. 32-bit words: an f32 texel is four, an f16
// texel two, so one copy serves both.
#include "contract/paged.h"

layout(local_size_x = PAGED_APPEND_WORKGROUP, local_size_y = 1, local_size_z = 1) in;
layout(std430, binding = PAGED_APPEND_BINDING_SRC) readonly buffer Src { uint src[]; };
layout(std430, binding = PAGED_APPEND_BINDING_DST) writeonly buffer Dst { uint dst[]; };
layout(std430, binding = PAGED_APPEND_BINDING_AT) readonly buffer At { uint at[]; };
layout(push_constant) uniform Push { paged_append_push pc; };

void main() {
    const uint first = ((gl_WorkGroupID.x + pc.group_x) * PAGED_APPEND_WORKGROUP + gl_LocalInvocationID.x) *
                       PAGED_APPEND_PER_INVOCATION;
    const uint per_head = pc.rows * pc.width;
    const uint count = pc.heads * per_head;
    [[unroll]] for (uint k = 0u; k < PAGED_APPEND_PER_INVOCATION; ++k) {
        const uint i = first + k;
        if (i < count) {
            const uint h = i / per_head, rest = i - h * per_head;
            const uint r = rest / pc.width, c = rest - r * pc.width;
            const uint row = at[pc.at_off + r];
            if (row < pc.pool_rows)  // PAGED_ROW_NONE (a bad device table's entry): nothing written
                dst[pc.dst_off + (h * pc.pool_rows + row) * pc.width + c] = src[pc.src_off + i];
        }
    }
}
