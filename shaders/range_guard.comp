#version 450
#extension GL_GOOGLE_include_directive : require
// Range guard, between the projection and the attention: reads the projected Q|K|V of every
// (batch, head) and reports what the attention kernels need to know to stay finite.
//   - the first element that is not finite (a finite input made inf or NaN by the projection,
//     or a value beyond 65,504 stored as float16), as an index into Q|K|V (atomicMin);
//   - per (batch, head): the largest Euclidean norm of a Q row and of a K row, each times 2^-32
//     so that it cannot overflow, and the largest |V| (atomicMax on the bits of non-negative
//     floats, which order like the floats). The host turns these into a bound on every score
//     and on the value accumulator (src/kernels/range_guard.cpp).
// Non-finite elements are left out of the maxima: where the inputs themselves hold NaN or inf
// the host ignores the first flag, and NaN propagates as documented.
//
// One invocation per (row, chunk of at most CHUNK columns of one head's Q, K or V): the two
// loops below run at most 2 x CHUNK iterations, under llvmpipe's 65,535 per invocation, for any
// sequence length and head width. Heads wider than CHUNK are covered by several chunks; the host
// multiplies the norm bound by their number.
#include "precision.glsl"

#include "contract/range_guard.h"

layout(local_size_x = RANGE_GUARD_WORKGROUP, local_size_y = 1, local_size_z = 1) in;

layout(push_constant) uniform Push { range_guard_push pc; };

layout(std430, binding = RANGE_GUARD_BINDING_QKV) readonly buffer QKV { QKV_T qkv[]; };
// [0] first non-finite index (RANGE_GUARD_NO_INDEX: none), [1..3] unused,
// [RANGE_GUARD_HEADER_WORDS + 3·(batch·heads + head) + {0: Q norm·2^-32, 1: K norm·2^-32, 2: max |V|}]
layout(std430, binding = RANGE_GUARD_BINDING_RESULT) buffer Result { uint result[]; };

void main() {
    const uint row = gl_GlobalInvocationID.x + pc.group_x * gl_WorkGroupSize.x;
    if (row >= pc.rows) return;
    const uint per_head = 2u * pc.chunks_k + pc.chunks_v;
    const uint segment = gl_WorkGroupID.y + pc.group_y;
    const uint head = segment / per_head;
    uint part = segment % per_head;
    uint kind, col0, width;
    if (part < pc.chunks_k) {
        kind = 0u;
        col0 = head * pc.dh;
        width = pc.dh;
    } else if (part < 2u * pc.chunks_k) {
        kind = 1u;
        part -= pc.chunks_k;
        col0 = pc.d_k + head * pc.dh;
        width = pc.dh;
    } else {
        kind = 2u;
        part -= 2u * pc.chunks_k;
        col0 = 2u * pc.d_k + head * pc.dvh;
        width = pc.dvh;
    }
    const uint begin = part * pc.chunk;
    const uint end = min(width, begin + pc.chunk);
    const uint base = row * pc.ld + col0;

    float largest = 0.0;
    uint first_bad = RANGE_GUARD_NO_INDEX;
    for (uint c = begin; c < end; ++c) {
        const float v = float(qkv[base + c]);
        if (isnan(v) || isinf(v)) {
            first_bad = min(first_bad, base + c);
        } else {
            largest = max(largest, abs(v));
        }
    }
    const float two_to_minus_32 = 2.3283064365386963e-10;
    float value = largest;
    if (kind != 2u && largest >= 1.0e-30) {
        // ||x|| = largest · sqrt(Σ (x / largest)²): every term is at most 1, so nothing overflows.
        const float inv = 1.0 / largest;
        float squares = 0.0;
        for (uint c = begin; c < end; ++c) {
            const float v = float(qkv[base + c]);
            if (!(isnan(v) || isinf(v))) {
                const float t = v * inv;
                squares += t * t;
            }
        }
        value = (largest * two_to_minus_32) * sqrt(squares);
    } else if (kind != 2u) {  // tiny values: ||x|| <= sqrt(n) · largest (0 where that underflows)
        value = (largest * two_to_minus_32) * sqrt(float(end - begin));
    }
    const uint batch = row / pc.seq;
    atomicMax(result[RANGE_GUARD_HEADER_WORDS + 3u * (batch * pc.heads + head) + kind], floatBitsToUint(value));
    if (first_bad != RANGE_GUARD_NO_INDEX) atomicMin(result[0], first_bad);
}
