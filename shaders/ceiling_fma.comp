#version 450
#extension GL_EXT_control_flow_attributes : enable
#extension GL_GOOGLE_include_directive : require
// Device ceiling, arithmetic: what the device really reaches on float32 multiply-adds.
// Each invocation runs CHAINS independent vec4 chains (4·CHAINS scalar chains, enough to hide
// the latency of a multiply-add on any device), UNROLL steps per loop iteration with the inner
// loop's trip count a specialization constant (so drivers unroll it), and `iterations` loop
// iterations (the host keeps this under 65,535: CPU drivers end longer loops silently). One step
// of one chain is 4 multiply-adds = 8 floating-point operations. The host launches enough
// workgroups to fill every core or SM; the result is stored so the work cannot be dropped.
#include "contract/ceiling.h"
layout(local_size_x_id = CEILING_FMA_SPEC_WORKGROUP, local_size_y = 1, local_size_z = 1) in;
layout(constant_id = CEILING_FMA_SPEC_CHAINS) const uint CHAINS = 16;
layout(constant_id = CEILING_FMA_SPEC_UNROLL) const uint UNROLL = 8;
layout(std430, binding = CEILING_FMA_BINDING_OUT) writeonly buffer Out { float result[]; };
layout(push_constant) uniform Push { ceiling_fma_push pc; };

void main() {
    const uint id = (gl_WorkGroupID.x + pc.group_x) * gl_WorkGroupSize.x + gl_LocalInvocationID.x;
    // a <- a·b + c converges to c / (1 - b) = 1: no overflow, no denormals, however long it runs.
    const vec4 b = vec4(0.9999, 0.99991, 0.99992, 0.99993), c = vec4(1e-4, 9e-5, 8e-5, 7e-5);
    vec4 acc[CHAINS];
    [[unroll]] for (uint i = 0; i < CHAINS; ++i) acc[i] = vec4(pc.seed + float(id) * 1e-9 + float(i) * 0.01);
    for (uint it = 0; it < pc.iterations; ++it) {
        [[unroll]] for (uint u = 0; u < UNROLL; ++u) {
            [[unroll]] for (uint i = 0; i < CHAINS; ++i) acc[i] = fma(acc[i], b, c);
        }
    }
    vec4 sum = vec4(0.0);
    [[unroll]] for (uint i = 0; i < CHAINS; ++i) sum += acc[i];
    result[id] = sum.x + sum.y + sum.z + sum.w;
}
