#version 450
#extension GL_GOOGLE_include_directive : require
// texelFetch on textureBuffer: uniform texel buffers as plain images (a sampled image of Dim Buffer is
// invalid SPIR-V, which Mesa 25 warns about)
#extension GL_EXT_samplerless_texture_functions : require
#extension GL_EXT_control_flow_attributes : enable
#ifdef QKV_DECODE_GPU
#extension GL_KHR_shader_subgroup_basic : enable
#extension GL_KHR_shader_subgroup_arithmetic : enable
#endif
#ifdef QKV_SHUFFLE
// cpu variant: each lane fetches one key's texel and subgroupShuffle hands it to every lane
// (as flash_cpu.comp; the host's choice, src/kernels/decode_plan.cpp).
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#endif
// Split-S decode (flash-decoding): one workgroup takes one block of rows of one group
// z = (batch, kv head) and one chunk of keys, and writes each row's partial softmax state
// (m = running maximum, l = running sum, acc = sum of weights · V) for sdpa_merge.comp.
// A group's rows are the G = Hq / Hkv query heads × L query rows that read the same K/V head
// (row r: query head kv_head·G + r / L, query row r % L), so each K/V row is read once per block
// of rows rather than once per query head. Keys and values come from the K/V cache's texel
// buffers ([z][kv_stride][E4] and [z][kv_stride][EV4], RGBA32F or RGBA16F).
//
// Two variants, one source:
//   cpu (default): one subgroup per workgroup, no shared memory and no barriers; a lane owns RPI
//     rows, every K/V texel is fetched at a lane-uniform address (one fetch serves all lanes) and
//     every inner loop has a constant trip count and is unrolled, so the key-step loop is the only
//     loop: at most chunk / KPS iterations, which the host keeps far below llvmpipe's 65,535.
//     Wide heads (TB > 0, the host's choice past 32 texels a row): unrolling every texel of E and
//     Ev made LLVM's compile time grow faster than the body (minutes at E = 1,024 with q8_0, over
//     ten at E = 4,096) and an indexed register array is far worse on llvmpipe, so the wide form
//     loops over E and Ev TB texels an iteration (unrolled within), fetches Q's texels as it
//     needs them and keeps the accumulator in the partial output it writes anyway (acc_out, one
//     load and one store a texel per step of KPS keys); quantized K and V are read a block (TB = 8
//     texels) at a time, the scale once.
//   gpu (QKV_DECODE_GPU): WG invocations, RPI rows per workgroup; each tile of WG keys is one key
//     per invocation, scores for all rows against Q in shared memory, the tile's row maxima by
//     subgroupMax + shared memory (SUBGROUP = 1) or a shared-memory tree (SUBGROUP = 0), the
//     weights through shared memory, and each invocation accumulates its (row, texel) outputs.
//
// Semantics as the fused kernels: a masked key has weight 0 (and, with masks, adds nothing even
// where its value is NaN); a row with nothing to attend keeps m = -inf, l = 0. The score rules
// (softcap, ALiBi, the window, the masks) are score_rules.glsl's; sinks and the log-sum-exp are
// applied by sdpa_merge.comp.
//
// K and V: texels (texelFetch), or with QKV_KV_BLOCKS ggml's q8_0 / q4_0 blocks read from storage
// buffers and dequantized a texel (4 values) at a time in float32 (kv_blocks.glsl).
//
// GUARD = 1 (not QKV_PAGED): the workgroups of chunk 0 also run the overflow guard's rows pass over
// the rows of q they read (contract/decode.h, DECODE_BINDING_GUARD), so that a decode recorded over
// device tensors needs no pass of its own over q.
#include "contract/decode.h"
#include "contract/paged.h"
#include "contract/score.h"
#include "values.glsl"
#define QKV_SCORE_PARAMS_BINDING DECODE_BINDING_PARAMS
#include "score_rules.glsl"

layout(local_size_x_id = DECODE_SPEC_WG, local_size_y = 1, local_size_z = 1) in;
layout(constant_id = DECODE_SPEC_RPI) const uint RPI = 1;
layout(constant_id = DECODE_SPEC_KPS) const uint KPS = 8;
layout(constant_id = DECODE_SPEC_E4) const uint E4 = 16;
layout(constant_id = DECODE_SPEC_EV4) const uint EV4 = 16;
layout(constant_id = DECODE_SPEC_MASKS) const uint MASKS = 0;
layout(constant_id = DECODE_SPEC_SUBGROUP) const uint SUBGROUP = 0;
layout(constant_id = DECODE_SPEC_CAREFUL) const uint CAREFUL = 0;  // DECODE_VALUES_* (values.glsl)
layout(constant_id = DECODE_SPEC_FEATURES) const uint FEATURES = 0;  // contract/score.h's SCORE_* bits
layout(constant_id = DECODE_SPEC_KV_FORMAT) const uint KV_FORMAT = DECODE_KV_TEXELS;
layout(constant_id = DECODE_SPEC_TB) const uint TB = 0;  // cpu: 0 unrolled, else the wide form's texels an iteration
layout(constant_id = DECODE_SPEC_GUARD) const uint GUARD = 0;  // 1: the guard's rows pass over q (chunk 0)
const uint TBX = TB == 0u ? 1u : TB;                     // (array sizes: never 0)

