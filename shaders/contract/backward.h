// The host–shader contract of the backward pass of scaled dot-product attention (see common.h for
// the convention): FlashAttention-2's algorithm in four kernels, recorded by
// src/kernels/flash_backward.cpp in this order:
//
//   flash_bwd_prep.comp    one invocation per query row: D = rowsum(dO ∘ O), Σ|dO ∘ O|, lse' (the
//                          saved lse with the head's sink: log(e^lse + e^σ)) and the sink's term
//                          -e^(σ - lse')·D, into the row statistics (and the dense sink terms)
//   flash_bwd_dq.comp      one invocation per RPI query rows (lanes own rows), streaming the keys:
//                          P = e^(s - lse'), dP = Z·dO·v, dS = P∘(dP - D), dq = scale·Σ_j dR·k;
//                          with BWD_WRITE_DS each dS into a (B, Hq, L, S) scratch (the additive
//                          mask's gradient); with BWD_CHECK the sums that say whether out and lse are
//                          this problem's forward results
//   flash_bwd_dkdv.comp    one invocation per KPI keys (lanes own keys), streaming the query rows
//                          of the K/V head's query heads: dv = Σ P·Z·dO, dk = scale·Σ dR·q
//   flash_bwd_dq_dr.comp   the fused order (flash_bwd_plan::fused): dk/dv runs first and, with
//                          BWD_STORE_DR, also stores every dR it computes (and its key block's
//                          check sums per row); then one invocation per RPI query rows sums
//                          dq = scale·Σ_j dR·k from that scratch, key blocks in order: five N²·d
//                          products in all instead of seven, nothing recomputed twice. Chunked
//                          over (batch, head)s where the scratch of all of them would pass its
//                          budget: dk/dv then dq per chunk, over one scratch
//   flash_bwd_fold.comp    sums over broadcast dimensions in a fixed order: the sinks' gradients
//                          (over batch and rows) and the additive mask's (over whatever it broadcasts)
//
// dq, dk and dv each have one writer per element and a fixed order of accumulation: no atomics, the
// same bits on every run. Q, K, V and dO come as rows of whole texels (flash_cpu_pack.comp, contract
// flash.h): Q and dO npad_q rows per (batch, query head), K and V npad_kv rows per (batch, K/V head).
// The score rules are score_rules.glsl's (contract/score.h), dropout's mask shaders/dropout.glsl's.
//
// Row statistics (written by prep as a storage buffer, read by dq and dk/dv as RGBA32F texels),
// one vec4 per padded query row, (B·Hq) x npad_q:
//   x = lse'  (+inf for a padding row: every P is 0; -inf for a row with no key; NaN: poisoned)
//   y = D     z = Σ_c |dO_c·O_c| (the scale of D's rounding)     w = unused
// Verdict (binding VERDICT, zeroed by the host): word 0 the BWD_FLAG_* bits, word 1 the first row
// (b·Hq·L + h·L + i) whose saved tensors disagree with the problem (0xffffffff: none), by atomicMin,
// so the words do not depend on the order the invocations run in.
#ifndef QKV_CONTRACT_BACKWARD_H
#define QKV_CONTRACT_BACKWARD_H

#include "common.h"
#ifdef __cplusplus
#include <cstddef>  // offsetof
#endif
#include "mask.h"

QKV_CONTRACT_BEGIN

