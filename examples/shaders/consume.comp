#version 450
// The application's own consumer of qkv's output: out2 = 2·out + 1.
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer O { float o[]; };
layout(std430, binding = 1) writeonly buffer R { float r[]; };
layout(push_constant) uniform Push { uint n, o_off; } pc;

void main() {
    const uint i = gl_GlobalInvocationID.x;
    if (i < pc.n) r[i] = 2.0 * o[pc.o_off + i] + 1.0;
}
