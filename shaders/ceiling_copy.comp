#version 450
// Device ceiling, memory: a plain copy of vec4s; bytes moved = 2 x the buffer size.
layout(local_size_x = 256, local_size_y = 1, local_size_z = 1) in;
layout(std430, binding = 0) readonly buffer Src { vec4 src[]; };
layout(std430, binding = 1) writeonly buffer Dst { vec4 dst[]; };
layout(push_constant) uniform Push {
    uint group_x, group_y, group_z;
    uint count;  // vec4 elements
} pc;

void main() {
    const uint i = (gl_WorkGroupID.x + pc.group_x) * gl_WorkGroupSize.x + gl_LocalInvocationID.x;
    if (i < pc.count) dst[i] = src[i];
}
