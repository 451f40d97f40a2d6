#version 450
#extension GL_GOOGLE_include_directive : require
// The device side of the overflow rule (src/kernels/range_rule.hpp) for an sdpa call over device
// tensors, which the host never sees. Rows pass: one invocation per row of q, k and v, over its
// finite elements: the row norm (q, k) or largest |element| (v), folded into its (batch, head)'s
// word by atomicMax of the float's bits (non-negative floats order as their bits do); any NaN or
// Inf raises GUARD_FLAG_INPUT_NONFINITE. Output pass: any non-finite output element raises
// GUARD_FLAG_OUTPUT_NONFINITE. The host reads the words after the call (sdpa_call: check()) and
// applies the same rule, with the same messages, as for host inputs. Every loop runs at most E
// (or Ev) iterations, far below llvmpipe's 65,535.
#include "precision.glsl"
#include "contract/tensor.h"
#include "guard_rows.glsl"

layout(local_size_x = SDPA_GUARD_WORKGROUP, local_size_y = 1, local_size_z = 1) in;
layout(std430, binding = SDPA_GUARD_BINDING_Q) readonly buffer Q { QKV_T q[]; };
layout(std430, binding = SDPA_GUARD_BINDING_K) readonly buffer K { QKV_T k[]; };
layout(std430, binding = SDPA_GUARD_BINDING_V) readonly buffer V { QKV_T v[]; };
layout(std430, binding = SDPA_GUARD_BINDING_OUT) readonly buffer O { float o[]; };
layout(std430, binding = SDPA_GUARD_BINDING_RESULT) buffer Result { uint result[]; };
layout(push_constant) uniform Push { sdpa_guard_push pc; };

QKV_GUARD_ROW_NORM(q_row_norm, q)
QKV_GUARD_ROW_NORM(k_row_norm, k)

void main() {
    const uint i = (gl_WorkGroupID.x + pc.group_x) * SDPA_GUARD_WORKGROUP + gl_LocalInvocationID.x;
    const uint row_count = (pc.pass & GUARD_PASS_ROWS) != 0u ? pc.q_rows + 2u * pc.k_rows : 0u;
    if (i >= row_count) {  // output elements t, t + n, t + 2n, ... (or past the end)
        const uint t = i - row_count;
        const uint n = (pc.out_count + GUARD_OUTPUTS_PER_INVOCATION - 1u) / GUARD_OUTPUTS_PER_INVOCATION;
        if ((pc.pass & GUARD_PASS_OUTPUT) == 0u || t >= n) return;
        bool nonfinite = false;
        for (uint j = 0u; j < GUARD_OUTPUTS_PER_INVOCATION; ++j) {
            const uint e = t + j * n;  // below 32 n <= out_count + 31: no wrap (the host's limit)
            if (e >= pc.out_count) break;
            if (!guard_finite(o[pc.out_off + e])) nonfinite = true;
        }
        if (nonfinite) atomicOr(result[GUARD_WORD_FLAGS], GUARD_FLAG_OUTPUT_NONFINITE);
        return;
    }
    const uint q_heads = pc.q_rows / pc.q_len, kv_heads = pc.k_rows / pc.kv_len;
    bool bad = false;
    float fold = 0.0;
    uint word = 0u;
    if (i < pc.q_rows + pc.k_rows) {  // a row of q or of k: its norm, scaled by its largest element
        const bool is_q = i < pc.q_rows;
        const uint r = is_q ? i : i - pc.q_rows;
        const uint at = is_q ? pc.q_off + r * pc.d : pc.k_off + r * pc.d;
        fold = is_q ? q_row_norm(at, pc.d, bad) : k_row_norm(at, pc.d, bad);
        word = GUARD_HEADER_WORDS + (is_q ? r / pc.q_len : q_heads + r / pc.kv_len);
    } else {  // a row of v: its largest |element|
        const uint r = i - pc.q_rows - pc.k_rows;
        for (uint c = 0u; c < pc.dv; ++c) {
            const float x = float(v[pc.v_off + r * pc.dv + c]);
            if (guard_finite(x)) fold = max(fold, abs(x)); else bad = true;
        }
        word = GUARD_HEADER_WORDS + q_heads + kv_heads + r / pc.kv_len;
    }
    atomicMax(result[word], floatBitsToUint(fold));
    if (bad) atomicOr(result[GUARD_WORD_FLAGS], GUARD_FLAG_INPUT_NONFINITE);
}