layout(binding = DECODE_BINDING_Q) uniform textureBuffer q_tex;
#ifdef QKV_KV_BLOCKS
layout(std430, binding = DECODE_BINDING_K) readonly buffer KBlocks { uint k_words[]; };
layout(std430, binding = DECODE_BINDING_V) readonly buffer VBlocks { uint v_words[]; };
#include "kv_blocks.glsl"
QKV_BLOCK_TEXEL(k_block_texel, k_words)
QKV_BLOCK_TEXEL(v_block_texel, v_words)
QKV_BLOCK_TEXELS(k_block_texels, k_words)
QKV_BLOCK_TEXELS(v_block_texels, v_words)
const uint BLOCK_BYTES = KV_FORMAT == DECODE_KV_Q8_0 ? 34u : 18u;
const uint K_ROW_BYTES = E4 / 8u * BLOCK_BYTES, V_ROW_BYTES = EV4 / 8u * BLOCK_BYTES;  // E, Ev multiples of 32
vec4 k_texel(uint row, uint c) { return k_block_texel(row * K_ROW_BYTES, c, KV_FORMAT == DECODE_KV_Q8_0); }
vec4 v_texel(uint row, uint c) { return v_block_texel(row * V_ROW_BYTES, c, KV_FORMAT == DECODE_KV_Q8_0); }
#else
layout(binding = DECODE_BINDING_K) uniform textureBuffer k_tex;
layout(binding = DECODE_BINDING_V) uniform textureBuffer v_tex;
vec4 k_texel(uint row, uint c) { return texelFetch(k_tex, int(row * E4 + c)); }
vec4 v_texel(uint row, uint c) { return texelFetch(v_tex, int(row * EV4 + c)); }
#endif
#ifdef QKV_PAGED
// The batched paged decode (contract/paged.h): the block table and the work words where the masks were.
layout(std430, binding = PAGED_BINDING_TABLE) readonly buffer Table { int block_table[]; };
layout(std430, binding = PAGED_BINDING_WORK) readonly buffer Work { uint work[]; };
#else
layout(std430, binding = DECODE_BINDING_MASK) readonly buffer MaskBits { uint mask_bits[]; };  // bit n of word n / 32
layout(std430, binding = DECODE_BINDING_ADDITIVE) readonly buffer Additive { float additive[]; };
#endif
layout(std430, binding = DECODE_BINDING_STATS) writeonly buffer Stats { vec2 stats[]; };
layout(std430, binding = DECODE_BINDING_ACC) buffer Acc { vec4 acc_out[]; };  // the wide form reads it too
#ifdef QKV_PAGED
layout(push_constant) uniform Push { paged_push pc; };
#else
layout(push_constant) uniform Push { decode_push pc; };
#endif
layout(std430, binding = DECODE_BINDING_GATE) readonly buffer Gate { uint gate_word[]; };
#ifndef QKV_PAGED
#include "contract/tensor.h"
#include "guard_rows.glsl"
layout(std430, binding = DECODE_BINDING_GUARD) buffer Guard { uint guard_words[]; };
QKV_GUARD_TEXEL_NORM(q_texel_norm, q_tex)
#endif

/// Whether V may hold NaN or Inf: the host's word, or (DECODE_VALUES_GATED) the gate word's, the
/// same for every invocation of the dispatch (so the branch on it is uniform).
bool careful_values() {
    if (CAREFUL != DECODE_VALUES_GATED) return CAREFUL == DECODE_VALUES_NONFINITE;
    return (gate_word[0] & DECODE_GATE_NONFINITE) != 0u;
}

const uint WG = gl_WorkGroupSize.x;
const bool CAUSAL = (MASKS & MASK_FLAG_CAUSAL) != 0u;
const bool HAS_MASK = (MASKS & MASK_FLAG_BOOLEAN) != 0u;
const bool HAS_ADD = (MASKS & MASK_FLAG_ADDITIVE) != 0u;
// Rules that change every score: the score step runs on every key step.
const bool EVERY_STEP = (FEATURES & SCORE_EVERY_STEP) != 0u;

score_params sp;  // the score rules' values, where FEATURES uses them

// What the score rules and the addressing read of the workgroup's problem: the call's (the push
// block's), or with QKV_PAGED its item's sequence (the work words): rows per group, query rows,
// keys, the causal offset, the keys the chunks cover, the partial states' first slot and chunks.
uint g_rows, g_q_len, g_kv_len, g_kv_first, g_kv_end, g_part, g_chunks;
int g_offset;
#ifdef QKV_PAGED
uint g_q_first, g_table, g_kv_base;
bool g_prefix;  // the item is a group's shared prefix (contract/paged.h): its rows are its members'
#endif

