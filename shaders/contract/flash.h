// The host–shader contract of the fused attention kernels (see common.h for the convention):
// the GPU family (flash.comp), the cpu family (flash_cpu.comp with its packer flash_cpu_pack.comp)
// and the weights kernel (flash_weights.comp). Included by those shaders and by src/kernels/flash_*.cpp.
//
// Every tensor is addressed by element strides, so the self-attention path's projected rows
// (B, N, H·d, head h at column h·d of Q, K or V) and SDPA's (B, H, L, E) tensors are the same
// kernel with different numbers:
//   element (b, h, i, c) of Q is at        b·q_bs + h·q_hs + i·q_rs + c
//   element (b, g, j, c) of K is at k_off + b·k_bs + g·k_hs + j·k_rs + c    (g = h / group: GQA)
//   element (b, g, j, c) of V is at v_off + b·v_bs + g·v_hs + j·v_rs + c
//   element (b, h, i, c) of O is at        b·o_bs + h·o_hs + i·o_rs + c, o_bs = heads·L·Ev
//     (each batch element's output is contiguous, in both layouts, so it is not pushed)
//   mask element (b, h, i, j) is at        b·m_bs + h·m_hs + i·m_rs + j·m_cs (0 = broadcast),
//     one bit of the bool mask (bit n of word n / 32), and for the additive mask's floats the
//     same with a_bs for m_bs (the self-attention path lets a (N, N) bool mask meet a (B, N, N)
//     additive one; SDPA's two masks share one shape, a_bs = m_bs).
// Query row i sees key j when j <= i + causal_offset (with MASK_FLAG_CAUSAL), the mask bit is
// set (MASK_FLAG_BOOLEAN) and the additive mask is not -inf (MASK_FLAG_ADDITIVE); the rules beyond
// (softcap, ALiBi, the window, sinks, the log-sum-exp) are contract/score.h's, applied by
// shaders/score_rules.glsl, chosen by each kernel's FEATURES constant, with their values in the
// params binding.
#ifndef QKV_CONTRACT_FLASH_H
#define QKV_CONTRACT_FLASH_H

#include "common.h"
#ifdef __cplusplus
#include <cstddef>  // offsetof
#endif
#include "mask.h"

QKV_CONTRACT_BEGIN

/// Push block of flash.comp and flash_weights.comp (exactly the 128 bytes every device offers).
struct flash_push {
    uint group_x, group_y, group_z;  // workgroup offset of a split dispatch (set by the executor)
    uint q_len, kv_len;              // L, S
    uint d, dv;                      // E (Q and K), Ev (V and O)
    uint q_bs, q_hs, q_rs;
    uint k_bs, k_hs, k_rs;
    uint v_bs, v_hs, v_rs;
    uint a_bs, o_hs, o_rs;  // a_bs: the additive mask's batch stride (o_bs is heads·L·Ev)
    uint k_off, v_off;      // first element of K and of V in the Q|K|V binding (Q starts at 0)
    uint heads;             // query heads (the grid's z is batch · heads + head)
    uint group;             // query heads per K/V head
    int causal_offset;      // off' (contract/score.h): key j is visible from row i when j <= i + off'
    uint m_bs, m_hs, m_rs, m_cs;
    float scale;
    uint flags;              // FLASH_* below
    uint kv_begin, kv_stop;  // this dispatch's keys (a key chunk)
};

/// Push block of flash_cpu.comp: Q, K and V come packed as texels (flash_cpu_pack.comp), Q rows
/// npad_q apart per (batch, query head), K and V rows npad_kv apart per (batch, K/V head).
struct flash_cpu_push {
    uint group_x, group_y, group_z;
    uint q_len, kv_len;
    uint npad_q, npad_kv;
    uint dv;
    uint heads, group;
    uint o_hs, o_rs;  // o_bs is heads·L·Ev
    int causal_offset;
    uint a_bs;
    uint m_bs, m_hs, m_rs, m_cs;
    float scale;
    uint flags;  // FLASH_RESUME, FLASH_PARTIAL, FLASH_STATS (the mask kinds are the constant MASKS)
    uint kv_begin, kv_stop;
    uint blocks;  // row blocks per (batch, head)
};

/// Push block of flash_cpu_pack.comp: one tensor (Q, K or V) into rows of whole texels.
struct flash_pack_push {
    uint group_x, group_y, group_z;
    uint rows, npad;      // rows per (batch, head), and rows per (batch, head) in the texel buffer
    uint width, w4;       // elements per row, and texels per row
    uint bs, hs, rs;      // element strides of the source
    uint off;             // its first element in the source binding
    uint heads;           // heads of this tensor (the grid's z is batch · heads + head)
    uint at;              // first texel of the destination region
    uint mark_nonfinite;  // 1: flag each (batch, head) whose rows hold a NaN or Inf (V)
    uint stride;          // rows per (batch, head) of the destination (npad, or a K/V cache's capacity)
};

