#version 450
#extension GL_GOOGLE_include_directive : require
// Stage 4, aggregate: O[b, :, head h columns] = P[b, h] · V_h, the weighted sum of values.
// With a causal mask, a row tile stops at its last row's diagonal: the weights beyond are zero.
#include "precision.glsl"
#define QKV_SKIP_ZERO_A
#include "gemm_core.glsl"

layout(std430, binding = AGGREGATE_BINDING_P) readonly buffer P { float p[]; };
layout(std430, binding = AGGREGATE_BINDING_QKV) readonly buffer QKV { QKV_T qkv[]; };
layout(std430, binding = AGGREGATE_BINDING_O) buffer O { float o[]; };

float load_a(uint base, uint row, uint k) { return p[base + row * pc.a_rs + k]; }
float load_b(uint base, uint k, uint col) { return float(qkv[base + k * pc.b_rs + col * pc.b_cs]); }
void store_c(uint base, uint row, uint col, float value) {
    const uint at = base + row * pc.c_rs + col;
    o[at] = (pc.flags & GEMM_FLAG_ACCUMULATE) != 0u ? o[at] + value : value;
}
bool tile_is_masked(uint row0, uint col0) { return false; }
uint k_limit(uint row0) {  // this dispatch covers keys k_begin .. k_begin + K
    if ((pc.flags & MASK_FLAG_CAUSAL) == 0u) return pc.K;
    const uint stop = row0 + BM;  // keys past the tile's last row have weight 0
    return stop > pc.k_begin ? min(pc.K, stop - pc.k_begin) : 0u;
}

void main() { gemm_main(); }
