#version 450
#extension GL_GOOGLE_include_directive : require
// texelFetch on textureBuffer: uniform texel buffers as plain images (a sampled image of Dim Buffer is
// invalid SPIR-V, which Mesa 25 warns about)
#extension GL_EXT_samplerless_texture_functions : require
// Stage 4, aggregate: O[b, :, head h columns] = P[b, h] · V_h, the weighted sum of values.
// With a causal mask, a row tile stops at its last row's diagonal: the weights beyond are zero.
// An exact zero weight (a masked key) adds nothing, even where its value is NaN or inf.
// With QKV_GEMM_TEXELS (the cpu family where the device shuffles, src/kernels/gemm_tiles.cpp)
// P and V are read through texel views (RGBA32F; V RGBA16F for fp16), lanes owning rows of P and
// V's texels shared by subgroupShuffle (gemm_core.glsl); the zero-weight rule is then a
// specialization constant the host sets where V may hold NaN or inf.
#ifdef QKV_GEMM_TEXELS
#define QKV_GEMM_CPU_ROWS
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#endif
#include "precision.glsl"
#define QKV_SKIP_ZERO_A
#include "gemm_core.glsl"

#ifdef QKV_GEMM_TEXELS
layout(binding = AGGREGATE_BINDING_P) uniform textureBuffer p_tex;
layout(binding = AGGREGATE_BINDING_QKV) uniform textureBuffer v_tex;
vec4 load_a4(uint texel) { return texelFetch(p_tex, int(texel)); }
vec4 load_b4(uint texel) { return texelFetch(v_tex, int(texel)); }

// The host takes this variant only where a head of V is whole texels (d_v / H % 4 == 0), so
// every row, head offset and column group of O is too: always four columns per store.
layout(std430, binding = AGGREGATE_BINDING_O) buffer O4 { vec4 o4[]; };
layout(constant_id = GEMM_SPEC_STORE) const uint STORE_FLAGS = GEMM_STORE_RUNTIME;

void store_c4(uint base, uint row, uint col, vec4 value) {  // columns col..col+3 of row
    const uint at = (base + row * pc.c_rs + col) / 4u;
    const uint flags = STORE_FLAGS == GEMM_STORE_RUNTIME ? pc.flags : STORE_FLAGS;
    if ((flags & GEMM_FLAG_ACCUMULATE) != 0u) value += o4[at];
    o4[at] = value;
}
#else
layout(std430, binding = AGGREGATE_BINDING_P) readonly buffer P { float p[]; };
layout(std430, binding = AGGREGATE_BINDING_QKV) readonly buffer QKV { QKV_T qkv[]; };
layout(std430, binding = AGGREGATE_BINDING_O) buffer O { float o[]; };

float load_a(uint base, uint row, uint k) { return p[base + row * pc.a_rs + k]; }
float load_b(uint base, uint k, uint col) { return float(qkv[base + k * pc.b_rs + col * pc.b_cs]); }
void store_c(uint base, uint row, uint col, float value) {
    const uint at = base + row * pc.c_rs + col;
    o[at] = (pc.flags & GEMM_FLAG_ACCUMULATE) != 0u ? o[at] + value : value;
}
#endif
bool tile_is_masked(uint row0, uint col0) { return false; }
uint k_limit(uint row0) {  // this dispatch covers keys k_begin .. k_begin + K
    if ((pc.flags & MASK_FLAG_CAUSAL) == 0u) return pc.K;
    const uint stop = row0 + BM;  // keys past the tile's last row have weight 0
    return stop > pc.k_begin ? min(pc.K, stop - pc.k_begin) : 0u;
}

void main() { gemm_main(); }
