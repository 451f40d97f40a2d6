#version 450
#extension GL_GOOGLE_include_directive : require
// Stage 1, projection: C = A · B (+ bias), a tiled matrix product.
// Used for Q|K|V = X · [Wq | Wk | Wv] in one pass over X (the three weights side by side), and for
// the output projection concat · Wo + bo. With QKV_FP16 the result is stored as float16 (a K split
// over several dispatches then rounds to float16 once per dispatch).
// The CPU family uses the rows variant of the matrix product (lanes own rows, B is broadcast).
#define QKV_GEMM_CPU_ROWS
#include "precision.glsl"
#include "gemm_core.glsl"

layout(std430, binding = 0) readonly buffer A { float a[]; };
layout(std430, binding = 1) readonly buffer B { float b[]; };
layout(std430, binding = 2) readonly buffer Bias { float bias[]; };
layout(std430, binding = 3) buffer C { QKV_T c[]; };

const uint FLAG_BIAS = 1u;

float load_a(uint base, uint row, uint k) { return a[base + row * pc.a_rs + k]; }
float load_b(uint base, uint k, uint col) { return b[base + k * pc.b_rs + col * pc.b_cs]; }
void store_c(uint base, uint row, uint col, float value) {
    const uint at = base + row * pc.c_rs + col;
    if ((pc.flags & FLAG_ACCUMULATE) != 0u) value += float(c[at]);
    if ((pc.flags & (FLAG_BIAS | FLAG_PARTIAL)) == FLAG_BIAS) value += bias[col];
    c[at] = QKV_TO_T(value);
}
bool tile_is_masked(uint row0, uint col0) { return false; }
uint k_limit(uint row0) { return pc.K; }

void main() { gemm_main(); }
