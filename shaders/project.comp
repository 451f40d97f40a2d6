#version 450
#extension GL_GOOGLE_include_directive : require
// texelFetch on textureBuffer: uniform texel buffers as plain images (a sampled image of Dim Buffer is
// invalid SPIR-V, which Mesa 25 warns about)
#extension GL_EXT_samplerless_texture_functions : require
// Stage 1, projection: C = A · B (+ bias), a tiled matrix product.
// Used for Q|K|V = X · [Wq | Wk | Wv] in one pass over X (the three weights side by side), and for
// the output projection concat · Wo + bo. With QKV_FP16 the result is stored as float16 (a K split
// over several dispatches then rounds to float16 once per dispatch).
// The CPU family uses the rows variant of the matrix product (lanes own rows, B is broadcast);
// with QKV_GEMM_TEXELS it reads A and B through RGBA32F uniform texel buffers, with QKV_SHUFFLE
// as well it shares B's texels across the subgroup (gemm_core.glsl), and with QKV_WIDE_STORE it
// stores eight columns at once.
#define QKV_GEMM_CPU_ROWS
#ifdef QKV_SHUFFLE
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#endif
#if defined(QKV_WIDE_STORE) && !defined(QKV_FP16)
#extension GL_ARB_gpu_shader_int64 : require
#endif
#include "precision.glsl"
#include "gemm_core.glsl"

#ifdef QKV_GEMM_TEXELS
// RGBA32F views: texel t holds elements 4t..4t+3 (the host keeps every offset and row stride a
// multiple of 4, contract/gemm.h).
layout(binding = PROJECT_BINDING_A) uniform textureBuffer a_tex;
layout(binding = PROJECT_BINDING_B) uniform textureBuffer b_tex;
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
layout(constant_id = GEMM_SPEC_STORE) const uint STORE_FLAGS = GEMM_STORE_RUNTIME;

vec4 bias4(uint col) { return vec4(bias[col], bias[col + 1u], bias[col + 2u], bias[col + 3u]); }

#ifdef QKV_WIDE_STORE
// Eight columns per store (the host keeps C's row stride, offset, N and the tile's columns
// multiples of 8): each store at a lane-varying address is a loop over the lanes on lavapipe, and
// its cost is mostly the loop's, so halving the stores again saves about a tenth of the
// projection at N = 4096, d = 64. A store has at most four components: four 64-bit integers
// holding two floats each (shaderInt64), or for float16 four 32-bit integers of two halves each.
#ifdef QKV_FP16
layout(std430, binding = PROJECT_BINDING_C) buffer C { uvec4 c8[]; };
void unpack8(uvec4 w, out vec4 lo, out vec4 hi) {
    lo = vec4(unpackHalf2x16(w.x), unpackHalf2x16(w.y));
    hi = vec4(unpackHalf2x16(w.z), unpackHalf2x16(w.w));
}
uvec4 pack8(vec4 lo, vec4 hi) {
    return uvec4(packHalf2x16(lo.xy), packHalf2x16(lo.zw), packHalf2x16(hi.xy), packHalf2x16(hi.zw));
}
#else
layout(std430, binding = PROJECT_BINDING_C) buffer C { u64vec4 c8[]; };
void unpack8(u64vec4 w, out vec4 lo, out vec4 hi) {
    lo = vec4(uintBitsToFloat(unpackUint2x32(w.x)), uintBitsToFloat(unpackUint2x32(w.y)));
    hi = vec4(uintBitsToFloat(unpackUint2x32(w.z)), uintBitsToFloat(unpackUint2x32(w.w)));
}
u64vec4 pack8(vec4 lo, vec4 hi) {
    return u64vec4(packUint2x32(floatBitsToUint(lo.xy)), packUint2x32(floatBitsToUint(lo.zw)),
                   packUint2x32(floatBitsToUint(hi.xy)), packUint2x32(floatBitsToUint(hi.zw)));
}
#endif

void store_c8(uint base, uint row, uint col, vec4 lo, vec4 hi) {  // columns col..col+7 of row
    const uint at = (base + row * pc.c_rs + col) / 8u;
    const uint flags = STORE_FLAGS == GEMM_STORE_RUNTIME ? pc.flags : STORE_FLAGS;
    if ((flags & GEMM_FLAG_ACCUMULATE) != 0u) {
        vec4 old_lo, old_hi;
        unpack8(c8[at], old_lo, old_hi);
        lo += old_lo;
        hi += old_hi;
    }
    if ((flags & (PROJECT_FLAG_BIAS | GEMM_FLAG_PARTIAL)) == PROJECT_FLAG_BIAS) {
        lo += bias4(col);
        hi += bias4(col + 4u);
    }
    c8[at] = pack8(lo, hi);
}
#else
layout(std430, binding = PROJECT_BINDING_C) buffer C { QKV_T4 c4[]; };

void store_c4(uint base, uint row, uint col, vec4 value) {
    const uint at = (base + row * pc.c_rs + col) / 4u;
    const uint flags = STORE_FLAGS == GEMM_STORE_RUNTIME ? pc.flags : STORE_FLAGS;
    if ((flags & GEMM_FLAG_ACCUMULATE) != 0u) value += vec4(c4[at]);
    if ((flags & (PROJECT_FLAG_BIAS | GEMM_FLAG_PARTIAL)) == PROJECT_FLAG_BIAS) value += bias4(col);
    c4[at] = QKV_T4(value);
}
#endif
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
