// The host–shader contract of the tensor kernels (see common.h for the convention): copies between
// a caller's tensor and a call's buffers (tensor_copy.comp), float16 and quantized tensors read as
// float32 (tensor_widen.comp), and the device side of the overflow
// rule for calls whose inputs the host never sees (sdpa_guard.comp), recorded by
// src/api/sdpa_call.cpp.
#ifndef QKV_CONTRACT_TENSOR_H
#define QKV_CONTRACT_TENSOR_H

#include "common.h"
#ifdef __cplusplus
#include <cstddef>  // offsetof
#endif

QKV_CONTRACT_BEGIN

/// tensor_copy.comp: a rows x cols block, dst[dst_off + r·dst_rs + c] = src[src_off + r·src_rs + c],
/// elements of 32 bits (tensor_copy) or 16 bits (tensor_copy_16).
struct tensor_copy_push {
    uint group_x, group_y, group_z;
    uint rows, cols;
    uint src_off, src_rs;  // in elements, from each binding's start
    uint dst_off, dst_rs;
};
QKV_CONST uint TENSOR_COPY_BINDING_SRC = 0u;
QKV_CONST uint TENSOR_COPY_BINDING_DST = 1u;
QKV_CONST uint TENSOR_COPY_WORKGROUP = 64u;  // local_size_x; each invocation copies TENSOR_COPY_PER_INVOCATION
QKV_CONST uint TENSOR_COPY_PER_INVOCATION = 16u;

/// tensor_widen.comp: rows of float16 values, or of ggml's q8_0 / q4_0 blocks
/// (qkv/runtime/element_type.hpp), read from 32-bit words, written as float32:
/// dst[dst_off + r·cols + c] = value c of row r, exactly as qkv::dequantize gives it.
struct tensor_widen_push {
    uint group_x, group_y, group_z;
    uint rows, cols;     // cols: values per row (a multiple of 32 for blocks); rows·cols < 2^32
    uint src_byte;       // where row 0 starts in the source binding (even)
    uint src_row_bytes;  // bytes of one source row (even)
    uint dst_off;        // in floats, from the destination binding's start
    uint format;         // WIDEN_F16, WIDEN_Q8_0 or WIDEN_Q4_0
};
QKV_CONST uint TENSOR_WIDEN_BINDING_SRC = 0u;  // 32-bit words
QKV_CONST uint TENSOR_WIDEN_BINDING_DST = 1u;  // float32
QKV_CONST uint TENSOR_WIDEN_WORKGROUP = 64u;   // one invocation per value
QKV_CONST uint WIDEN_F16 = 0u;
QKV_CONST uint WIDEN_Q8_0 = 1u;  // 34 bytes a block: d (float16), 32 int8
QKV_CONST uint WIDEN_Q4_0 = 2u;  // 18 bytes a block: d (float16), 16 bytes of nibbles

/// sdpa_guard.comp, its rows pass: the largest row norm of q per (batch, query head), of k per
/// (batch, K/V head), the largest |v| per (batch, K/V head), all over finite elements, and whether
/// any element is NaN or infinite. Its output pass (GUARD_PASS_OUTPUT): whether any output
/// element is NaN or infinite. `pass` holds either bit or both: one dispatch, the rows'
/// invocations first, then one per GUARD_OUTPUTS_PER_INVOCATION output elements, n =
/// ceil(out_count / GUARD_OUTPUTS_PER_INVOCATION) of them, invocation t reading elements t, t + n,
/// t + 2n, ... (the verdict is read only after the call).
struct sdpa_guard_push {
    uint group_x, group_y, group_z;
    uint pass;                 // GUARD_PASS_ROWS | GUARD_PASS_OUTPUT
    uint q_rows, k_rows;       // B·Hq·L and B·Hkv·S (v has k_rows rows too)
    uint q_len, kv_len;        // L, S: rows per head
    uint d, dv;                // E, Ev
    uint q_off, k_off, v_off;  // first element of each in its binding
    uint out_count;            // B·Hq·L·Ev (output pass)
    uint out_off;
};
QKV_CONST uint GUARD_PASS_ROWS = 1u;  // bits
QKV_CONST uint GUARD_PASS_OUTPUT = 2u;
QKV_CONST uint SDPA_GUARD_BINDING_Q = 0u;
QKV_CONST uint SDPA_GUARD_BINDING_K = 1u;
QKV_CONST uint SDPA_GUARD_BINDING_V = 2u;
QKV_CONST uint SDPA_GUARD_BINDING_OUT = 3u;     // float32 output (output pass)
QKV_CONST uint SDPA_GUARD_BINDING_RESULT = 4u;  // uint words, zeroed before the rows pass
QKV_CONST uint SDPA_GUARD_WORKGROUP = 64u;
QKV_CONST uint GUARD_OUTPUTS_PER_INVOCATION = 32u;  // few workgroups: each costs a CPU driver a hand-off
// The result words: flags, then float bits (non-negative, so ordered as uints: atomicMax) of the
// q norms (B·Hq), the k norms (B·Hkv) and the largest |v| (B·Hkv).
QKV_CONST uint GUARD_WORD_FLAGS = 0u;
QKV_CONST uint GUARD_FLAG_INPUT_NONFINITE = 1u;
QKV_CONST uint GUARD_FLAG_OUTPUT_NONFINITE = 2u;
QKV_CONST uint GUARD_HEADER_WORDS = 4u;

QKV_CONTRACT_END

QKV_CONTRACT_CHECK(sizeof(qkv::contract::tensor_copy_push) == 9u * 4u)
QKV_CONTRACT_CHECK(sizeof(qkv::contract::tensor_widen_push) == 9u * 4u)
QKV_CONTRACT_CHECK(sizeof(qkv::contract::sdpa_guard_push) == 15u * 4u)

#endif
