#version 450
// Configure-time probe (cmake/qkv_shaders.cmake): whether a glslang compiles, and a spirv-val
// validates, what the cooperative-matrix kernels use: GL_KHR_cooperative_matrix over float16
// operands with a float32 accumulator, loads and stores in shared memory and storage buffers.
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_shader_16bit_storage : require
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint M = 16;
layout(std430, binding = 0) readonly buffer A { float16_t a[]; };
layout(std430, binding = 1) writeonly buffer C { float c[]; };
shared float16_t b_tile[M * M];
void main() {
    coopmat<float16_t, gl_ScopeSubgroup, M, M, gl_MatrixUseA> x;
    coopmat<float16_t, gl_ScopeSubgroup, M, M, gl_MatrixUseB> y;
    coopmat<float, gl_ScopeSubgroup, M, M, gl_MatrixUseAccumulator> z =
        coopmat<float, gl_ScopeSubgroup, M, M, gl_MatrixUseAccumulator>(0.0);
    coopMatLoad(x, a, 0, M, gl_CooperativeMatrixLayoutRowMajor);
    coopMatLoad(y, b_tile, 0, M, gl_CooperativeMatrixLayoutColumnMajor);
    z = coopMatMulAdd(x, y, z);
    coopMatStore(z, c, 0, M, gl_CooperativeMatrixLayoutRowMajor);
}