/// The workgroup's row block, chunk and group z = batch·Hkv + kv head (paged: the K/V head), and
/// the globals above.
void locate(out uint block, out uint chunk, out uint z) {
#ifdef QKV_PAGED
    const uint at = pc.item_base + (gl_WorkGroupID.x + pc.group_x) * PAGED_ITEM_WORDS;
    const uint seq = work[at] * PAGED_SEQ_WORDS;
    g_prefix = work[at] >= pc.sequences;
    z = work[at + 1u], chunk = work[at + 2u], block = work[at + 3u];
    g_kv_first = work[seq + PAGED_SEQ_KV_FIRST];
    g_kv_len = g_kv_end = work[seq + PAGED_SEQ_KV_LEN];
    g_q_first = work[seq + PAGED_SEQ_Q_FIRST];
    g_q_len = work[seq + PAGED_SEQ_Q_LEN];
    g_rows = pc.q_heads / pc.kv_heads * g_q_len;
    g_chunks = work[seq + PAGED_SEQ_CHUNKS];
    g_part = work[seq + PAGED_SEQ_PART_BASE];
    g_offset = int(work[seq + PAGED_SEQ_OFFSET]);
    g_table = work[seq + PAGED_SEQ_TABLE] * pc.max_pages;
    g_kv_base = work[seq + PAGED_SEQ_KV_BASE];
#else
    const uint wx = gl_WorkGroupID.x + pc.group_x;
    block = wx % pc.row_blocks, chunk = wx / pc.row_blocks;
    z = gl_WorkGroupID.z + pc.group_z;
    g_rows = pc.rows, g_q_len = pc.q_len, g_kv_len = pc.kv_len, g_offset = pc.causal_offset;
    g_kv_first = pc.kv_first, g_kv_end = pc.kv_end, g_part = 0u, g_chunks = pc.chunks;
#endif
}

/// K/V row of key j of group z whose first row is kbase: kbase + j, or through the block table
/// (from the sequence's base key).
uint key_row(uint kbase, uint j) {
#ifdef QKV_PAGED
    const uint jj = j + g_kv_base;
    // Clamped into the pool's pages: an entry of a device table is checked during the run
    // (paged_table.comp), after which the call fails, and must never read outside the pool before.
    const uint page = min(uint(block_table[g_table + (jj >> pc.page_shift)]), (pc.pool_rows >> pc.page_shift) - 1u);
    return kbase + (page << pc.page_shift) + (jj & ((1u << pc.page_shift) - 1u));
#else
    return kbase + j;
#endif
}

#ifdef QKV_PAGED
/// The query row of q (of total_q) that row r of the item holds: through a shared prefix's row list.
uint row_token(uint r) { return g_prefix ? work[g_q_first + r % g_q_len] : g_q_first + r % g_q_len; }
#endif

/// The first Q texel of row r of group z.
uint q_row(uint z, uint r) {
#ifdef QKV_PAGED
    return (row_token(r) * pc.q_heads + z * (g_rows / g_q_len) + r / g_q_len) * E4;
#else
    return (z * g_rows + r) * E4;
#endif
}

/// The guard's rows pass over q (GUARD), in the workgroups of chunk 0: the norm of row r of group z
/// (where a row of the group) into its (batch, query head)'s word, a NaN or Inf into the flags
/// (contract/decode.h).
void guard_fold(uint chunk, uint z, uint r, float norm, bool bad) {
#ifndef QKV_PAGED
    if (GUARD == 0u || chunk != 0u || r >= g_rows) return;
    atomicMax(guard_words[GUARD_HEADER_WORDS + (z * g_rows + r) / g_q_len], floatBitsToUint(norm));
    if (bad) atomicOr(guard_words[GUARD_WORD_FLAGS], GUARD_FLAG_INPUT_NONFINITE);
#endif
}

/// The same for row r of group z, whose first texel is `at`, read again from q's texels.
void guard_q_row(uint chunk, uint z, uint r, uint at) {
#ifndef QKV_PAGED
    if (GUARD == 0u || chunk != 0u || r >= g_rows) return;
    bool bad = false;
    const float norm = q_texel_norm(at, E4, bad);
    guard_fold(chunk, z, r, norm, bad);
#endif
}

/// The partial state's slot of row r of group z for a chunk: a shared prefix's rows write into
/// their own sequences' slots, after those of the sequence's own chunks and of the prefixes nested
/// in it (its tail, contract/paged.h).
uint partial_at(uint z, uint r, uint chunk) {
#ifdef QKV_PAGED
    if (g_prefix) {
        const uint t = row_token(r), seq = work[pc.token_base + t] * PAGED_SEQ_WORDS;
        const uint L = work[seq + PAGED_SEQ_Q_LEN], P = work[seq + PAGED_SEQ_CHUNKS];
        const uint row = (z * (g_rows / g_q_len) + r / g_q_len) * L + t - work[seq + PAGED_SEQ_Q_FIRST];
        return work[seq + PAGED_SEQ_PART_BASE] + row * P + P - g_part + chunk;
    }
#endif
    return g_part + (z * g_rows + r) * g_chunks + chunk;
}

