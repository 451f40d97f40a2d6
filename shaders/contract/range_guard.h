// Contract of the range guard (range_guard.comp) with the host (src/kernels/range_guard.cpp). See common.h.
#ifndef QKV_CONTRACT_RANGE_GUARD_H
#define QKV_CONTRACT_RANGE_GUARD_H
#include "common.h"
#ifdef __cplusplus
#include <cstddef>  // offsetof
#endif

QKV_CONTRACT_BEGIN
struct range_guard_push {
    uint group_x, group_y, group_z;  // workgroup offsets when a dispatch is split
    uint rows;                       // batch x seq
    uint seq;
    uint ld;  // width of a Q|K|V row: 2·d_k + d_v
    uint heads;
    uint d_k;                  // all heads
    uint dh, dvh;              // one head's Q/K and V width
    uint chunk;                // columns per invocation
    uint chunks_k, chunks_v;   // chunks per head of Q (and of K), and of V
    uint rows_per_invocation;  // consecutive rows of one batch per invocation (fewer atomics)
};
QKV_CONST uint RANGE_GUARD_BINDING_QKV = 0u;
QKV_CONST uint RANGE_GUARD_BINDING_RESULT = 1u;
QKV_CONST uint RANGE_GUARD_WORKGROUP = 64u;  // local_size_x
// The result buffer: [0] the first non-finite index (RANGE_GUARD_NO_INDEX: none), up to
// RANGE_GUARD_HEADER_WORDS, then per (batch, head) 3 words: Q norm·2^-32, K norm·2^-32, max |V|.
QKV_CONST uint RANGE_GUARD_HEADER_WORDS = 4u;
QKV_CONST uint RANGE_GUARD_SPEC_VEC4 = 0u;  // 1: read Q|K|V four elements at a time (offsets multiples of 4)
QKV_CONST uint RANGE_GUARD_NO_INDEX = 0xffffffffu;
struct range_guard_spec {
    uint vec4_loads;  // RANGE_GUARD_SPEC_VEC4
};
QKV_CONTRACT_END

QKV_CONTRACT_CHECK(sizeof(qkv::contract::range_guard_push) == 14u * 4u)
QKV_CONTRACT_CHECK(offsetof(qkv::contract::range_guard_push, chunks_v) == 12u * 4u)
QKV_CONTRACT_CHECK(offsetof(qkv::contract::range_guard_push, rows_per_invocation) == 13u * 4u)

#endif
