#version 450
#extension GL_GOOGLE_include_directive : require
// Stage 2, scores: S[b, h] = Q_h · K_hᵀ · scale (+ additive mask), masked entries = -inf.
// Q and K are column slices of the projected Q|K|V rows (A and B offsets and strides in push
// constants). Masks: causal (j > i), boolean (bit-packed, 1 = may attend), additive (float).
// Row tiles entirely above the diagonal of a causal mask are not computed, only filled with -inf.
#include "precision.glsl"
#include "gemm_core.glsl"

layout(std430, binding = SCORES_BINDING_QKV) readonly buffer QKV { QKV_T qkv[]; };
layout(std430, binding = SCORES_BINDING_MASK_BITS) readonly buffer MaskBits { uint mask_bits[]; };
layout(std430, binding = SCORES_BINDING_ADDITIVE) readonly buffer Additive { float additive[]; };
layout(std430, binding = SCORES_BINDING_S) buffer S { float s[]; };

float load_a(uint base, uint row, uint k) { return float(qkv[base + row * pc.a_rs + k]); }
float load_b(uint base, uint k, uint col) { return float(qkv[base + k * pc.b_rs + col * pc.b_cs]); }

void store_c(uint base, uint row, uint col, float value) {
    const uint at = base + row * pc.c_rs + col;
    if ((pc.flags & GEMM_FLAG_ACCUMULATE) != 0u) value += s[at];
    if ((pc.flags & GEMM_FLAG_PARTIAL) != 0u) {  // more of the dot product follows: the raw sum
        s[at] = value;
        return;
    }
    const uint batch = (gl_WorkGroupID.z + pc.group_z) / pc.heads;
    const uint m = row * pc.N + col;  // index into a seq x seq mask
    float score = value * pc.scale;
    if ((pc.flags & MASK_FLAG_ADDITIVE) != 0u) score += additive[batch * pc.add_bs + m];
    bool allowed = true;
    if ((pc.flags & MASK_FLAG_CAUSAL) != 0u && col > row) allowed = false;
    if ((pc.flags & MASK_FLAG_BOOLEAN) != 0u) {
        const uint bit = batch * pc.mask_bs + m;
        if (((mask_bits[bit >> 5] >> (bit & 31u)) & 1u) == 0u) allowed = false;
    }
    s[at] = allowed ? score : uintBitsToFloat(0xff800000u);  // -inf
}

bool tile_is_masked(uint row0, uint col0) {
    return (pc.flags & MASK_FLAG_CAUSAL) != 0u && col0 > row0 + BM - 1u;
}
uint k_limit(uint row0) { return pc.K; }

void main() { gemm_main(); }
