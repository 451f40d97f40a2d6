// Host–shader contract of the split-S decode family (flash-decoding): shaders/sdpa_decode.comp
// (cpu and gpu variants) and shaders/sdpa_merge.comp, recorded by src/kernels/sdpa_decode.cpp.
//
// The G = Hq / Hkv query heads × L query rows that read one K/V head form R = G·L "rows" of one
// group z = (batch, kv head); row r is query head kv_head·G + r / L, query row r % L. Keys
// [0, S) are cut into P chunks of `chunk` keys; workgroup (row block, chunk, z) writes one partial
// (m, l, acc[Ev]) per row, and the merge combines a row's P partials in the order 0..P−1. Only the
// keys [kv_first, kv_end) that some row may see (the causal rule and the window) are cut into
// chunks: chunk p covers kv_first + p·chunk onwards. The score rules beyond the masks (softcap,
// ALiBi, the window) are applied by the decode kernel, sinks and the log-sum-exp by the merge
// (contract/score.h, shaders/score_rules.glsl).
//
// K and V are texels (RGBA32F or RGBA16F views) or, with QKV_KV_BLOCKS, ggml's blocks of 32
// values (DECODE_KV_Q8_0: 34 bytes, DECODE_KV_Q4_0: 18 bytes; qkv/runtime/element_type.hpp) in
// storage buffers, row (z, key) at byte (z·kv_stride + key)·(E / 32)·block bytes (V: Ev).
#ifndef QKV_CONTRACT_DECODE_H
#define QKV_CONTRACT_DECODE_H

#include "common.h"
#ifdef __cplusplus
#include <cstddef>  // offsetof
#endif
#include "mask.h"

QKV_CONTRACT_BEGIN
struct decode_push {
    uint group_x, group_y, group_z;  // workgroup offset of a split dispatch (executor)
    uint rows;                       // R = G·L rows per group
    uint q_len;                      // L
    uint kv_len;                     // S
    uint kv_stride;                  // rows per group in the K/V texel buffers (the cache capacity)
    uint chunk;                      // keys per chunk (a multiple of the keys per step)
    uint chunks;                     // P
    uint row_blocks;                 // row blocks per group
    float scale;
    int causal_offset;                    // off' (contract/score.h): key j is visible from row i when j <= i + off'
    uint q_heads, kv_heads;               // Hq, Hkv (z = batch·Hkv + kv head)
    uint mask_b, mask_h, mask_i, mask_j;  // broadcast element strides of the masks
    float v_scale;                        // the values accumulate multiplied by this power of two
    uint kv_first, kv_end;                // the keys some row may see; the chunks cover them
};

struct decode_merge_push {
    uint group_x, group_y, group_z;
    uint rows, q_len, chunks, dv, dv_stride;  // dv_stride: floats per partial accumulator (4·ceil(Ev/4))
    uint groups;                              // B·Hkv
    uint q_heads;                             // Hq (output row (b·Hq + h)·L + i)
    int causal_offset;                        // as decode_push's (ALiBi's part of the lse and sinks)
    uint kv_len;                              // S
};

