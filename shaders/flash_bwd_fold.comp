#version 450
#extension GL_GOOGLE_include_directive : require
// Sums over broadcast dimensions, in a fixed order (contract/backward.h, bwd_fold_push): output m of
// a (MB, MH, ML, MS) tensor, each dimension 1 or the summed tensor's, is the sum of the elements
// (b, h, i, j) of the (B, H, L, S) tensor that broadcast onto it, in (b, h, i, j) order. The
// backward pass folds the additive mask's gradient (dS, (B, Hq, L, S), onto the mask's shape) and
// the sinks' (the rows' terms, (B, Hq, L, 1), onto (1, Hq, 1, 1)). One invocation per output; a
// dispatch adds the terms [first, stop) of each to what `out` holds (resume), so the host keeps
// every loop below llvmpipe's 65,535 iterations. A NaN or infinite sum sets
// BWD_FLAG_NONFINITE_GRADIENT.
#include "contract/backward.h"

layout(local_size_x_id = BWD_SMALL_SPEC_WG, local_size_y = 1, local_size_z = 1) in;

layout(std430, binding = BWD_FOLD_BINDING_IN) readonly buffer In { float terms[]; };
layout(std430, binding = BWD_FOLD_BINDING_OUT) buffer Out { float out_sums[]; };
layout(std430, binding = BWD_FOLD_BINDING_VERDICT) buffer Verdict { uint verdict[]; };

layout(push_constant) uniform Push { bwd_fold_push pc; };

void main() {
    const uint m = (gl_WorkGroupID.x + pc.group_x) * gl_WorkGroupSize.x + gl_LocalInvocationID.x;
    if (m >= pc.outputs) return;
    // m's coordinates, and how many terms each broadcast dimension contributes
    const uint os = m % pc.ms, ol = (m / pc.ms) % pc.ml, oh = (m / (pc.ms * pc.ml)) % pc.mh;
    const uint ob = m / (pc.ms * pc.ml * pc.mh);
    const uint cs = pc.ms == 1u ? pc.s : 1u, cl = pc.ml == 1u ? pc.l : 1u, ch = pc.mh == 1u ? pc.h : 1u;
    float acc = pc.resume != 0u ? out_sums[m] : 0.0;
    for (uint n = pc.first; n < pc.stop; ++n) {
        const uint ns = n % cs, nl = (n / cs) % cl, nh = (n / (cs * cl)) % ch, nb = n / (cs * cl * ch);
        const uint b = pc.mb == 1u ? nb : ob, h = pc.mh == 1u ? nh : oh;
        const uint i = pc.ml == 1u ? nl : ol, j = pc.ms == 1u ? ns : os;
        acc += terms[((b * pc.h + h) * pc.l + i) * pc.s + j];
    }
    out_sums[m] = acc;
    if (isnan(acc) || isinf(acc)) atomicOr(verdict[0], BWD_FLAG_NONFINITE_GRADIENT);
}
