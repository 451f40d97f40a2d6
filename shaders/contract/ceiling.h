// Contract of the device-ceiling shaders (ceiling_fma.comp, ceiling_copy.comp) with the host
// (src/api/ceiling.cpp). See common.h.
#ifndef QKV_CONTRACT_CEILING_H
#define QKV_CONTRACT_CEILING_H
#include "common.h"
#ifdef __cplusplus
#include <cstddef>  // offsetof
#endif

QKV_CONTRACT_BEGIN
struct ceiling_fma_push {
    uint group_x, group_y, group_z;  // workgroup offsets when a dispatch is split
    uint iterations;                 // loop iterations per invocation (under 65,535)
    float seed;
};
QKV_CONST uint CEILING_FMA_BINDING_OUT = 0u;
QKV_CONST uint CEILING_FMA_SPEC_WORKGROUP = 0u;
QKV_CONST uint CEILING_FMA_SPEC_CHAINS = 1u;
QKV_CONST uint CEILING_FMA_SPEC_UNROLL = 2u;
struct ceiling_fma_spec {
    uint workgroup, chains, unroll;
};

struct ceiling_copy_push {
    uint group_x, group_y, group_z;
    uint count;  // vec4 elements
};
QKV_CONST uint CEILING_COPY_BINDING_SRC = 0u;
QKV_CONST uint CEILING_COPY_BINDING_DST = 1u;
QKV_CONST uint CEILING_COPY_WORKGROUP = 256u;  // local_size_x
QKV_CONTRACT_END

QKV_CONTRACT_CHECK(sizeof(qkv::contract::ceiling_fma_push) == 5u * 4u)
QKV_CONTRACT_CHECK(sizeof(qkv::contract::ceiling_copy_push) == 4u * 4u)
QKV_CONTRACT_CHECK(sizeof(qkv::contract::ceiling_fma_spec) == 3u * 4u &&
                   offsetof(qkv::contract::ceiling_fma_spec, unroll) == qkv::contract::CEILING_FMA_SPEC_UNROLL * 4u)

#endif
