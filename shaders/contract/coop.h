// The host–shader contract of the cooperative-matrix flash family (shaders/flash_coop.comp, recorded
// by src/kernels/flash_coop.cpp): Q·Kᵀ and P·V as VK_KHR_cooperative_matrix products of float16
// operands into float32 accumulators. See common.h for the convention.
//
// One kernel serves the fused route (prefill) and the split-K decode route. Its rows are the
// R = G·L "rows" of one group z = (batch, kv head), G = Hq / Hkv query heads packed into the matrix
// M dimension as the decode kernels pack them (contract/decode.h): row r is query head
// kv_head·G + r / L, query row i = r % L. Every tensor is addressed by element strides, as in
// contract/flash.h:
//   element (b, h, i, c) of Q is at q_off + b·q_bs + h·q_hs + i·q_rs + c    (float16)
//   element (b, g, j, c) of K is at k_off + b·k_bs + g·k_hs + j·k_rs + c    (float16)
//   element (b, g, j, c) of V is at v_off + b·v_bs + g·v_hs + j·v_rs + c    (float16)
//   element (b, h, i, c) of O is at        b·heads·L·Ev + h·o_hs + i·o_rs + c (float32)
//   mask element (b, h, i, j) at b·m_bs + h·m_hs + i·m_rs + j·m_cs (a_bs for the additive mask's batch)
// Query row i sees key j when j <= i + causal_offset (MASK_FLAG_CAUSAL), the mask bit is set
// (MASK_FLAG_BOOLEAN) and the additive mask is not -inf; contract/score.h's rules (FEATURES) apply
// as in every other attention kernel (shaders/score_rules.glsl).
//
// Fused route (COOP_SPEC_SPLIT = 0): a workgroup's rows see the keys [kv_begin, kv_stop) (one key
// chunk, with contract/flash.h's FLASH_RESUME / FLASH_PARTIAL / FLASH_STATS flags and its state
// layout: (m, l) per (batch, head, row)); the output O / l, or the accumulator where more chunks
// follow; the lse with SCORE_LSE. Split-K decode (COOP_SPEC_SPLIT = 1): the keys [kv_begin, kv_stop)
// are cut into chunks of `chunk` keys; workgroup (row block, chunk p, z) writes each row's partial
// (m, l) to `stats` at (z·R + r)·P + p and its unnormalised accumulator to `acc` at
// ((z·R + r)·P + p)·4·ceil(Ev / 4), P = ceil((kv_stop − kv_begin) / chunk): what
// shaders/sdpa_merge.comp merges (contract/decode.h).
#ifndef QKV_CONTRACT_COOP_H
#define QKV_CONTRACT_COOP_H

#include "common.h"
#ifdef __cplusplus
#include <cstddef>  // offsetof
#endif
#include "flash.h"
#include "mask.h"

QKV_CONTRACT_BEGIN

/// Push block of flash_coop.comp (exactly the 128 bytes every device offers).
struct coop_push {
    uint group_x, group_y, group_z;  // workgroup offset of a split dispatch (set by the executor)
    uint q_len, kv_len;              // L, S
    uint dims;                       // E | Ev << 16 (each at most 65,535)
    uint heads_group;                // Hq | G << 16 (each at most 65,535; Hkv = Hq / G)
    uint q_bs, q_hs, q_rs;
    uint k_bs, k_hs, k_rs;
    uint v_bs, v_hs, v_rs;
    uint q_off, k_off, v_off;  // first element of Q, K and V in their bindings
    uint o_hs, o_rs;           // fused: the output's head and row strides (its batch stride is Hq·L·Ev)
    uint a_bs;                 // the additive mask's batch stride
    uint m_bs, m_hs, m_rs, m_cs;
    int causal_offset;       // key j is visible from query row i when j <= i + causal_offset
    float scale;             // applied to the float32 scores (Q is not pre-scaled: no extra rounding)
    uint flags;              // mask.h's MASK_FLAG_*, contract/flash.h's FLASH_RESUME, _PARTIAL, _STATS
    uint kv_begin, kv_stop;  // the keys of this dispatch (split: the keys its chunks cover)
    uint chunk;              // split: keys per chunk (a multiple of COOP_SPEC_BC)
};

