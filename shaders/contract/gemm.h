// Contract of the matrix-product family (gemm_core.glsl and its stages: project.comp, scores.comp,
// aggregate.comp) with the host (src/kernels/stages.cpp, src/run/run_attention.cpp). See common.h.
#ifndef QKV_CONTRACT_GEMM_H
#define QKV_CONTRACT_GEMM_H
#include "common.h"
#ifdef __cplusplus
#include <cstddef>  // offsetof
#endif
#include "mask.h"

QKV_CONTRACT_BEGIN
/// Push constants of every matrix-product stage: C (M x N) = A (M x K) · B (K x N), per
/// (batch, head) grid z = batch · heads + head.
struct gemm_push {
    uint group_x, group_y, group_z;  // workgroup offsets when a dispatch is split (maxComputeWorkGroupCount)
    uint M, N, K;                    // C is M x N, the inner dimension (of this dispatch) is K
    uint heads;                      // z = batch * heads + head
    uint a_bs, a_hs, a_rs;           // A strides: per batch, per head, per row (columns contiguous)
    uint b_bs, b_hs, b_rs, b_cs;     // B strides: per batch, per head, per row, per column
    uint c_bs, c_hs, c_rs;           // C strides
    uint a_off, b_off, c_off;        // element offsets of the first A, B, C element (of this K chunk)
    float scale;                     // scores: the factor applied to every dot product
    uint flags;                      // stage-specific (below and mask.h), plus the two GEMM_FLAG_s
    uint mask_bs;                    // boolean mask batch stride (0: one mask for every batch element)
    uint add_bs;                     // additive mask batch stride (likewise)
    uint k_begin;                    // where this dispatch's K chunk starts in the whole K
};

// Flags of every stage, set by the host's K split (record_gemm).
QKV_CONST uint GEMM_FLAG_ACCUMULATE = 256u;  // C holds the sum over earlier K chunks: add to it
QKV_CONST uint GEMM_FLAG_PARTIAL = 512u;     // later K chunks follow: store the raw sum

// project.comp: C = A · B (+ bias)
QKV_CONST uint PROJECT_FLAG_BIAS = 1u;  // add bias[col] (once, with the last K chunk)
QKV_CONST uint PROJECT_BINDING_A = 0u;
QKV_CONST uint PROJECT_BINDING_B = 1u;
QKV_CONST uint PROJECT_BINDING_BIAS = 2u;
QKV_CONST uint PROJECT_BINDING_C = 3u;

// scores.comp: S = Q · Kᵀ · scale (+ masks); flags: MASK_FLAG_CAUSAL, MASK_FLAG_BOOLEAN, MASK_FLAG_ADDITIVE
QKV_CONST uint SCORES_BINDING_QKV = 0u;
QKV_CONST uint SCORES_BINDING_MASK_BITS = 1u;
QKV_CONST uint SCORES_BINDING_ADDITIVE = 2u;
QKV_CONST uint SCORES_BINDING_S = 3u;

// aggregate.comp: O = P · V; flags: MASK_FLAG_CAUSAL (a row tile stops at its diagonal)
QKV_CONST uint AGGREGATE_BINDING_P = 0u;
QKV_CONST uint AGGREGATE_BINDING_QKV = 1u;
QKV_CONST uint AGGREGATE_BINDING_O = 2u;

// Specialization constants: the workgroup size, then the tile shape (src/kernels/stages.hpp, gemm_tiles).
QKV_CONST uint GEMM_SPEC_WORKGROUP = 0u;
QKV_CONST uint GEMM_SPEC_BM = 1u;
QKV_CONST uint GEMM_SPEC_BN = 2u;
QKV_CONST uint GEMM_SPEC_BK = 3u;
QKV_CONST uint GEMM_SPEC_TM = 4u;
QKV_CONST uint GEMM_SPEC_TN = 5u;
QKV_CONST uint GEMM_SPEC_COUNT = 6u;
// The texel variants only (project_cpu_tx*, scores_cpu_tx, aggregate_cpu_tx): facts of one
// dispatch known to the host, as constants, so that llvmpipe compiles no branch for them. A
// branch, even one every lane takes the same way, puts the stores under an execution mask, and a
// masked store at lane-varying addresses costs a load, a select and a store per lane instead of
// a store.
QKV_CONST uint GEMM_SPEC_EXACT = 6u;      // 1: every workgroup's tile lies inside C (M % BM == 0, N % BN == 0)
QKV_CONST uint GEMM_SPEC_STORE = 7u;      // GEMM_STORE_RUNTIME, or this dispatch's flags (stage's, ACCUMULATE, PARTIAL)
QKV_CONST uint GEMM_SPEC_SKIP_ZERO = 8u;  // 1: a zero of A adds nothing, not 0·NaN (aggregation with non-finite V)
QKV_CONST uint GEMM_SPEC_VEC_STORE = 9u;  // scores_cpu_tx: 1 where C's rows and N are multiples of 4 (vec4 stores)
QKV_CONST uint GEMM_SPEC_TEXEL_COUNT = 10u;
QKV_CONST uint GEMM_STORE_RUNTIME = 0xffffffffu;  // the store reads pc.flags

/// The specialization constants of the plain variants (GEMM_SPEC_WORKGROUP .. GEMM_SPEC_TN) ...
struct gemm_spec {
    uint workgroup, bm, bn, bk, tm, tn;
};
/// ... and of the texel variants, which add GEMM_SPEC_EXACT .. GEMM_SPEC_VEC_STORE.
struct gemm_texel_spec {
    uint workgroup, bm, bn, bk, tm, tn;
    uint exact, store, skip_zero, vec_store;
};
QKV_CONTRACT_END

QKV_CONTRACT_CHECK(sizeof(qkv::contract::gemm_push) == 25u * 4u)
QKV_CONTRACT_CHECK(offsetof(qkv::contract::gemm_push, group_x) == 0u &&
                   offsetof(qkv::contract::gemm_push, group_z) == 8u)
QKV_CONTRACT_CHECK(offsetof(qkv::contract::gemm_push, scale) == 20u * 4u &&
                   offsetof(qkv::contract::gemm_push, k_begin) == 24u * 4u)
QKV_CONTRACT_CHECK(sizeof(qkv::contract::gemm_push) <= qkv::contract::PUSH_CONSTANT_BYTES_GUARANTEED)
QKV_CONTRACT_CHECK(sizeof(qkv::contract::gemm_spec) == qkv::contract::GEMM_SPEC_COUNT * 4u &&
                   offsetof(qkv::contract::gemm_spec, tn) == qkv::contract::GEMM_SPEC_TN * 4u)
QKV_CONTRACT_CHECK(sizeof(qkv::contract::gemm_texel_spec) == qkv::contract::GEMM_SPEC_TEXEL_COUNT * 4u &&
                   offsetof(qkv::contract::gemm_texel_spec, bm) == qkv::contract::GEMM_SPEC_BM * 4u &&
                   offsetof(qkv::contract::gemm_texel_spec, exact) == qkv::contract::GEMM_SPEC_EXACT * 4u &&
                   offsetof(qkv::contract::gemm_texel_spec, store) == qkv::contract::GEMM_SPEC_STORE * 4u &&
                   offsetof(qkv::contract::gemm_texel_spec, skip_zero) == qkv::contract::GEMM_SPEC_SKIP_ZERO * 4u &&
                   offsetof(qkv::contract::gemm_texel_spec, vec_store) == qkv::contract::GEMM_SPEC_VEC_STORE * 4u)

#endif