/// Specialization constants of sdpa_decode.comp: the struct the host fills (decode_plan::spec), and
/// each member's constant_id.
struct decode_spec {
    uint wg;         // invocations per workgroup
    uint rpi;        // cpu: rows per invocation; gpu: rows per workgroup
    uint kps;        // cpu: keys per step (gpu: unused, keys per tile = wg)
    uint e4;         // texels per Q/K row, ceil(E / 4)
    uint ev4;        // texels per V row, ceil(Ev / 4)
    uint masks;      // mask.h's MASK_FLAG_* bits
    uint subgroup;   // gpu: 1 = subgroupMax across the tile, 0 = shared-memory tree
    uint careful;    // DECODE_VALUES_*: whether V may hold NaN or Inf (masked keys add nothing, underflowed
                     // weights keep infinities), or the gate word says
    uint features;   // contract/score.h's SCORE_* rules of the call
    uint kv_format;  // DECODE_KV_TEXELS, or (QKV_KV_BLOCKS variants) DECODE_KV_Q8_0 / DECODE_KV_Q4_0
    uint tb;         // cpu: 0, every texel of a row unrolled (Q and the accumulator in registers); n > 0,
                     // the wide form: loops over E and Ev of n texels an iteration (8 = one block)
    uint guard;      // 1: the workgroups of chunk 0 fold q's row norms into the guard's words (below)
};
QKV_CONST uint DECODE_SPEC_WG = 0u;         // invocations per workgroup
QKV_CONST uint DECODE_SPEC_RPI = 1u;        // cpu: rows per invocation; gpu: rows per workgroup
QKV_CONST uint DECODE_SPEC_KPS = 2u;        // cpu: keys per step (gpu: unused, keys per tile = WG)
QKV_CONST uint DECODE_SPEC_E4 = 3u;         // texels per Q/K row, ceil(E / 4)
QKV_CONST uint DECODE_SPEC_EV4 = 4u;        // texels per V row, ceil(Ev / 4)
QKV_CONST uint DECODE_SPEC_MASKS = 5u;      // mask.h's MASK_FLAG_* bits
QKV_CONST uint DECODE_SPEC_SUBGROUP = 6u;   // gpu: 1 = subgroupMax across the tile, 0 = shared-memory tree
QKV_CONST uint DECODE_SPEC_CAREFUL = 7u;    // 1: V may hold NaN or Inf (shaders/values.glsl)
QKV_CONST uint DECODE_SPEC_FEATURES = 8u;   // contract/score.h's SCORE_* bits
QKV_CONST uint DECODE_SPEC_KV_FORMAT = 9u;  // how K and V are stored (below)
QKV_CONST uint DECODE_SPEC_TB = 10u;        // cpu: texels an iteration of the wide form's loops over E, Ev
QKV_CONST uint DECODE_SPEC_GUARD = 11u;     // 1: the overflow guard's rows pass over q (not QKV_PAGED)
QKV_CONST uint DECODE_SPEC_COUNT = 12u;

// The gpu variant's score loop over E is unrolled up to this many texels and a loop beyond (the
// plan counts its iterations): an unrolled 256 took lavapipe's LLVM more than five minutes to build.
QKV_CONST uint DECODE_GPU_UNROLLED_TEXELS = 32u;

// K/V storage (DECODE_SPEC_KV_FORMAT)
QKV_CONST uint DECODE_KV_TEXELS = 0u;  // uniform texel buffers (RGBA32F or RGBA16F, the views' format)
QKV_CONST uint DECODE_KV_Q8_0 = 1u;    // storage buffers of ggml's block_q8_0
QKV_CONST uint DECODE_KV_Q4_0 = 2u;    // storage buffers of ggml's block_q4_0

// The masks (DECODE_SPEC_MASKS): MASK_FLAG_BOOLEAN reads one bit per mask element (bit n of word
// n / 32, as the fused kernels), MASK_FLAG_ADDITIVE one float per mask element.

QKV_CONST uint DECODE_BINDING_Q = 0u;         // uniform texel buffer, [z][R][E4], unscaled
QKV_CONST uint DECODE_BINDING_K = 1u;         // uniform texel buffer, [z][kv_stride][E4]
QKV_CONST uint DECODE_BINDING_V = 2u;         // uniform texel buffer, [z][kv_stride][EV4]
QKV_CONST uint DECODE_BINDING_MASK = 3u;      // storage, a bit per element
QKV_CONST uint DECODE_BINDING_ADDITIVE = 4u;  // storage, float per element
QKV_CONST uint DECODE_BINDING_STATS = 5u;     // storage, (m, l) per (z, row, chunk)
QKV_CONST uint DECODE_BINDING_ACC = 6u;       // storage, acc[dv_stride] per (z, row, chunk); the wide form
                                              // accumulates there (read and written)
QKV_CONST uint DECODE_BINDING_PARAMS = 7u;    // storage, contract/score.h's params
QKV_CONST uint DECODE_BINDING_GATE = 8u;      // storage, a flags word (DECODE_VALUES_GATED)
QKV_CONST uint DECODE_BINDINGS = 9u;          // QKV_PAGED's (contract/paged.h)
// DECODE_SPEC_GUARD = 1 (a decode recorded over device tensors, where q's texels hold q's values
// exactly): the workgroups of chunk 0 each fold the row norm (shaders/guard_rows.glsl) of their
// rows of q, as read, into word GUARD_HEADER_WORDS + (z·R + r) / L of the overflow guard's words
// (contract/tensor.h, zeroed before), the word of row (batch, query head), and raise
// GUARD_FLAG_INPUT_NONFINITE for a NaN or Inf in it: the guard's rows pass over q, in the pass the
// kernel makes over q anyway. The merge then runs only the output pass (decode_merge_guard_push,
// q_rows = 0). With 0 the binding is bound to any buffer and not read.
QKV_CONST uint DECODE_BINDING_GUARD = 9u;  // storage, the guard's uint words (not QKV_PAGED)
QKV_CONST uint DECODE_GUARD_BINDINGS = 10u;