/// Specialization constants of flash_coop.comp (src/kernels/flash_coop_plan.cpp, choose_coop_tiles).
struct coop_spec {
    uint wg;          // invocations per workgroup: subgroups × lanes
    uint lanes;       // lanes per subgroup (the pipeline requires it where the device lets it)
    uint m, n, k;     // the cooperative matrix shape: a row of the device's list (f16·f16 + f32)
    uint row_tiles;   // M-tiles of query rows per subgroup
    uint bc;          // keys per K/V tile: a multiple of m, n and k
    uint d_pad;       // E rounded up to a multiple of k and of 8
    uint dv_pad;      // Ev rounded up to a multiple of n and of 8
    uint vec4_loads;  // 1: every offset and stride of Q, K and V is a multiple of 4: f16vec4 loads
    uint features;    // contract/score.h's SCORE_* rules of the call
    uint split;       // 1: split-K decode partials (above); 0: the fused route
    uint careful;     // COOP_CAREFUL_*: how V's non-finite values and the rescale are handled
};
QKV_CONST uint COOP_SPEC_WG = 0u;
QKV_CONST uint COOP_SPEC_LANES = 1u;
QKV_CONST uint COOP_SPEC_M = 2u;
QKV_CONST uint COOP_SPEC_N = 3u;
QKV_CONST uint COOP_SPEC_K = 4u;
QKV_CONST uint COOP_SPEC_ROW_TILES = 5u;
QKV_CONST uint COOP_SPEC_BC = 6u;
QKV_CONST uint COOP_SPEC_D_PAD = 7u;
QKV_CONST uint COOP_SPEC_DV_PAD = 8u;
QKV_CONST uint COOP_SPEC_VEC4 = 9u;
QKV_CONST uint COOP_SPEC_FEATURES = 10u;
QKV_CONST uint COOP_SPEC_SPLIT = 11u;
QKV_CONST uint COOP_SPEC_CAREFUL = 12u;
QKV_CONST uint COOP_SPEC_COUNT = 13u;

// Padding (elements) of each shared row beyond its width: 8 halves (16 bytes) for the float16
// tiles, 4 floats for the float32 ones, so that rows start on 16 bytes and lanes reading the same
// column of consecutive rows fall in different banks.
// coop_spec::careful. NONE: V is finite (no careful path built); NONFINITE: V may hold a NaN or Inf
// (its tiles take the careful path); the fault-finding modes (QKV_COOP_ISOLATE, bench/gpu/check.sh):
// EVERY_TILE, every tile careful (P·V and O's rescale per element in float32), STAGED_RESCALE, O's
// rescale per element through the staging tile with P·V on the matrix units (and NONFINITE's rule).
QKV_CONST uint COOP_CAREFUL_NONE = 0u;
QKV_CONST uint COOP_CAREFUL_NONFINITE = 1u;
QKV_CONST uint COOP_CAREFUL_EVERY_TILE = 2u;
QKV_CONST uint COOP_CAREFUL_STAGED_RESCALE = 3u;
QKV_CONST uint COOP_PAD_HALVES = 8u;
QKV_CONST uint COOP_PAD_FLOATS = 4u;

// bindings of flash_coop.comp (all storage buffers)
QKV_CONST uint COOP_BINDING_Q = 0u;
QKV_CONST uint COOP_BINDING_K = 1u;
QKV_CONST uint COOP_BINDING_V = 2u;
QKV_CONST uint COOP_BINDING_MASK = 3u;
QKV_CONST uint COOP_BINDING_ADDITIVE = 4u;
QKV_CONST uint COOP_BINDING_OUT = 5u;     // fused: O (float32)
QKV_CONST uint COOP_BINDING_STATE = 6u;   // fused: (m, l) per (batch, head, row); NaN m = poisoned row
QKV_CONST uint COOP_BINDING_PARAMS = 7u;  // contract/score.h's params
QKV_CONST uint COOP_BINDING_LSE = 8u;     // fused, SCORE_LSE: log-sum-exp per (batch, head, row)
QKV_CONST uint COOP_BINDING_STATS = 9u;   // split: (m, l) per (z, row, chunk)
QKV_CONST uint COOP_BINDING_ACC = 10u;    // split: the accumulator per (z, row, chunk)
QKV_CONST uint COOP_BINDINGS = 11u;

QKV_CONTRACT_END

QKV_CONTRACT_CHECK(sizeof(qkv::contract::coop_push) == 32u * 4u)
QKV_CONTRACT_CHECK(sizeof(qkv::contract::coop_push) <= qkv::contract::PUSH_CONSTANT_BYTES_GUARANTEED)
QKV_CONTRACT_CHECK(sizeof(qkv::contract::coop_spec) == qkv::contract::COOP_SPEC_COUNT * 4u &&
                   offsetof(qkv::contract::coop_spec, lanes) == qkv::contract::COOP_SPEC_LANES * 4u &&
                   offsetof(qkv::contract::coop_spec, row_tiles) == qkv::contract::COOP_SPEC_ROW_TILES * 4u &&
                   offsetof(qkv::contract::coop_spec, vec4_loads) == qkv::contract::COOP_SPEC_VEC4 * 4u &&
                   offsetof(qkv::contract::coop_spec, features) == qkv::contract::COOP_SPEC_FEATURES * 4u &&
                   offsetof(qkv::contract::coop_spec, split) == qkv::contract::COOP_SPEC_SPLIT * 4u &&
                   offsetof(qkv::contract::coop_spec, careful) == qkv::contract::COOP_SPEC_CAREFUL * 4u)

#endif
