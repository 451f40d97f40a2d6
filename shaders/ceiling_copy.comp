#version 450
#extension GL_GOOGLE_include_directive : require
// Device ceiling, memory: a plain copy of vec4s; bytes moved = 2 x the buffer size.
#include "contract/ceiling.h"
layout(local_size_x = CEILING_COPY_WORKGROUP, local_size_y = 1, local_size_z = 1) in;
layout(std430, binding = CEILING_COPY_BINDING_SRC) readonly buffer Src { vec4 src[]; };
layout(std430, binding = CEILING_COPY_BINDING_DST) writeonly buffer Dst { vec4 dst[]; };
layout(push_constant) uniform Push { ceiling_copy_push pc; };

void main() {
    const uint i = (gl_WorkGroupID.x + pc.group_x) * gl_WorkGroupSize.x + gl_LocalInvocationID.x;
    if (i < pc.count) dst[i] = src[i];
}