// flags of flash_push / flash_cpu_push: the mask kinds are mask.h's MASK_FLAG_CAUSAL (j <= i +
// causal_offset), MASK_FLAG_BOOLEAN (the bool mask, as bits) and MASK_FLAG_ADDITIVE (the float
// mask); flash_cpu.comp takes those three as its spec constant MASKS instead. Then the chunking:
QKV_CONST uint FLASH_RESUME = 8u;    // continue from the chunk state and the partial output
QKV_CONST uint FLASH_PARTIAL = 16u;  // more key chunks follow: hand the state and the accumulator on
QKV_CONST uint FLASH_STATS = 32u;    // last chunk: also store each row's final (max, sum) in the state

// Specialization constants of flash.comp (chosen per device by src/kernels/flash_tiles.cpp,
// choose_flash_tiles): the struct the host fills, and each member's constant_id.
struct flash_spec {
    uint wg;          // invocations per workgroup
    uint br;          // query rows per workgroup
    uint bc;          // key/value rows per tile
    uint d_max;       // >= head width of Q and K, a multiple of 4
    uint dv_max;      // >= head width of V, a multiple of 4
    uint team;        // lanes per row team (the subgroup size aimed at)
    uint q_regs;      // 1: each lane keeps its team's query rows in registers
    uint vec4_loads;  // 1: widths, strides and offsets are multiples of 4: vec4 loads
    uint fallback;    // 0: the pipeline requires subgroups of `team` lanes, all full
    uint features;    // contract/score.h's SCORE_* rules of the call
};
QKV_CONST uint FLASH_SPEC_WG = 0u;
QKV_CONST uint FLASH_SPEC_BR = 1u;
QKV_CONST uint FLASH_SPEC_BC = 2u;
QKV_CONST uint FLASH_SPEC_D_MAX = 3u;
QKV_CONST uint FLASH_SPEC_DV_MAX = 4u;
QKV_CONST uint FLASH_SPEC_TEAM = 5u;
QKV_CONST uint FLASH_SPEC_Q_REGS = 6u;
QKV_CONST uint FLASH_SPEC_VEC4 = 7u;
QKV_CONST uint FLASH_SPEC_FALLBACK = 8u;
QKV_CONST uint FLASH_SPEC_FEATURES = 9u;

// Specialization constants of flash_cpu.comp (src/kernels/flash_cpu.cpp, plan_flash_cpu).
struct flash_cpu_spec {
    uint wg;        // invocations per workgroup: one subgroup
    uint rpi;       // query rows per invocation
    uint kps;       // keys per step
    uint d4;        // texels (4 values) per Q/K row: ceil(d / 4)
    uint dv4;       // texels per V row: ceil(dv / 4)
    uint masks;     // MASK_FLAG_CAUSAL | MASK_FLAG_BOOLEAN | MASK_FLAG_ADDITIVE (mask.h)
    uint careful;   // 1: the pipeline for the (batch, head)s whose V holds a NaN or Inf
    uint features;  // contract/score.h's SCORE_* rules of the call
};
QKV_CONST uint FLASH_CPU_SPEC_WG = 0u;
QKV_CONST uint FLASH_CPU_SPEC_RPI = 1u;
QKV_CONST uint FLASH_CPU_SPEC_KPS = 2u;
QKV_CONST uint FLASH_CPU_SPEC_D4 = 3u;
QKV_CONST uint FLASH_CPU_SPEC_DV4 = 4u;
QKV_CONST uint FLASH_CPU_SPEC_MASKS = 5u;
QKV_CONST uint FLASH_CPU_SPEC_CAREFUL = 6u;
QKV_CONST uint FLASH_CPU_SPEC_FEATURES = 7u;

// Specialization constants of flash_cpu_pack.comp.
struct flash_pack_spec {
    uint wg;    // invocations per workgroup
    uint fp16;  // 1: RGBA16F texels (2 words each), else RGBA32F (4 words)
};
QKV_CONST uint FLASH_PACK_SPEC_WG = 0u;
QKV_CONST uint FLASH_PACK_SPEC_FP16 = 1u;

// bindings of flash.comp
QKV_CONST uint FLASH_BINDING_QKV = 0u;
QKV_CONST uint FLASH_BINDING_MASK = 1u;
QKV_CONST uint FLASH_BINDING_ADDITIVE = 2u;
QKV_CONST uint FLASH_BINDING_OUT = 3u;
QKV_CONST uint FLASH_BINDING_STATE = 4u;   // (max, sum) per (batch, head, row); NaN max = poisoned row
QKV_CONST uint FLASH_BINDING_PARAMS = 5u;  // contract/score.h's params (read with FEATURES only)
QKV_CONST uint FLASH_BINDING_LSE = 6u;     // log-sum-exp per (batch, head, row) (written with SCORE_LSE)
QKV_CONST uint FLASH_BINDINGS = 7u;