/// Push block of flash_bwd_dq.comp and flash_bwd_dkdv.comp.
struct bwd_push {
    uint group_x, group_y, group_z;  // workgroup offset of a split dispatch (set by the executor)
    uint q_len, kv_len;              // L, S
    uint npad_q, npad_kv;            // texel rows per (batch, head) of Q / dO and of K / V
    uint d, dv;                      // E, Ev
    uint heads, group;               // Hq, query heads per K/V head
    int causal_offset;               // key j is visible from row i when j <= i + causal_offset
    uint a_bs;                       // the additive mask's batch stride
    uint m_bs, m_hs, m_rs, m_cs;     // mask element strides (0 = broadcast), as contract/flash.h
    float scale;
    uint flags;        // BWD_RESUME, BWD_PARTIAL
    uint begin, stop;  // this dispatch's streamed range: keys (dq), or (head, row) slots u·npad_q + i (dkdv)
    uint blocks;       // owner blocks per (batch, head): row blocks (dq), key blocks (dkdv)
    uint pair_offset;  // dk/dv's paired fetches: the first texel of dO in the view over Q and dO
    // The fused order's chunks (flash_bwd_plan::fused_heads; 0 in every other dispatch): z_first is
    // added to the workgroup's z, the (batch, K/V head) of dk/dv or the (batch, query head) of dq
    // from dR, and dr_first is the first (batch, query head) whose dR the scratch holds.
    uint z_first, dr_first;
};

/// Push block of flash_bwd_prep.comp (one invocation per padded query row).
struct bwd_prep_push {
    uint group_x, group_y, group_z;
    uint q_len, npad_q, dv;
    uint heads;
    uint rows;          // batch · heads · npad_q
    uint do_off;        // first element of dO in its binding
    uint features;      // contract/score.h's SCORE_SINKS and SCORE_ALIBI (the params are read only with them)
    uint kv_len;        // S: ALiBi's nearest key of a row (score_rules.glsl: alibi_drop)
    int causal_offset;  // row i sits at position i + causal_offset, as bwd_push
};

/// Push block of flash_bwd_fold.comp: out[m] (+)= Σ in[(b·H + h)·L + i)·S + j] over the elements
/// (b, h, i, j) of a (B, H, L, S) tensor that broadcast onto m of a (MB, MH, ML, MS) one (each M
/// dimension 1 or the tensor's), in (b, h, i, j) order, `first` to `stop` of those terms here.
struct bwd_fold_push {
    uint group_x, group_y, group_z;
    uint b, h, l, s;      // the summed tensor's dimensions
    uint mb, mh, ml, ms;  // the result's (each 1 or the tensor's)
    uint outputs;         // mb·mh·ml·ms
    uint first, stop;     // the terms of each output this dispatch adds
    uint resume;          // 1: add to what out holds
};

// flags of bwd_push
QKV_CONST uint BWD_RESUME = 8u;    // continue from the accumulators in the outputs (an earlier chunk's)
QKV_CONST uint BWD_PARTIAL = 16u;  // more chunks follow: leave the accumulators (and check sums) as they are

// Specialization constants of flash_bwd_dq.comp and flash_bwd_dkdv.comp (src/kernels/flash_backward.cpp).
struct bwd_spec {
    uint wg;        // invocations per workgroup: one subgroup
    uint own;       // rows (dq) or keys (dkdv) per invocation
    uint step;      // streamed keys (dq) or rows (dkdv) per step
    uint d4;        // texels per Q/K row
    uint dv4;       // texels per V / dO row
    uint masks;     // MASK_FLAG_CAUSAL | MASK_FLAG_BOOLEAN | MASK_FLAG_ADDITIVE (mask.h)
    uint features;  // contract/score.h's SCORE_* rules (SCORE_DROPOUT: the mask of dropout.glsl)
    uint careful;   // 1: the pipeline for the (batch, head)s whose streamed rows hold a NaN or Inf
    uint extras;    // BWD_WRITE_DS | BWD_CHECK (dq only)
};
QKV_CONST uint BWD_SPEC_WG = 0u;
QKV_CONST uint BWD_SPEC_OWN = 1u;
QKV_CONST uint BWD_SPEC_STEP = 2u;
QKV_CONST uint BWD_SPEC_D4 = 3u;
QKV_CONST uint BWD_SPEC_DV4 = 4u;
QKV_CONST uint BWD_SPEC_MASKS = 5u;
QKV_CONST uint BWD_SPEC_FEATURES = 6u;
QKV_CONST uint BWD_SPEC_CAREFUL = 7u;
QKV_CONST uint BWD_SPEC_EXTRAS = 8u;

