// Host–shader contract of the batched paged decode: shaders/sdpa_decode.comp and
// shaders/sdpa_merge.comp built with QKV_PAGED, recorded by src/run/run_paged.cpp from the
// plan of src/kernels/paged_plan.hpp.
//
// The pool is a K/V cache of one batch (qkv::vulkan::kv_cache): row n of K/V head h is texel row
// h·pool_rows + n, and page p holds rows p·page_size .. p·page_size + page_size − 1. Key j of
// sequence b is row (block_table[b·max_pages + j' / page_size]·page_size + j' % page_size) with
// j' = j + its KV_BASE (cache_leftpad: its positions count from that key).
//
// Appends (shaders/paged_append.comp, before the decode in the same command buffer): the new rows
// of every K/V head, (Hkv, n, width) elements from src_off of the source, each row r written to
// row at[at_off + r] of the pool, i.e. elements dst_off + (h·pool_rows + at[at_off + r])·width
// onwards, in 32-bit words (width: a row's texels, 4·ceil(E/4) words for an f32 pool, 2·ceil(E/4)
// for an f16 one).
//
// One dispatch over the work list: workgroup x takes item x, (sequence, K/V head, chunk, row
// block), and writes the partial softmax state of each of its rows for chunk `chunk` of the
// sequence's keys [kv_first, kv_len) into slot part_base + (kv head·R_b + row)·P_b + chunk. The merge
// (one invocation per output element of (total_q, Hq, Ev)) combines slot's P_b partials in the order
// 0..P_b−1. The sequences, the token → sequence map and the items travel in one storage buffer of
// 32-bit words (PAGED_BINDING_WORK):
//   [0, B·PAGED_SEQ_WORDS)                   per sequence: PAGED_SEQ_* below
//   [token_base, token_base + total_q)       the sequence of each query row
//   [item_base, item_base + 4·items)         per item: sequence, K/V head, chunk, row block
//
// Shared prefixes (cascade): entries past the B sequences (index >= `sequences`) are the prefixes
// of groups of sequences, nodes of a prefix tree. Such an entry's words: KV_FIRST and KV_LEN its
// keys [KV_FIRST, KV_LEN) (KV_FIRST: its parent node's KV_LEN, 0 at the top), Q_FIRST the word of
// its row list (the group's query rows, one word each, member after member), Q_LEN their count,
// CHUNKS the prefix's chunks, PART_BASE its tail T (its CHUNKS and those of the nodes enclosing
// it), TABLE a member's table row; the others unused. Its row r (head g·L + i of the stacked L
// rows) is query row t = work[Q_FIRST + i] of sequence b = work[token_base + t], scored at b's
// positions, and its partial state for chunk c goes to b's slot
// (kv head·R_b + g·L_b + t − q_first_b)·P_b + P_b − T + c: a member's own items fill its first
// slots (its keys past its deepest node: its KV_FIRST is that node's KV_LEN), then its deepest
// node's, .. the top node's last.
#ifndef QKV_CONTRACT_PAGED_H
#define QKV_CONTRACT_PAGED_H

#include "common.h"
#include "decode.h"

QKV_CONTRACT_BEGIN
struct paged_push {
    uint group_x, group_y, group_z;  // workgroup offset of a split dispatch (executor)
    uint items;                      // work items
    uint item_base;                  // word of the first item
    uint page_shift;                 // log2(page_size)
    uint max_pages;                  // columns of the block table
    uint pool_rows;                  // rows per K/V head in the pool
    uint chunk;                      // keys per chunk
    float scale;
    uint q_heads, kv_heads;  // Hq, Hkv
    float v_scale;           // the values accumulate multiplied by this power of two
    uint sequences;          // B: entries past them are shared prefixes
    uint token_base;         // word of the token → sequence map
};

