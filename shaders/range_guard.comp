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
// One invocation per (rows_per_invocation consecutive rows of one batch, chunk of at most CHUNK
// columns of one head's Q, K or V); the host keeps rows_per_invocation x (2 x CHUNK + 2) under
// llvmpipe's 65,535 loop iterations per invocation, for any sequence length and head width.
// Heads wider than CHUNK are covered by several chunks; the host multiplies the norm bound by
// their number. Each invocation folds its rows into one value, and with QKV_SUBGROUP a subgroup
// folds its invocations' values before one of them does the atomics: every invocation writing
// the same word makes the atomics, not the loads, the guard's cost on a CPU device.
#include "precision.glsl"
#ifdef QKV_SUBGROUP
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_basic : require
#endif

#include "contract/range_guard.h"

layout(local_size_x = RANGE_GUARD_WORKGROUP, local_size_y = 1, local_size_z = 1) in;

layout(push_constant) uniform Push { range_guard_push pc; };

layout(std430, binding = RANGE_GUARD_BINDING_QKV) readonly buffer QKV { QKV_T qkv[]; };
// The same buffer four elements at a time, used where VEC4 says every row, head and column offset
// is a multiple of 4: on llvmpipe a load at a lane-varying address is one scalar loop over the
// lanes whatever its width, so a vec4 load costs about a quarter of four float loads.
#ifdef QKV_FP16
#define QKV_T4 f16vec4
#else
#define QKV_T4 vec4
#endif
layout(std430, binding = RANGE_GUARD_BINDING_QKV) readonly buffer QKV4 { QKV_T4 qkv4[]; };
layout(constant_id = RANGE_GUARD_SPEC_VEC4) const uint VEC4 = 0;
// [0] first non-finite index (RANGE_GUARD_NO_INDEX: none), [1..3] unused,
// [RANGE_GUARD_HEADER_WORDS + 3·(batch·heads + head) + {0: Q norm·2^-32, 1: K norm·2^-32, 2: max |V|}]
layout(std430, binding = RANGE_GUARD_BINDING_RESULT) buffer Result { uint result[]; };

void main() {
    const uint invocation = gl_GlobalInvocationID.x + pc.group_x * gl_WorkGroupSize.x;
    const uint batch = gl_WorkGroupID.z + pc.group_z;
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
    const float two_to_minus_32 = 2.3283064365386963e-10;

    float value = 0.0;  // the largest row norm x 2^-32 (Q, K) or the largest |V| of this invocation's rows
    uint first_bad = RANGE_GUARD_NO_INDEX;
    const uint i0 = invocation * pc.rows_per_invocation;
    const uint i1 = min(pc.seq, i0 + pc.rows_per_invocation);
    for (uint i = i0; i < i1; ++i) {
        const uint base = (batch * pc.seq + i) * pc.ld + col0;
        float largest = 0.0;
        if (VEC4 != 0u) {
            for (uint c = begin; c < end; c += 4u) {
                const vec4 v = vec4(qkv4[(base + c) / 4u]);
                const bvec4 bad = bvec4(uvec4(isnan(v)) | uvec4(isinf(v)));
                if (any(bad)) first_bad = min(first_bad, base + c + (bad.x ? 0u : bad.y ? 1u : bad.z ? 2u : 3u));
                const vec4 a = mix(abs(v), vec4(0.0), bad);
                largest = max(largest, max(max(a.x, a.y), max(a.z, a.w)));
            }
        } else {
            for (uint c = begin; c < end; ++c) {
                const float v = float(qkv[base + c]);
                if (isnan(v) || isinf(v)) {
                    first_bad = min(first_bad, base + c);
                } else {
                    largest = max(largest, abs(v));
                }
            }
        }
        float row_value = largest;
        if (kind != 2u && largest >= 1.0e-30) {
            // ||x|| = largest · sqrt(Σ (x / largest)²): every term is at most 1, so nothing overflows.
            const float inv = 1.0 / largest;
            float squares = 0.0;
            if (VEC4 != 0u) {
                for (uint c = begin; c < end; c += 4u) {
                    const vec4 v = vec4(qkv4[(base + c) / 4u]);
                    const vec4 t = mix(v * inv, vec4(0.0), bvec4(uvec4(isnan(v)) | uvec4(isinf(v))));
                    squares += dot(t, t);
                }
            } else {
                for (uint c = begin; c < end; ++c) {
                    const float v = float(qkv[base + c]);
                    if (!(isnan(v) || isinf(v))) {
                        const float t = v * inv;
                        squares += t * t;
                    }
                }
            }
            row_value = (largest * two_to_minus_32) * sqrt(squares);
        } else if (kind != 2u) {  // tiny values: ||x|| <= sqrt(n) · largest (0 where that underflows)
            row_value = (largest * two_to_minus_32) * sqrt(float(end - begin));
        }
        value = max(value, row_value);
    }
    const uint word = RANGE_GUARD_HEADER_WORDS + 3u * (batch * pc.heads + head) + kind;
#ifdef QKV_SUBGROUP
    // Every invocation of the subgroup has the same (batch, head, kind): fold, then one atomic.
    value = subgroupMax(value);
    first_bad = subgroupMin(first_bad);
    if (subgroupElect()) {
        atomicMax(result[word], floatBitsToUint(value));
        if (first_bad != RANGE_GUARD_NO_INDEX) atomicMin(result[0], first_bad);
    }
#else
    if (i0 < i1) atomicMax(result[word], floatBitsToUint(value));
    if (first_bad != RANGE_GUARD_NO_INDEX) atomicMin(result[0], first_bad);
#endif
}
