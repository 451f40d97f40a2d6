// Contract of the staged softmax (softmax.comp) with the host (src/kernels/stages.cpp). See common.h.
#ifndef QKV_CONTRACT_SOFTMAX_H
#define QKV_CONTRACT_SOFTMAX_H
#include "common.h"
#ifdef __cplusplus
#include <cstddef>  // offsetof
#endif

QKV_CONTRACT_BEGIN
struct softmax_push {
    uint group_x, group_y, group_z;  // workgroup offsets when a dispatch is split
    uint cols;                       // row length (the sequence length)
    uint rows;                       // batch * heads * seq
};
QKV_CONST uint SOFTMAX_BINDING_S = 0u;       // the scores, turned into weights in place
QKV_CONST uint SOFTMAX_SPEC_WORKGROUP = 0u;  // a power of two (src/kernels/stages.cpp, softmax_workgroup)
// softmax_cpu.comp (a row per lane, CPU devices): the scores again, as an RGBA32F texel view, and
// whether the rows fill every workgroup (no bounds check on the stores).
QKV_CONST uint SOFTMAX_BINDING_TEXELS = 1u;
QKV_CONST uint SOFTMAX_SPEC_EXACT = 1u;  // softmax_cpu_tx: 1 = rows is a multiple of the workgroup
/// softmax.comp's specialization constants, and softmax_cpu.comp's (which adds SOFTMAX_SPEC_EXACT).
struct softmax_spec {
    uint workgroup;
};
struct softmax_cpu_spec {
    uint workgroup, exact;
};
QKV_CONTRACT_END

QKV_CONTRACT_CHECK(sizeof(qkv::contract::softmax_push) == 5u * 4u)
QKV_CONTRACT_CHECK(offsetof(qkv::contract::softmax_push, rows) == 16u)
QKV_CONTRACT_CHECK(sizeof(qkv::contract::softmax_cpu_spec) == 2u * 4u &&
                   offsetof(qkv::contract::softmax_cpu_spec, exact) == qkv::contract::SOFTMAX_SPEC_EXACT * 4u)

#endif
