#version 450
// Device ceiling, arithmetic: eight independent chains of fused multiply-adds per invocation,
// `iterations` deep. 16 floating-point operations per iteration per invocation. The result is
// stored so the compiler cannot drop the work.
layout(local_size_x = 256, local_size_y = 1, local_size_z = 1) in;
layout(std430, binding = 0) writeonly buffer Out { float result[]; };
layout(push_constant) uniform Push {
    uint group_x, group_y, group_z;
    uint iterations;
    float seed;
} pc;

void main() {
    const uint id = (gl_WorkGroupID.x + pc.group_x) * gl_WorkGroupSize.x + gl_LocalInvocationID.x;
    const float b = 0.9999, c = 1e-4;
    float a0 = pc.seed + float(id) * 1e-9, a1 = a0 + 0.1, a2 = a0 + 0.2, a3 = a0 + 0.3;
    float a4 = a0 + 0.4, a5 = a0 + 0.5, a6 = a0 + 0.6, a7 = a0 + 0.7;
    for (uint i = 0; i < pc.iterations; ++i) {
        a0 = fma(a0, b, c); a1 = fma(a1, b, c); a2 = fma(a2, b, c); a3 = fma(a3, b, c);
        a4 = fma(a4, b, c); a5 = fma(a5, b, c); a6 = fma(a6, b, c); a7 = fma(a7, b, c);
    }
    result[id] = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
}