struct paged_append_push {
    uint group_x, group_y, group_z;
    uint rows;       // n: new rows per K/V head
    uint heads;      // Hkv
    uint width;      // 32-bit words per row
    uint src_off;    // words
    uint dst_off;    // words
    uint pool_rows;  // rows per K/V head in the pool
    uint at_off;     // word of the first row's pool row
};
QKV_CONST uint PAGED_APPEND_BINDING_SRC = 0u;
QKV_CONST uint PAGED_APPEND_BINDING_DST = 1u;
QKV_CONST uint PAGED_APPEND_BINDING_AT = 2u;
QKV_CONST uint PAGED_APPEND_WORKGROUP = 64u;  // local_size_x; PAGED_APPEND_PER_INVOCATION words each
QKV_CONST uint PAGED_ROW_NONE = 0xffffffffu;  // an `at` the append skips (a row through a bad table entry)
QKV_CONST uint PAGED_APPEND_PER_INVOCATION = 16u;

struct paged_merge_push {
    uint group_x, group_y, group_z;
    uint total_q;     // query rows in all
    uint q_heads;     // Hq
    uint kv_heads;    // Hkv
    uint dv;          // Ev
    uint dv_stride;   // floats per partial accumulator (4·ceil(Ev/4))
    uint token_base;  // word of the token → sequence map
};

// Words per sequence, and each word's place.
QKV_CONST uint PAGED_SEQ_WORDS = 9u;
QKV_CONST uint PAGED_SEQ_KV_FIRST = 0u;   // the first key the chunks cover
QKV_CONST uint PAGED_SEQ_KV_LEN = 1u;     // S_b
QKV_CONST uint PAGED_SEQ_Q_FIRST = 2u;    // its first query row
QKV_CONST uint PAGED_SEQ_Q_LEN = 3u;      // L_b
QKV_CONST uint PAGED_SEQ_CHUNKS = 4u;     // P_b
QKV_CONST uint PAGED_SEQ_PART_BASE = 5u;  // a shared prefix's: its tail
QKV_CONST uint PAGED_SEQ_OFFSET = 6u;     // the causal offset off' of contract/score.h, as a 32-bit int
QKV_CONST uint PAGED_SEQ_TABLE = 7u;      // sequence row of the block table (b, or cache_batch_idx)
QKV_CONST uint PAGED_SEQ_KV_BASE = 8u;    // the pool key of its key 0 (cache_leftpad; 0 for a prefix)
QKV_CONST uint PAGED_ITEM_WORDS = 4u;

// Bindings of the paged decode (the decode's, the masks' two replaced) and of its merge (the
// merge's, and the work words).
QKV_CONST uint PAGED_BINDING_TABLE = DECODE_BINDING_MASK;     // storage, int32 block table
QKV_CONST uint PAGED_BINDING_WORK = DECODE_BINDING_ADDITIVE;  // storage, the words above
QKV_CONST uint PAGED_MERGE_BINDING_WORK = MERGE_BINDINGS;     // storage, the words above
QKV_CONST uint PAGED_MERGE_BINDINGS = MERGE_BINDINGS + 1u;