// extras of bwd_spec
QKV_CONST uint BWD_WRITE_DS = 1u;  // dq: every dS into the scratch (the additive mask's gradient)
QKV_CONST uint BWD_CHECK = 2u;     // dq: check that out and lse are the problem's forward results
/// dk/dv (shuffle variant only): store every dR's bits into the dR scratch, a masked key's as
/// BWD_DR_MASKED (which flash_bwd_dq_dr.comp skips; a NaN dR is stored as the quiet NaN 0x7fc00000,
/// never as the sentinel, so a poisoned row stays NaN), and with BWD_CHECK the check's sums over
/// the block's keys per row.
QKV_CONST uint BWD_STORE_DR = 4u;
QKV_CONST uint BWD_DR_MASKED = 0xffffffffu;

// Specialization constants of flash_coop_bwd_dkdv.comp and flash_coop_bwd_dq.comp (the
// cooperative-matrix family's backward; src/kernels/flash_coop_backward_plan.hpp: coop_bwd_tiles).
// Their bindings and push block are flash_bwd_dkdv.comp's (BWD_DKDV_BINDING_*, bwd_push; no dR
// scratch) and flash_bwd_dq.comp's (BWD_DQ_BINDING_*), Q, K, V and dO float16 texels.
struct coop_bwd_spec {
    uint wg;        // invocations per workgroup: subgroups · lanes
    uint lanes;     // the subgroup size the pipeline requires
    uint m, n, k;   // the device's matrix shape (f16 A and B, f32 accumulators)
    uint d_pad;     // E rounded up to lcm(k, n, 8)
    uint dv_pad;    // Ev likewise
    uint step;      // query rows (dk/dv) or keys (dq) per step (a multiple of lcm(n, k))
    uint masks;     // as bwd_spec
    uint features;  // as bwd_spec (no SCORE_DROPOUT: the plan refuses it)
    uint extras;    // BWD_CHECK (dq only)
};
QKV_CONST uint COOP_BWD_SPEC_WG = 0u;
QKV_CONST uint COOP_BWD_SPEC_LANES = 1u;
QKV_CONST uint COOP_BWD_SPEC_M = 2u;
QKV_CONST uint COOP_BWD_SPEC_N = 3u;
QKV_CONST uint COOP_BWD_SPEC_K = 4u;
QKV_CONST uint COOP_BWD_SPEC_D_PAD = 5u;
QKV_CONST uint COOP_BWD_SPEC_DV_PAD = 6u;
QKV_CONST uint COOP_BWD_SPEC_STEP = 7u;
QKV_CONST uint COOP_BWD_SPEC_MASKS = 8u;
QKV_CONST uint COOP_BWD_SPEC_FEATURES = 9u;
QKV_CONST uint COOP_BWD_SPEC_EXTRAS = 10u;

// Specialization constants of flash_bwd_prep.comp and flash_bwd_fold.comp (QKV_FP16, a define,
// says how prep's dO is stored).
struct bwd_small_spec {
    uint wg;  // invocations per workgroup
};
QKV_CONST uint BWD_SMALL_SPEC_WG = 0u;

// Verdict bits (word 0 of the VERDICT binding).
QKV_CONST uint BWD_FLAG_NONFINITE_INPUT = 1u;     // prep: dO, O or the saved lse holds a NaN or an infinity
QKV_CONST uint BWD_FLAG_NONFINITE_GRADIENT = 2u;  // a gradient written is NaN or infinite
QKV_CONST uint BWD_FLAG_BAD_LSE = 4u;             // a row's probabilities from lse do not sum to 1 (with the sink's)
QKV_CONST uint BWD_FLAG_BAD_OUT = 8u;             // a row's rowsum(dO ∘ O) disagrees with Σ_j P·dP
QKV_CONST uint BWD_FLAG_NO_KEY = 16u;             // a row's lse is -inf but it attends to keys, or the reverse
QKV_CONST uint BWD_VERDICT_WORDS = 2u;
QKV_CONST uint BWD_NO_ROW = 0xffffffffu;
/// How far saved tensors may be from the problem's own before they are refused: 1 % (as the CPU
/// reference, qkv::cpu::sdpa_backward).
QKV_CONST float BWD_SAVED_TOLERANCE = 0.01f;