/// Row r's position p (i + off') and its distance to its nearest key (ALiBi's reference): a shared
/// prefix's rows at their own sequences' positions.
ivec2 row_place(uint r) {
    const uint rr = min(r, g_rows - 1u);
#ifdef QKV_PAGED
    if (g_prefix) {
        const uint t = row_token(rr), seq = work[pc.token_base + t] * PAGED_SEQ_WORDS;
        const int p = int(t - work[seq + PAGED_SEQ_Q_FIRST]) + int(work[seq + PAGED_SEQ_OFFSET]);
        return ivec2(p, nearest_key_distance(p, work[seq + PAGED_SEQ_KV_LEN]));
    }
#endif
    const int p = int(rr % g_q_len) + g_offset;
    return ivec2(p, nearest_key_distance(p, g_kv_len));
}

/// The ALiBi slope of row r's query head (0 without ALiBi).
float row_slope(uint r, uint kv_head) {
    if ((FEATURES & SCORE_ALIBI) == 0u) return 0.0;
    const uint rr = min(r, g_rows - 1u);
    return head_values[kv_head * (g_rows / g_q_len) + rr / g_q_len].x;
}

/// The score of (row r, key j) after the score rules (score_rules.glsl): -inf where not allowed.
/// `place`: row_place(r).
float masked_score(float s, uint r, uint key, uint kv_end, uint batch, uint kv_head, float slope, ivec2 place) {
    const uint rr = min(r, g_rows - 1u);
    const uint i = rr % g_q_len;
    const uint h = kv_head * (g_rows / g_q_len) + rr / g_q_len;
    const uint kk = min(key, g_kv_len - 1u);
    bool bit = true;
    float add = 0.0;
#ifndef QKV_PAGED  // the paged decode takes no masks
    const uint mi = batch * pc.mask_b + h * pc.mask_h + i * pc.mask_i + kk * pc.mask_j;
    if (HAS_MASK) bit = ((mask_bits[mi >> 5u] >> (mi & 31u)) & 1u) != 0u;
    if (HAS_ADD) add = additive[mi];
#endif
    const float v = rule_score(s, int(key) - place.x, place.y, FEATURES, MASKS, sp, slope, bit, add);
    return r < g_rows && key < kv_end ? v : score_neg_inf();
}

/// Whether the causal rule may mask a key of the step from j0: past the first row's position
/// (row i sees keys up to i + offset, and every row block may hold an i of 0). Steps before it need
/// no rules at all where no other rule is on (the decode's L = 1 sees every key).
bool causal_cuts(uint j0) { return CAUSAL && int(j0 + KPS - 1u) > g_offset; }

/// Keys [begin, end) of this workgroup's chunk, within the keys some row may see.
uvec2 key_range(uint chunk) {
    const uint begin = min(g_kv_end, g_kv_first + chunk * pc.chunk);
    return uvec2(begin, min(g_kv_end, begin + pc.chunk));
}

#ifndef QKV_DECODE_GPU