// The fused rotary embedding of a paged_call (shaders/paged_rotary.comp), in place on texel rows
// in qkv's own memory (q's, and the new keys' per K/V head) before the guard, the append and the
// decode read them: one invocation per row r (no two write one word), whose position is
// pos[pos_off + (r / pos_div) % pos_mod]; the first rotary_dim values of the row turned by row
// position of cos and sin (rotary_half = rotary_dim / 2 floats each, from cos_off and sin_off):
// pairs (2j, 2j + 1) when interleaved, else (j, j + rotary_half); x' = x1·cos − x2·sin,
// y' = x1·sin + x2·cos in float32, then stored as the texels' type (RGBA16F with `half`).
struct paged_rotary_push {
    uint group_x, group_y, group_z;
    uint rows;         // texel rows
    uint w4;           // texels per row
    uint at;           // texel of row 0
    uint half_texels;  // 1: RGBA16F texels, else RGBA32F
    uint rotary_half;  // rotary_dim / 2
    uint interleaved;  // 1: pairs (2j, 2j + 1)
    uint pos_off, pos_div, pos_mod;
    uint cos_off, sin_off;  // floats
};
QKV_CONST uint PAGED_ROTARY_BINDING_ROWS = 0u;    // storage, the texels as 32-bit words
QKV_CONST uint PAGED_ROTARY_BINDING_ANGLES = 1u;  // storage, float cos and sin tables
QKV_CONST uint PAGED_ROTARY_BINDING_POS = 2u;     // storage, uint positions
QKV_CONST uint PAGED_ROTARY_WORKGROUP = 64u;
// A block table or the lengths on the device (a paged_call's i32 tensors, the table copied row by
// row into the call's table binding by the device): what they hold cannot be checked before the
// run, so shaders/paged_table.comp does it there, one invocation per element, before the append and
// the decode, a barrier after each dispatch:
//   PAGED_TABLE_LENGTHS    sequence b (lengths as a tensor, copied into the call's memory): len =
//                          lengths[b] must lie
//                          in [KV_BASE, capacity - new_rows] (capacity = max_pages · page_size, the
//                          plan's bound: the work words were written for it); else flag |=
//                          PAGED_FLAG_LENGTH and the sequence gets no keys. Writes its KV_LEN
//                          (len + new_rows - KV_BASE), its OFFSET (KV_LEN - Q_LEN where offset_rule
//                          is PAGED_OFFSET_BOTTOM_RIGHT, else kept) into the work words (the call's
//                          device copy of them), and its spans (below)
//   PAGED_TABLE_CHECK      element i of the sequences x max_pages table: where sequence b = i / max_pages
//                          reads or writes column c = i % max_pages (spans[2b] <= c < spans[2b + 1]), an
//                          entry outside [0, num_pages) sets PAGED_FLAG_ENTRY
//   PAGED_TABLE_MAP        new row r: its key in the table, at_in[r] = (b·max_pages + c)·page_size + row
//                          in page (with `lengths`: the key at length 0, to which the device adds
//                          sequence r / new_rows's length), to its pool row through the table, into
//                          at_out[r]; PAGED_ROW_NONE for every row once a flag is set (the append then
//                          writes nothing at all)
//   PAGED_TABLE_POSITIONS  rotary position r: at_in[2r] its sequence, at_in[2r + 1] its position less
//                          the sequence's length (paged_rotary_position at length 0), into at_out[r]
// The host reads the flag after the run (the call fails: invalid_argument, naming cache_seqlens for
// PAGED_FLAG_LENGTH, else the block table). The decode clamps every page index it reads into the
// pool's pages (contract: key_row of sdpa_decode.comp), so a bad entry never reads outside the pool.
struct paged_table_push {
    uint group_x, group_y, group_z;
    uint mode;         // PAGED_TABLE_*
    uint count;        // invocations: sequences, sequences·max_pages, the new rows or the positions
    uint max_pages;    // columns of the table
    uint page_shift;   // log2(page_size)
    uint num_pages;    // pages of the pool this step may name
    uint new_rows;     // rows appended to each sequence
    uint lengths;      // 1: the lengths are the device's (MAP adds them to the keys)
    uint offset_rule;  // PAGED_OFFSET_KEEP or PAGED_OFFSET_BOTTOM_RIGHT
};
QKV_CONST uint PAGED_TABLE_CHECK = 0u;
QKV_CONST uint PAGED_TABLE_MAP = 1u;
QKV_CONST uint PAGED_TABLE_LENGTHS = 2u;
QKV_CONST uint PAGED_TABLE_POSITIONS = 3u;
QKV_CONST uint PAGED_OFFSET_KEEP = 0u;            // the causal offset does not depend on the length
QKV_CONST uint PAGED_OFFSET_BOTTOM_RIGHT = 1u;    // off' = S_b - L_b
QKV_CONST uint PAGED_FLAG_ENTRY = 1u;             // a table entry a sequence reads or writes is no page
QKV_CONST uint PAGED_FLAG_LENGTH = 2u;            // a length outside [its first key, capacity - new rows]
QKV_CONST uint PAGED_FLAG_SHARED_ROW = 4u;        // two new rows map to one pool row (paged_claim.comp)
QKV_CONST uint PAGED_TABLE_BINDING_TABLE = 0u;    // storage, int32 entries (sequences x max_pages)
QKV_CONST uint PAGED_TABLE_BINDING_SPANS = 1u;    // storage, uint: per sequence its first and end column
QKV_CONST uint PAGED_TABLE_BINDING_AT_IN = 2u;    // storage, uint: the new rows' keys in the table
QKV_CONST uint PAGED_TABLE_BINDING_AT_OUT = 3u;   // storage, uint: their pool rows
QKV_CONST uint PAGED_TABLE_BINDING_FLAG = 4u;     // storage, uint: the PAGED_FLAG_* bits raised
QKV_CONST uint PAGED_TABLE_BINDING_LENGTHS = 5u;  // storage, int32 lengths (B), the call's copy
QKV_CONST uint PAGED_TABLE_BINDING_WORK = 6u;     // storage, the work words (the call's device copy)
QKV_CONST uint PAGED_TABLE_WORKGROUP = 64u;
// The flag words after the verdict (zeroed before the run): word 0 the PAGED_FLAG_* bits raised,
// word 1 the largest pool row + 1 that two new rows claimed (0: none).
QKV_CONST uint PAGED_FLAG_WORDS = 2u;
// Two appends into one pool row through a table or lengths on the device (shaders/paged_claim.comp),
// the device's counterpart of the host's refusal (resolve_pages), after PAGED_TABLE_MAP, one
// invocation per new row r of its mapped pool row rows[r] (PAGED_ROW_NONE: skipped), in three
// dispatches with a barrier after each:
//   PAGED_CLAIM_CLEAR  zeroes claims[rows[r]] (only the words this step claims: no pass over the pool)
//   PAGED_CLAIM_TAKE   swaps r + 1 into claims[rows[r]]; a word already taken sets
//                      PAGED_FLAG_SHARED_ROW in flag[0] and raises flag[1] to at least rows[r] + 1
//   PAGED_CLAIM_DROP   rows[r] = PAGED_ROW_NONE for every row once flag[0] has that bit (the append
//                      then writes nothing at all, as for the other flags)
// claims holds one uint per pool row of the step's num_pages pages. Reading a row another sequence
// appends is no conflict (append, then attend), as on the host.
struct paged_claim_push {
    uint group_x, group_y, group_z;
    uint mode;   // PAGED_CLAIM_*
    uint count;  // the new rows
};
QKV_CONST uint PAGED_CLAIM_CLEAR = 0u;
QKV_CONST uint PAGED_CLAIM_TAKE = 1u;
QKV_CONST uint PAGED_CLAIM_DROP = 2u;
QKV_CONST uint PAGED_CLAIM_BINDING_ROWS = 0u;    // storage, uint: the new rows' pool rows (the map's)
QKV_CONST uint PAGED_CLAIM_BINDING_CLAIMS = 1u;  // storage, uint per pool row
QKV_CONST uint PAGED_CLAIM_BINDING_FLAG = 2u;    // storage, the PAGED_FLAG_WORDS flag words
QKV_CONST uint PAGED_CLAIM_WORKGROUP = 64u;
QKV_CONTRACT_END

QKV_CONTRACT_CHECK(sizeof(qkv::contract::paged_push) == 15u * 4u)
QKV_CONTRACT_CHECK(sizeof(qkv::contract::paged_merge_push) == 9u * 4u)
QKV_CONTRACT_CHECK(sizeof(qkv::contract::paged_append_push) == 10u * 4u)
QKV_CONTRACT_CHECK(sizeof(qkv::contract::paged_rotary_push) == 14u * 4u)
QKV_CONTRACT_CHECK(sizeof(qkv::contract::paged_table_push) == 11u * 4u)
QKV_CONTRACT_CHECK(sizeof(qkv::contract::paged_claim_push) == 5u * 4u)
QKV_CONTRACT_CHECK(sizeof(qkv::contract::paged_push) <= qkv::contract::PUSH_CONSTANT_BYTES_GUARANTEED)

#endif