// bindings of flash_bwd_prep.comp
QKV_CONST uint BWD_PREP_BINDING_DO = 0u;      // dO, as stored (float32, or float16 with FP16)
QKV_CONST uint BWD_PREP_BINDING_OUT = 1u;     // O, float32 (B, Hq, L, Ev)
QKV_CONST uint BWD_PREP_BINDING_LSE = 2u;     // the saved lse, float32 (B, Hq, L)
QKV_CONST uint BWD_PREP_BINDING_PARAMS = 3u;  // contract/score.h's params (the sinks)
QKV_CONST uint BWD_PREP_BINDING_STATS = 4u;   // the row statistics (written)
QKV_CONST uint BWD_PREP_BINDING_SINKS = 5u;   // per row (B, Hq, L): -e^(σ - lse')·D (written with SCORE_SINKS)
QKV_CONST uint BWD_PREP_BINDING_VERDICT = 6u;
QKV_CONST uint BWD_PREP_BINDINGS = 7u;

// bindings of flash_bwd_dq.comp
QKV_CONST uint BWD_DQ_BINDING_Q = 0u;  // uniform texel buffers
QKV_CONST uint BWD_DQ_BINDING_K = 1u;
QKV_CONST uint BWD_DQ_BINDING_V = 2u;
QKV_CONST uint BWD_DQ_BINDING_DO = 3u;
QKV_CONST uint BWD_DQ_BINDING_MASK = 4u;
QKV_CONST uint BWD_DQ_BINDING_ADDITIVE = 5u;
QKV_CONST uint BWD_DQ_BINDING_PARAMS = 6u;
QKV_CONST uint BWD_DQ_BINDING_STATS = 7u;   // uniform texel buffer (RGBA32F) over the row statistics
QKV_CONST uint BWD_DQ_BINDING_DQ = 8u;      // (B, Hq, L, E) float32
QKV_CONST uint BWD_DQ_BINDING_DS = 9u;      // (B, Hq, L, S) float32, with BWD_WRITE_DS
QKV_CONST uint BWD_DQ_BINDING_SUMS = 10u;   // (B·Hq·L) x 3 floats between key chunks, with BWD_CHECK
QKV_CONST uint BWD_DQ_BINDING_FLAGS = 11u;  // per (batch, K/V head): K holds a NaN or Inf
QKV_CONST uint BWD_DQ_BINDING_VERDICT = 12u;
QKV_CONST uint BWD_DQ_BINDINGS = 13u;