// bindings of flash_cpu.comp
QKV_CONST uint FLASH_CPU_BINDING_Q = 0u;  // uniform texel buffers
QKV_CONST uint FLASH_CPU_BINDING_K = 1u;
QKV_CONST uint FLASH_CPU_BINDING_V = 2u;
QKV_CONST uint FLASH_CPU_BINDING_MASK = 3u;
QKV_CONST uint FLASH_CPU_BINDING_ADDITIVE = 4u;
QKV_CONST uint FLASH_CPU_BINDING_OUT = 5u;
QKV_CONST uint FLASH_CPU_BINDING_STATE = 6u;
QKV_CONST uint FLASH_CPU_BINDING_VFLAGS = 7u;  // per (batch, K/V head): V holds a NaN or Inf
QKV_CONST uint FLASH_CPU_BINDING_PARAMS = 8u;  // as FLASH_BINDING_PARAMS
QKV_CONST uint FLASH_CPU_BINDING_LSE = 9u;     // as FLASH_BINDING_LSE
QKV_CONST uint FLASH_CPU_BINDINGS = 10u;

// bindings of flash_cpu_pack.comp
QKV_CONST uint FLASH_PACK_BINDING_SRC = 0u;
QKV_CONST uint FLASH_PACK_BINDING_TEXELS = 1u;
QKV_CONST uint FLASH_PACK_BINDING_FLAGS = 2u;
QKV_CONST uint FLASH_PACK_BINDINGS = 3u;

// bindings of flash_weights.comp (push block: flash_push; weights are (B, Hq, L, S), contiguous)
QKV_CONST uint FLASH_WEIGHTS_BINDING_QKV = 0u;
QKV_CONST uint FLASH_WEIGHTS_BINDING_MASK = 1u;
QKV_CONST uint FLASH_WEIGHTS_BINDING_ADDITIVE = 2u;
QKV_CONST uint FLASH_WEIGHTS_BINDING_STATE = 3u;
QKV_CONST uint FLASH_WEIGHTS_BINDING_OUT = 4u;
QKV_CONST uint FLASH_WEIGHTS_BINDING_PARAMS = 5u;  // contract/score.h's params (its features read at run time)
QKV_CONST uint FLASH_WEIGHTS_BINDINGS = 6u;
QKV_CONST uint FLASH_WEIGHTS_WORKGROUP = 64u;  // keys per workgroup (one per invocation)

QKV_CONTRACT_END

QKV_CONTRACT_CHECK(sizeof(qkv::contract::flash_push) == 32u * 4u)
QKV_CONTRACT_CHECK(sizeof(qkv::contract::flash_push) <= qkv::contract::PUSH_CONSTANT_BYTES_GUARANTEED)
QKV_CONTRACT_CHECK(sizeof(qkv::contract::flash_cpu_push) <= qkv::contract::PUSH_CONSTANT_BYTES_GUARANTEED)
QKV_CONTRACT_CHECK(sizeof(qkv::contract::flash_pack_push) <= qkv::contract::PUSH_CONSTANT_BYTES_GUARANTEED)
QKV_CONTRACT_CHECK(sizeof(qkv::contract::flash_spec) == 10u * 4u &&
                   offsetof(qkv::contract::flash_spec, fallback) == qkv::contract::FLASH_SPEC_FALLBACK * 4u &&
                   offsetof(qkv::contract::flash_spec, features) == qkv::contract::FLASH_SPEC_FEATURES * 4u &&
                   offsetof(qkv::contract::flash_spec, br) == qkv::contract::FLASH_SPEC_BR * 4u &&
                   offsetof(qkv::contract::flash_spec, vec4_loads) == qkv::contract::FLASH_SPEC_VEC4 * 4u)
QKV_CONTRACT_CHECK(sizeof(qkv::contract::flash_cpu_spec) == 8u * 4u &&
                   offsetof(qkv::contract::flash_cpu_spec, features) == qkv::contract::FLASH_CPU_SPEC_FEATURES * 4u &&
                   offsetof(qkv::contract::flash_cpu_spec, masks) == qkv::contract::FLASH_CPU_SPEC_MASKS * 4u &&
                   offsetof(qkv::contract::flash_cpu_spec, careful) == qkv::contract::FLASH_CPU_SPEC_CAREFUL * 4u)
QKV_CONTRACT_CHECK(sizeof(qkv::contract::flash_pack_spec) == 2u * 4u &&
                   offsetof(qkv::contract::flash_pack_spec, fp16) == qkv::contract::FLASH_PACK_SPEC_FP16 * 4u)

#endif