// decode_spec::careful. Where only the device knows whether V holds a NaN or Inf (a call over
// device tensors, or a cache filled by device appends), one gated pipeline holds both paths and
// the gate word (the overflow guard's flags, contract/tensor.h) picks one, uniformly per dispatch.
QKV_CONST uint DECODE_VALUES_FINITE = 0u;     // the plain products (every value finite)
QKV_CONST uint DECODE_VALUES_NONFINITE = 1u;  // values.glsl's careful products
QKV_CONST uint DECODE_VALUES_GATED = 2u;      // careful where the word's DECODE_GATE_NONFINITE bit is set
QKV_CONST uint DECODE_GATE_NONFINITE = 1u;    // the bit: GUARD_FLAG_INPUT_NONFINITE of contract/tensor.h

QKV_CONST uint MERGE_BINDING_STATS = 0u;
QKV_CONST uint MERGE_BINDING_ACC = 1u;
QKV_CONST uint MERGE_BINDING_OUT = 2u;     // (B, Hq, L, Ev) floats
QKV_CONST uint MERGE_BINDING_PARAMS = 3u;  // contract/score.h's params: the features (read at run time), sinks
QKV_CONST uint MERGE_BINDING_LSE = 4u;     // (B, Hq, L) floats, written with SCORE_LSE
QKV_CONST uint MERGE_BINDINGS = 5u;
QKV_CONST uint MERGE_WORKGROUP = 64u;
/// sdpa_merge.comp's QKV_MERGE_GUARD form, for a decode recorded over device tensors (sdpa_call):
/// the merge runs the overflow guard's passes (contract/tensor.h's words, zeroed before) in the
/// same dispatch, instead of sdpa_guard.comp after it. Every output element it writes raises
/// GUARD_FLAG_OUTPUT_NONFINITE where not finite; the first q_rows invocations (q_rows <= B·Hq·L,
/// fewer than the merge's, or 0 where the rows pass ran before the kernels) each fold the norm of
/// a row of q, d values from element q_off + row·d of MERGE_BINDING_Q, into word
/// GUARD_HEADER_WORDS + row / L, and raise GUARD_FLAG_INPUT_NONFINITE for a NaN or Inf in it.
struct decode_merge_guard_push {
    decode_merge_push merge;
    uint q_rows, d, q_off;
};
QKV_CONST uint MERGE_BINDING_Q = 5u;       // q as read (float32, or float16 with QKV_FP16)
QKV_CONST uint MERGE_BINDING_RESULT = 6u;  // the guard's uint words
QKV_CONST uint MERGE_GUARD_BINDINGS = 7u;
QKV_CONTRACT_END

QKV_CONTRACT_CHECK(sizeof(qkv::contract::decode_push) == 21u * 4u)
QKV_CONTRACT_CHECK(sizeof(qkv::contract::decode_merge_push) == 12u * 4u)
QKV_CONTRACT_CHECK(sizeof(qkv::contract::decode_merge_guard_push) == 15u * 4u &&
                   offsetof(qkv::contract::decode_merge_guard_push, q_rows) == 12u * 4u)
QKV_CONTRACT_CHECK(sizeof(qkv::contract::decode_spec) == qkv::contract::DECODE_SPEC_COUNT * 4u &&
                   offsetof(qkv::contract::decode_spec, masks) == qkv::contract::DECODE_SPEC_MASKS * 4u &&
                   offsetof(qkv::contract::decode_spec, subgroup) == qkv::contract::DECODE_SPEC_SUBGROUP * 4u &&
                   offsetof(qkv::contract::decode_spec, features) == qkv::contract::DECODE_SPEC_FEATURES * 4u &&
                   offsetof(qkv::contract::decode_spec, kv_format) == qkv::contract::DECODE_SPEC_KV_FORMAT * 4u &&
                   offsetof(qkv::contract::decode_spec, tb) == qkv::contract::DECODE_SPEC_TB * 4u &&
                   offsetof(qkv::contract::decode_spec, guard) == qkv::contract::DECODE_SPEC_GUARD * 4u)
QKV_CONTRACT_CHECK(sizeof(qkv::contract::decode_push) <= qkv::contract::PUSH_CONSTANT_BYTES_GUARANTEED)

#endif