void decode(const bool careful) {
    const float neg_inf = uintBitsToFloat(0xff800000u);
    const uint BLOCK = WG * RPI;
    uint block, chunk, z;
    locate(block, chunk, z);
    const uint batch = z / pc.kv_heads, kv_head = z % pc.kv_heads;
    const uint lane = gl_LocalInvocationID.x;
    const uint row0 = block * BLOCK;
#ifdef QKV_PAGED
    const uint kbase = z * pc.pool_rows;
#else
    const uint kbase = z * pc.kv_stride;
#endif
    sp = no_score_params();
    if (FEATURES != 0u) sp = score_in;
    float slope[RPI];
    ivec2 place[RPI];
    [[unroll]] for (uint i = 0; i < RPI; ++i) {
        slope[i] = row_slope(row0 + i * WG + lane, kv_head);
        place[i] = row_place(row0 + i * WG + lane);
    }

    vec4 q[RPI * E4];
    [[unroll]] for (uint i = 0; i < RPI; ++i) {
        const uint r = min(row0 + i * WG + lane, g_rows - 1u);
        [[unroll]] for (uint c = 0; c < E4; ++c) q[i * E4 + c] = texelFetch(q_tex, int(q_row(z, r) + c));
#ifndef QKV_PAGED
        if (GUARD != 0u && chunk == 0u) {  // the guard's norm of the row from the registers just read
            float gm = 0.0, gs = 0.0;
            bool bad = false;
            [[unroll]] for (uint c = 0; c < E4; ++c) guard_max4(q[i * E4 + c], gm, bad);
            if (gm > 0.0) [[unroll]] for (uint c = 0; c < E4; ++c) guard_sum4(q[i * E4 + c], gm, gs);
            guard_fold(chunk, z, row0 + i * WG + lane, gm * sqrt(gs), bad);
        }
#endif
        [[unroll]] for (uint c = 0; c < E4; ++c) q[i * E4 + c] *= pc.scale;
    }
    float m[RPI], l[RPI];
    vec4 acc[RPI * EV4];
    [[unroll]] for (uint i = 0; i < RPI; ++i) {
        m[i] = neg_inf;
        l[i] = 0.0;
        [[unroll]] for (uint c = 0; c < EV4; ++c) acc[i * EV4 + c] = vec4(0.0);
    }

    const uvec2 range = key_range(chunk);
    const uint last = max(range.y, 1u) - 1u;  // keys past the end re-read the last key, with weight 0
    for (uint j0 = range.x; j0 < range.y; j0 += KPS) {
#ifdef QKV_SHUFFLE
        const uint ROUNDS = (KPS + WG - 1u) / WG;
        uint mine[ROUNDS];  // lane i fetches key j0 + r·WG + i of the step (clamped)
        [[unroll]] for (uint r = 0; r < ROUNDS; ++r)
            mine[r] = key_row(kbase, min(j0 + min(r * WG + gl_SubgroupInvocationID, KPS - 1u), last));
#else
        uint at[KPS];
        [[unroll]] for (uint j = 0; j < KPS; ++j) at[j] = key_row(kbase, min(j0 + j, last));
#endif
        float s[RPI * KPS];
        [[unroll]] for (uint k = 0; k < RPI * KPS; ++k) s[k] = 0.0;
        [[unroll]] for (uint c = 0; c < E4; ++c) {
#ifdef QKV_SHUFFLE
            vec4 fetched[ROUNDS];
            [[unroll]] for (uint r = 0; r < ROUNDS; ++r) fetched[r] = k_texel(mine[r], c);
#endif
            [[unroll]] for (uint j = 0; j < KPS; ++j) {
#ifdef QKV_SHUFFLE
                const vec4 kv = subgroupShuffle(fetched[j / WG], j % WG);
#else
                const vec4 kv = k_texel(at[j], c);
#endif
                [[unroll]] for (uint i = 0; i < RPI; ++i) s[i * KPS + j] += dot(q[i * E4 + c], kv);
            }
        }
        if (EVERY_STEP || HAS_MASK || HAS_ADD || j0 + KPS > range.y || causal_cuts(j0)) {
            [[unroll]] for (uint i = 0; i < RPI; ++i)
                [[unroll]] for (uint j = 0; j < KPS; ++j)
                    s[i * KPS + j] = masked_score(s[i * KPS + j], row0 + i * WG + lane, j0 + j, range.y, batch, kv_head,
                                                  slope[i], place[i]);
        }
        [[unroll]] for (uint i = 0; i < RPI; ++i) {
            float mx = s[i * KPS];
            [[unroll]] for (uint j = 1; j < KPS; ++j) mx = max(mx, s[i * KPS + j]);
            const float m_new = max(m[i], mx);
            const float m_use = m_new == neg_inf ? 0.0 : m_new;  // nothing allowed yet: no -inf - -inf
            const float alpha = exp(m[i] - m_use);
            float sum = 0.0;
            [[unroll]] for (uint j = 0; j < KPS; ++j) {
                const float x = s[i * KPS + j];
                const float p = x == neg_inf ? MASKED_WEIGHT : exp(x - m_use);
                s[i * KPS + j] = p * pc.v_scale;  // the values accumulate scaled (exact: a power of two)
                sum += p;
            }
            l[i] = l[i] * alpha + sum;
            m[i] = m_new;
            if (careful)
                [[unroll]] for (uint c = 0; c < EV4; ++c) acc[i * EV4 + c] = rescaled(acc[i * EV4 + c], alpha);
            else
                [[unroll]] for (uint c = 0; c < EV4; ++c) acc[i * EV4 + c] *= alpha;
        }
        [[unroll]] for (uint c = 0; c < EV4; ++c) {
#ifdef QKV_SHUFFLE
            vec4 fetched[ROUNDS];
            [[unroll]] for (uint r = 0; r < ROUNDS; ++r) fetched[r] = v_texel(mine[r], c);
#endif
            [[unroll]] for (uint j = 0; j < KPS; ++j) {
#ifdef QKV_SHUFFLE
                const vec4 vv = subgroupShuffle(fetched[j / WG], j % WG);
#else
                const vec4 vv = v_texel(at[j], c);
#endif
                [[unroll]] for (uint i = 0; i < RPI; ++i) {
                    const float p = s[i * KPS + j];
                    if (careful)
                        acc[i * EV4 + c] += weighted(p, vv);
                    else
                        acc[i * EV4 + c] += p * vv;
                }
            }
        }
    }

    [[unroll]] for (uint i = 0; i < RPI; ++i) {
        const uint r = row0 + i * WG + lane;
        if (r >= g_rows) continue;
        const uint at = partial_at(z, r, chunk);
        stats[at] = vec2(m[i], l[i]);
        [[unroll]] for (uint c = 0; c < EV4; ++c) acc_out[at * EV4 + c] = acc[i * EV4 + c];
    }
}

