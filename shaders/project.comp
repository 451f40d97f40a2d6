#version 450
#extension GL_GOOGLE_include_directive : require
// Stage 1, projection: C = A · B (+ bias), a tiled matrix product.
// Used for Q|K|V = X · [Wq | Wk | Wv] in one pass over X (the three weights side by side), and for
// the output projection concat · Wo + bo. With QKV_FP16 the result is stored as float16 (a K split
// over several dispatches then rounds to float16 once per dispatch).
// The CPU family uses the rows variant of the matrix product (lanes own rows, B is broadcast);
// with QKV_GEMM_TEXELS it reads A and B through RGBA32F uniform texel buffers.
#define QKV_GEMM_CPU_ROWS
#include "precision.glsl"
#include "gemm_core.glsl"

#ifdef QKV_GEMM_TEXELS
// RGBA32F views: texel t holds elements 4t..4t+3 (the host keeps every offset and row stride a
// multiple of 4, contract/gemm.h).
layout(binding = PROJECT_BINDING_A) uniform samplerBuffer a_tex;
layout(binding = PROJECT_BINDING_B) uniform samplerBuffer b_tex;
vec4 load_a4(uint texel) { return texelFetch(a_tex, int(texel)); }
vec4 load_b4(uint texel) { return texelFetch(b_tex, int(texel)); }
#else
layout(std430, binding = PROJECT_BINDING_A) readonly buffer A { float a[]; };
layout(std430, binding = PROJECT_BINDING_B) readonly buffer B { float b[]; };

float load_a(uint base, uint row, uint k) { return a[base + row * pc.a_rs + k]; }
float load_b(uint base, uint k, uint col) { return b[base + k * pc.b_rs + col * pc.b_cs]; }
#endif
layout(std430, binding = PROJECT_BINDING_BIAS) readonly buffer Bias { float bias[]; };
#ifdef QKV_GEMM_TEXELS
// Four columns per store (C's rows and offset are whole groups of 4 here): a store at a
// lane-varying address is one scalar loop over the lanes on lavapipe, so a vec4 store costs a
// quarter of four float stores.
#ifdef QKV_FP16
#define QKV_T4 f16vec4
#else
#define QKV_T4 vec4
#endif
layout(std430, binding = PROJECT_BINDING_C) buffer C { QKV_T4 c4[]; };

layout(constant_id = GEMM_SPEC_STORE) const uint STORE_FLAGS = GEMM_STORE_RUNTIME;

void store_c4(uint base, uint row, uint col, vec4 value) {
    const uint at = (base + row * pc.c_rs + col) / 4u;
    const uint flags = STORE_FLAGS == GEMM_STORE_RUNTIME ? pc.flags : STORE_FLAGS;
    if ((flags & GEMM_FLAG_ACCUMULATE) != 0u) value += vec4(c4[at]);
    if ((flags & (PROJECT_FLAG_BIAS | GEMM_FLAG_PARTIAL)) == PROJECT_FLAG_BIAS)
        value += vec4(bias[col], bias[col + 1u], bias[col + 2u], bias[col + 3u]);
    c4[at] = QKV_T4(value);
}
#else
layout(std430, binding = PROJECT_BINDING_C) buffer C { QKV_T c[]; };

void store_c(uint base, uint row, uint col, float value) {
    const uint at = base + row * pc.c_rs + col;
    if ((pc.flags & GEMM_FLAG_ACCUMULATE) != 0u) value += float(c[at]);
    if ((pc.flags & (PROJECT_FLAG_BIAS | GEMM_FLAG_PARTIAL)) == PROJECT_FLAG_BIAS) value += bias[col];
    c[at] = QKV_TO_T(value);
}
#endif
bool tile_is_masked(uint row0, uint col0) { return false; }
uint k_limit(uint row0) { return pc.K; }

void main() { gemm_main(); }
