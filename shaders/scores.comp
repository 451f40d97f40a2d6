#version 450
#extension GL_GOOGLE_include_directive : require
// texelFetch on textureBuffer: uniform texel buffers as plain images (a sampled image of Dim Buffer is
// invalid SPIR-V, which Mesa 25 warns about)
#extension GL_EXT_samplerless_texture_functions : require
// Stage 2, scores: S[b, h] = Q_h · K_hᵀ · scale (+ additive mask), masked entries = -inf.
// Q and K are column slices of the projected Q|K|V rows (A and B offsets and strides in push
// constants). Masks: causal (j > i), boolean (bit-packed, 1 = may attend), additive (float).
// Row tiles entirely above the diagonal of a causal mask are not computed, only filled with -inf.
// With QKV_GEMM_TEXELS (the cpu family where the device shuffles, src/kernels/gemm_tiles.cpp)
// Q and K are read through one texel view of Q|K|V (RGBA32F, or RGBA16F for fp16), lanes owning
// query rows and the keys' texels shared by subgroupShuffle (gemm_core.glsl, QKV_GEMM_B_KEYS).
#ifdef QKV_GEMM_TEXELS
#define QKV_GEMM_CPU_ROWS
#define QKV_GEMM_B_KEYS
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#endif
#include "precision.glsl"
#include "gemm_core.glsl"

layout(std430, binding = SCORES_BINDING_MASK_BITS) readonly buffer MaskBits { uint mask_bits[]; };
layout(std430, binding = SCORES_BINDING_ADDITIVE) readonly buffer Additive { float additive[]; };
layout(std430, binding = SCORES_BINDING_S) buffer S { float s[]; };

#ifdef QKV_GEMM_TEXELS
layout(binding = SCORES_BINDING_QKV) uniform textureBuffer qkv_tex;
vec4 load_a4(uint texel) { return texelFetch(qkv_tex, int(texel)); }
vec4 load_b4(uint texel) { return texelFetch(qkv_tex, int(texel)); }
#else
layout(std430, binding = SCORES_BINDING_QKV) readonly buffer QKV { QKV_T qkv[]; };
float load_a(uint base, uint row, uint k) { return float(qkv[base + row * pc.a_rs + k]); }
float load_b(uint base, uint k, uint col) { return float(qkv[base + k * pc.b_rs + col * pc.b_cs]); }
#endif

/// The score of (row, col) from its dot product, as `flags` say: scaled, masked, the mask added.
float score_of(float value, uint row, uint col, uint flags) {
    const uint batch = (gl_WorkGroupID.z + pc.group_z) / pc.heads;
    const uint m = row * pc.N + min(col, pc.N - 1u);  // index into a seq x seq mask (col past N: never stored)
    float score = value * pc.scale;
    if ((flags & MASK_FLAG_ADDITIVE) != 0u) score += additive[batch * pc.add_bs + m];
    bool allowed = true;
    if ((flags & MASK_FLAG_CAUSAL) != 0u && col > row) allowed = false;
    if ((flags & MASK_FLAG_BOOLEAN) != 0u) {
        const uint bit = batch * pc.mask_bs + m;
        if (((mask_bits[bit >> 5] >> (bit & 31u)) & 1u) == 0u) allowed = false;
    }
    return allowed ? score : uintBitsToFloat(0xff800000u);  // -inf
}

#ifdef QKV_GEMM_TEXELS
layout(std430, binding = SCORES_BINDING_S) buffer S4 { vec4 s4[]; };
layout(constant_id = GEMM_SPEC_STORE) const uint STORE_FLAGS = GEMM_STORE_RUNTIME;
layout(constant_id = GEMM_SPEC_VEC_STORE) const uint VEC_STORE = 0;

void store_c4(uint base, uint row, uint col, vec4 value) {  // columns col..col+3 of row (those < N)
    const uint at = base + row * pc.c_rs + col;
    const uint flags = STORE_FLAGS == GEMM_STORE_RUNTIME ? pc.flags : STORE_FLAGS;
    if ((flags & GEMM_FLAG_ACCUMULATE) != 0u) {
        if (VEC_STORE != 0u) {
            value += s4[at / 4u];
        } else {
            [[unroll]] for (uint e = 0; e < 4; ++e)
                if (col + e < pc.N) value[e] += s[at + e];
        }
    }
    if ((flags & GEMM_FLAG_PARTIAL) == 0u)  // the whole dot product: now the score
        [[unroll]] for (uint e = 0; e < 4; ++e) value[e] = score_of(value[e], row, col + e, flags);
    if (VEC_STORE != 0u) {
        s4[at / 4u] = value;
    } else {
        [[unroll]] for (uint e = 0; e < 4; ++e)
            if (col + e < pc.N) s[at + e] = value[e];
    }
}
#else
void store_c(uint base, uint row, uint col, float value) {
    const uint at = base + row * pc.c_rs + col;
    if ((pc.flags & GEMM_FLAG_ACCUMULATE) != 0u) value += s[at];
    if ((pc.flags & GEMM_FLAG_PARTIAL) != 0u) {  // more of the dot product follows: the raw sum
        s[at] = value;
        return;
    }
    s[at] = score_of(value, row, col, pc.flags);
}
#endif

bool tile_is_masked(uint row0, uint col0) {
    return (pc.flags & MASK_FLAG_CAUSAL) != 0u && col0 > row0 + BM - 1u;
}
uint k_limit(uint row0) { return pc.K; }

void main() { gemm_main(); }