// The wide form (TB > 0): the same steps as decode(), with loops over E and Ev of TB texels an
// iteration, Q fetched per texel and the accumulator in acc_out (this workgroup's partial slot of
// each of its rows, which no other workgroup touches). Loop iterations per invocation: EV4 / TB
// to clear the accumulator, then per key step 1 + E4 / TB + EV4 / TB (decode_plan.cpp counts them).
void decode_wide(const bool careful) {
    const float neg_inf = uintBitsToFloat(0xff800000u);
    const uint BLOCK = WG * RPI;
    uint block, chunk, z;
    locate(block, chunk, z);
    const uint batch = z / pc.kv_heads, kv_head = z % pc.kv_heads;
    const uint lane = gl_LocalInvocationID.x;
    const uint row0 = block * BLOCK;
#ifdef QKV_PAGED
    const uint kbase = z * pc.pool_rows;
#else
    const uint kbase = z * pc.kv_stride;
#endif
    sp = no_score_params();
    if (FEATURES != 0u) sp = score_in;
    float slope[RPI];
    ivec2 place[RPI];
    uint q_at[RPI], acc_at[RPI];  // first texel of each row's Q and of its partial accumulator
    bool owns[RPI];               // a row of the group (lanes past the last row compute its copy)
    [[unroll]] for (uint i = 0; i < RPI; ++i) {
        slope[i] = row_slope(row0 + i * WG + lane, kv_head);
        place[i] = row_place(row0 + i * WG + lane);
        owns[i] = row0 + i * WG + lane < g_rows;
        const uint r = min(row0 + i * WG + lane, g_rows - 1u);
        q_at[i] = q_row(z, r);
        acc_at[i] = partial_at(z, r, chunk) * EV4;
        guard_q_row(chunk, z, row0 + i * WG + lane, q_at[i]);
    }
    float m[RPI], l[RPI];
    [[unroll]] for (uint i = 0; i < RPI; ++i) {
        m[i] = neg_inf;
        l[i] = 0.0;
    }
    for (uint cb = 0; cb < EV4; cb += TBX)
        [[unroll]] for (uint i = 0; i < RPI; ++i)
            [[unroll]] for (uint cc = 0; cc < TBX; ++cc)
                if (owns[i]) acc_out[acc_at[i] + cb + cc] = vec4(0.0);

    const uvec2 range = key_range(chunk);
    const uint last = max(range.y, 1u) - 1u;  // keys past the end re-read the last key, with weight 0
    for (uint j0 = range.x; j0 < range.y; j0 += KPS) {
#ifdef QKV_SHUFFLE
        const uint ROUNDS = (KPS + WG - 1u) / WG;
        uint mine[ROUNDS];  // lane i fetches key j0 + r·WG + i of the step (clamped)
        [[unroll]] for (uint r = 0; r < ROUNDS; ++r)
            mine[r] = key_row(kbase, min(j0 + min(r * WG + gl_SubgroupInvocationID, KPS - 1u), last));
#else
        uint at[KPS];
        [[unroll]] for (uint j = 0; j < KPS; ++j) at[j] = key_row(kbase, min(j0 + j, last));
#endif
        float s[RPI * KPS];
        [[unroll]] for (uint k = 0; k < RPI * KPS; ++k) s[k] = 0.0;
        for (uint cb = 0; cb < E4; cb += TBX) {
#ifdef QKV_SHUFFLE
            vec4 fetched[ROUNDS * TBX];  // round r's key, texels cb .. cb + TB - 1
            [[unroll]] for (uint r = 0; r < ROUNDS; ++r) {
#ifdef QKV_KV_BLOCKS
                vec4 b8[8];
                k_block_texels(mine[r] * K_ROW_BYTES, cb / 8u, KV_FORMAT == DECODE_KV_Q8_0, b8);
                [[unroll]] for (uint cc = 0; cc < TBX; ++cc) fetched[r * TBX + cc] = b8[cc];
#else
                [[unroll]] for (uint cc = 0; cc < TBX; ++cc) fetched[r * TBX + cc] = k_texel(mine[r], cb + cc);
#endif
            }
#endif
            [[unroll]] for (uint cc = 0; cc < TBX; ++cc) {
                vec4 qv[RPI];
                [[unroll]] for (uint i = 0; i < RPI; ++i) qv[i] = texelFetch(q_tex, int(q_at[i] + cb + cc)) * pc.scale;
                [[unroll]] for (uint j = 0; j < KPS; ++j) {
#ifdef QKV_SHUFFLE
                    const vec4 kv = subgroupShuffle(fetched[(j / WG) * TBX + cc], j % WG);
#else
                    const vec4 kv = k_texel(at[j], cb + cc);
#endif
                    [[unroll]] for (uint i = 0; i < RPI; ++i) s[i * KPS + j] += dot(qv[i], kv);
                }
            }
        }
        if (EVERY_STEP || HAS_MASK || HAS_ADD || j0 + KPS > range.y || causal_cuts(j0)) {
            [[unroll]] for (uint i = 0; i < RPI; ++i)
                [[unroll]] for (uint j = 0; j < KPS; ++j)
                    s[i * KPS + j] = masked_score(s[i * KPS + j], row0 + i * WG + lane, j0 + j, range.y, batch, kv_head,
                                                  slope[i], place[i]);
        }
        float alpha[RPI];
        [[unroll]] for (uint i = 0; i < RPI; ++i) {
            float mx = s[i * KPS];
            [[unroll]] for (uint j = 1; j < KPS; ++j) mx = max(mx, s[i * KPS + j]);
            const float m_new = max(m[i], mx);
            const float m_use = m_new == neg_inf ? 0.0 : m_new;  // nothing allowed yet: no -inf - -inf
            alpha[i] = exp(m[i] - m_use);
            float sum = 0.0;
            [[unroll]] for (uint j = 0; j < KPS; ++j) {
                const float x = s[i * KPS + j];
                const float p = x == neg_inf ? MASKED_WEIGHT : exp(x - m_use);
                s[i * KPS + j] = p * pc.v_scale;  // the values accumulate scaled (exact: a power of two)
                sum += p;
            }
            l[i] = l[i] * alpha[i] + sum;
            m[i] = m_new;
        }
        // acc = acc·alpha + Σ_j p_j·v_j, a TB-texel slice of Ev at a time
        for (uint cb = 0; cb < EV4; cb += TBX) {
#ifdef QKV_SHUFFLE
            vec4 fetched[ROUNDS * TBX];
            [[unroll]] for (uint r = 0; r < ROUNDS; ++r) {
#ifdef QKV_KV_BLOCKS
                vec4 b8[8];
                v_block_texels(mine[r] * V_ROW_BYTES, cb / 8u, KV_FORMAT == DECODE_KV_Q8_0, b8);
                [[unroll]] for (uint cc = 0; cc < TBX; ++cc) fetched[r * TBX + cc] = b8[cc];
#else
                [[unroll]] for (uint cc = 0; cc < TBX; ++cc) fetched[r * TBX + cc] = v_texel(mine[r], cb + cc);
#endif
            }
#endif
            [[unroll]] for (uint cc = 0; cc < TBX; ++cc) {
                vec4 a[RPI];
                [[unroll]] for (uint i = 0; i < RPI; ++i) {
                    const vec4 old = owns[i] ? acc_out[acc_at[i] + cb + cc] : vec4(0.0);  // no read of another lane's row
                    a[i] = careful ? rescaled(old, alpha[i]) : old * alpha[i];
                }
                [[unroll]] for (uint j = 0; j < KPS; ++j) {
#ifdef QKV_SHUFFLE
                    const vec4 vv = subgroupShuffle(fetched[(j / WG) * TBX + cc], j % WG);
#else
                    const vec4 vv = v_texel(at[j], cb + cc);
#endif
                    [[unroll]] for (uint i = 0; i < RPI; ++i) {
                        const float p = s[i * KPS + j];
                        if (careful)
                            a[i] += weighted(p, vv);
                        else
                            a[i] += p * vv;
                    }
                }
                [[unroll]] for (uint i = 0; i < RPI; ++i)
                    if (owns[i]) acc_out[acc_at[i] + cb + cc] = a[i];
            }
        }
    }

    [[unroll]] for (uint i = 0; i < RPI; ++i)
        if (owns[i]) stats[partial_at(z, row0 + i * WG + lane, chunk)] = vec2(m[i], l[i]);
}