// bindings of flash_bwd_dkdv.comp
QKV_CONST uint BWD_DKDV_BINDING_Q = 0u;  // uniform texel buffers
QKV_CONST uint BWD_DKDV_BINDING_K = 1u;
QKV_CONST uint BWD_DKDV_BINDING_V = 2u;
QKV_CONST uint BWD_DKDV_BINDING_DO = 3u;
QKV_CONST uint BWD_DKDV_BINDING_MASK = 4u;
QKV_CONST uint BWD_DKDV_BINDING_ADDITIVE = 5u;
QKV_CONST uint BWD_DKDV_BINDING_PARAMS = 6u;
QKV_CONST uint BWD_DKDV_BINDING_STATS = 7u;   // uniform texel buffer (RGBA32F)
QKV_CONST uint BWD_DKDV_BINDING_DK = 8u;      // (B, Hkv, S, E) float32
QKV_CONST uint BWD_DKDV_BINDING_DV = 9u;      // (B, Hkv, S, Ev) float32
QKV_CONST uint BWD_DKDV_BINDING_FLAGS = 10u;  // per (batch, query head): Q or dO holds a NaN or Inf
QKV_CONST uint BWD_DKDV_BINDING_VERDICT = 11u;
// The dR scratch, with BWD_STORE_DR: float [B·Hq][key blocks][npad_q][block keys], key blocks of
// wg·kpi keys, ceil(max(S, 1) / (wg·kpi)) of them; and the check sums, vec4 [B·Hq][key blocks][npad_q]
// (Σ P, Σ P·dP, Σ P·|dP|, keys allowed over the block's keys), each written where the block's
// visible rows (backward.glsl: visible_rows) hold the row and nowhere else.
QKV_CONST uint BWD_DKDV_BINDING_DR = 12u;
QKV_CONST uint BWD_DKDV_BINDING_DR_SUMS = 13u;
QKV_CONST uint BWD_DKDV_BINDINGS = 14u;

// bindings of flash_bwd_dq_dr.comp (bwd_push as dq's; bwd_spec with own = rows per invocation,
// step = the dk/dv key block, extras = BWD_CHECK)
QKV_CONST uint BWD_DQ_DR_BINDING_K = 0u;  // uniform texel buffer
QKV_CONST uint BWD_DQ_DR_BINDING_PARAMS = 1u;
QKV_CONST uint BWD_DQ_DR_BINDING_STATS = 2u;  // uniform texel buffer (RGBA32F)
QKV_CONST uint BWD_DQ_DR_BINDING_DR = 3u;
QKV_CONST uint BWD_DQ_DR_BINDING_DR_SUMS = 4u;
QKV_CONST uint BWD_DQ_DR_BINDING_DQ = 5u;
QKV_CONST uint BWD_DQ_DR_BINDING_FLAGS = 6u;  // per (batch, K/V head): K holds a NaN or Inf
QKV_CONST uint BWD_DQ_DR_BINDING_VERDICT = 7u;
QKV_CONST uint BWD_DQ_DR_BINDINGS = 8u;

// bindings of flash_bwd_fold.comp
QKV_CONST uint BWD_FOLD_BINDING_IN = 0u;
QKV_CONST uint BWD_FOLD_BINDING_OUT = 1u;
QKV_CONST uint BWD_FOLD_BINDING_VERDICT = 2u;
QKV_CONST uint BWD_FOLD_BINDINGS = 3u;

QKV_CONTRACT_END

QKV_CONTRACT_CHECK(sizeof(qkv::contract::bwd_push) <= qkv::contract::PUSH_CONSTANT_BYTES_GUARANTEED)
QKV_CONTRACT_CHECK(sizeof(qkv::contract::bwd_prep_push) <= qkv::contract::PUSH_CONSTANT_BYTES_GUARANTEED)
QKV_CONTRACT_CHECK(sizeof(qkv::contract::bwd_fold_push) <= qkv::contract::PUSH_CONSTANT_BYTES_GUARANTEED)
QKV_CONTRACT_CHECK(sizeof(qkv::contract::bwd_spec) == 9u * 4u &&
                   offsetof(qkv::contract::bwd_spec, masks) == qkv::contract::BWD_SPEC_MASKS * 4u &&
                   offsetof(qkv::contract::bwd_spec, features) == qkv::contract::BWD_SPEC_FEATURES * 4u &&
                   offsetof(qkv::contract::bwd_spec, careful) == qkv::contract::BWD_SPEC_CAREFUL * 4u &&
                   offsetof(qkv::contract::bwd_spec, extras) == qkv::contract::BWD_SPEC_EXTRAS * 4u)
QKV_CONTRACT_CHECK(sizeof(qkv::contract::bwd_small_spec) == 4u)

#endif