#else  // QKV_DECODE_GPU

const uint OUTS = (RPI * EV4 + WG - 1u) / WG;  // (row, texel) outputs per invocation

shared vec4 q_sh[RPI * E4];
shared float p_sh[RPI * WG];
shared float red_sh[RPI * WG];

void decode(const bool careful) {
    const float neg_inf = uintBitsToFloat(0xff800000u);
    uint block, chunk, z;
    locate(block, chunk, z);
    const uint batch = z / pc.kv_heads, kv_head = z % pc.kv_heads;
    const uint t = gl_LocalInvocationID.x;
    const uint row0 = block * RPI;
    const uint kbase = z * pc.kv_stride;
    sp = no_score_params();
    if (FEATURES != 0u) sp = score_in;
    float slope[RPI];
    ivec2 place[RPI];
    [[unroll]] for (uint r = 0; r < RPI; ++r) {
        slope[r] = row_slope(row0 + r, kv_head);
        place[r] = row_place(row0 + r);
    }

    [[unroll]] for (uint k = 0; k < (RPI * E4 + WG - 1u) / WG; ++k) {
        const uint idx = t + k * WG;
        if (idx < RPI * E4) {
            const uint r = row0 + idx / E4;
            q_sh[idx] = r < pc.rows ? texelFetch(q_tex, int((z * pc.rows + r) * E4 + idx % E4)) * pc.scale : vec4(0.0);
        }
    }
    for (uint r = t; r < RPI; r += WG) guard_q_row(chunk, z, row0 + r, q_row(z, min(row0 + r, g_rows - 1u)));
    barrier();

    float m[RPI];
    [[unroll]] for (uint r = 0; r < RPI; ++r) m[r] = neg_inf;
    vec4 acc[OUTS];
    float l[OUTS];
    [[unroll]] for (uint k = 0; k < OUTS; ++k) {
        acc[k] = vec4(0.0);
        l[k] = 0.0;
    }

    const uvec2 range = key_range(chunk);
    const uint last = max(range.y, 1u) - 1u;
    for (uint j0 = range.x; j0 < range.y; j0 += WG) {
        // 1. one key per invocation, scores against every row of the block
        const uint key = j0 + t;
        const uint at = kbase + min(key, last);
        float s[RPI];
        [[unroll]] for (uint r = 0; r < RPI; ++r) s[r] = 0.0;
        if (E4 <= DECODE_GPU_UNROLLED_TEXELS) {  // a constant: one of the two loops is built
            [[unroll]] for (uint c = 0; c < E4; ++c) {
                const vec4 kv = k_texel(at, c);
                [[unroll]] for (uint r = 0; r < RPI; ++r) s[r] += dot(q_sh[r * E4 + c], kv);
            }
        } else {  // wide heads: a loop (Q is in shared memory, so nothing is indexed in registers)
            [[dont_unroll]] for (uint c = 0; c < E4; ++c) {
                const vec4 kv = k_texel(at, c);
                [[unroll]] for (uint r = 0; r < RPI; ++r) s[r] += dot(q_sh[r * E4 + c], kv);
            }
        }
        [[unroll]] for (uint r = 0; r < RPI; ++r) s[r] = masked_score(s[r], row0 + r, key, range.y, batch, kv_head, slope[r], place[r]);

        // 2. the tile's maximum of each row
        float mx[RPI];
        if (SUBGROUP != 0u) {
            [[unroll]] for (uint r = 0; r < RPI; ++r) {
                const float sm = subgroupMax(s[r]);
                if (subgroupElect()) red_sh[r * WG + gl_SubgroupID] = sm;
            }
            barrier();
            [[unroll]] for (uint r = 0; r < RPI; ++r) {
                mx[r] = neg_inf;
                for (uint g = 0; g < gl_NumSubgroups; ++g) mx[r] = max(mx[r], red_sh[r * WG + g]);
            }
        } else {
            [[unroll]] for (uint r = 0; r < RPI; ++r) red_sh[r * WG + t] = s[r];
            for (uint stride = WG / 2u; stride > 0u; stride /= 2u) {
                barrier();
                if (t < stride)
                    [[unroll]] for (uint r = 0; r < RPI; ++r)
                        red_sh[r * WG + t] = max(red_sh[r * WG + t], red_sh[r * WG + t + stride]);
            }
            barrier();
            [[unroll]] for (uint r = 0; r < RPI; ++r) mx[r] = red_sh[r * WG];
        }

        // 3. weights into shared memory, the rescale factor of every row
        float alpha[RPI];
        [[unroll]] for (uint r = 0; r < RPI; ++r) {
            const float m_new = max(m[r], mx[r]);
            const float m_use = m_new == neg_inf ? 0.0 : m_new;
            alpha[r] = exp(m[r] - m_use);
            m[r] = m_new;
            p_sh[r * WG + t] = s[r] == neg_inf ? MASKED_WEIGHT : exp(s[r] - m_use);
        }
        barrier();

        // 4. each invocation's (row, texel) outputs over the tile's keys
        [[unroll]] for (uint k = 0; k < OUTS; ++k) {
            const uint idx = t + k * WG;
            if (idx < RPI * EV4) {
                const uint r = idx / EV4, c = idx % EV4;
                float a_r = 1.0;
                [[unroll]] for (uint rr = 0; rr < RPI; ++rr)
                    if (rr == r) a_r = alpha[rr];
                vec4 a = careful ? rescaled(acc[k], a_r) : acc[k] * a_r;
                float ls = l[k] * a_r;
                for (uint j = 0; j < WG; ++j) {
                    const float p = p_sh[r * WG + j];
                    const vec4 vv = v_texel(kbase + min(j0 + j, last), c);
                    // the values accumulate scaled by pc.v_scale (exact: a power of two)
                    if (careful)
                        a += weighted(p * pc.v_scale, vv);
                    else
                        a += (p * pc.v_scale) * vv;
                    ls += p;
                }
                acc[k] = a;
                l[k] = ls;
            }
        }
        barrier();  // p_sh and red_sh are overwritten by the next tile
    }

    [[unroll]] for (uint k = 0; k < OUTS; ++k) {
        const uint idx = t + k * WG;
        if (idx >= RPI * EV4) continue;
        const uint r = idx / EV4, c = idx % EV4;
        if (row0 + r >= pc.rows) continue;
        const uint at = (z * pc.rows + row0 + r) * pc.chunks + chunk;
        float m_r = neg_inf;
        [[unroll]] for (uint rr = 0; rr < RPI; ++rr)
            if (rr == r) m_r = m[rr];
        if (c == 0u) stats[at] = vec2(m_r, l[k]);
        acc_out[at * EV4 + c] = acc[k];
    }
}

#endif

// Each call of decode() is inlined with its constant argument: two specialised bodies where the
// pipeline is gated, one otherwise.
void main() {
#ifdef QKV_PAGED
    if (gl_WorkGroupID.x + pc.group_x >= pc.items) return;  // uniform: the whole workgroup
#endif
#ifndef QKV_DECODE_GPU
    if (TB != 0u) {  // a constant: one form is built
        if (careful_values())
            decode_wide(true);
        else
            decode_wide(false);
        return;
    }
#endif
    if (careful_values())
        decode(true);
    else
        decode(false);
}
