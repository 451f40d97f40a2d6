#version 450
#extension GL_GOOGLE_include_directive : require
// A block table or the lengths on the device, checked and mapped there (contract/paged.h:
// paged_table_push): PAGED_TABLE_LENGTHS checks each sequence's length from the lengths tensor,
// writes the work words and the table spans it gives (flagging a bad one); PAGED_TABLE_CHECK flags
// an entry a sequence reads or writes that is no page of the pool; PAGED_TABLE_MAP turns the new
// rows' table keys into pool rows, none at all once flagged; PAGED_TABLE_POSITIONS writes the
// rotary positions at the device lengths.
#include "contract/paged.h"

layout(local_size_x = PAGED_TABLE_WORKGROUP, local_size_y = 1, local_size_z = 1) in;
layout(std430, binding = PAGED_TABLE_BINDING_TABLE) readonly buffer Table { int table[]; };
layout(std430, binding = PAGED_TABLE_BINDING_SPANS) buffer Spans { uint spans[]; };
layout(std430, binding = PAGED_TABLE_BINDING_AT_IN) readonly buffer AtIn { uint at_in[]; };
layout(std430, binding = PAGED_TABLE_BINDING_AT_OUT) writeonly buffer AtOut { uint at_out[]; };
layout(std430, binding = PAGED_TABLE_BINDING_FLAG) buffer Flag { uint flag[]; };
layout(std430, binding = PAGED_TABLE_BINDING_LENGTHS) readonly buffer Lengths { int lengths[]; };
layout(std430, binding = PAGED_TABLE_BINDING_WORK) buffer Work { uint work[]; };
layout(push_constant) uniform Push { paged_table_push pc; };

bool outside(int page) { return page < 0 || uint(page) >= pc.num_pages; }

/// Sequence b's length from the tensor, 0 once any length or entry is flagged (nothing is then
/// read or written through it: the run fails).
uint length_of(uint b) { return flag[0] != 0u ? 0u : uint(max(lengths[b], 0)); }

void main() {
    const uint i = (gl_WorkGroupID.x + pc.group_x) * PAGED_TABLE_WORKGROUP + gl_LocalInvocationID.x;
    if (i >= pc.count) return;
    if (pc.mode == PAGED_TABLE_LENGTHS) {
        // Sequence i: keys [base, len + new rows) of a table row of max_pages << page_shift keys.
        const uint at = i * PAGED_SEQ_WORDS, base = work[at + PAGED_SEQ_KV_BASE];
        const uint capacity = pc.max_pages << pc.page_shift;
        const int len = lengths[i];
        const bool bad = len < 0 || uint(len) < base || uint(len) > capacity - pc.new_rows;
        if (bad) atomicOr(flag[0], PAGED_FLAG_LENGTH);
        const uint end = bad ? base : uint(len) + pc.new_rows;
        work[at + PAGED_SEQ_KV_LEN] = end - base;
        if (pc.offset_rule == PAGED_OFFSET_BOTTOM_RIGHT)
            work[at + PAGED_SEQ_OFFSET] = uint(int(end - base) - int(work[at + PAGED_SEQ_Q_LEN]));
        spans[2u * i] = end == 0u ? 0u : base >> pc.page_shift;
        spans[2u * i + 1u] = (end + (1u << pc.page_shift) - 1u) >> pc.page_shift;
        return;
    }
    if (pc.mode == PAGED_TABLE_CHECK) {
        const uint b = i / pc.max_pages, c = i - b * pc.max_pages;
        if (c >= spans[2u * b] && c < spans[2u * b + 1u] && outside(table[i])) atomicOr(flag[0], PAGED_FLAG_ENTRY);
        return;
    }
    if (pc.mode == PAGED_TABLE_POSITIONS) {  // (sequence, position less its length) pairs
        at_out[i] = length_of(at_in[2u * i]) + at_in[2u * i + 1u];
        return;
    }
    // The key of new row i in the table: the host's, or with the device lengths the host's at
    // length 0 plus its sequence's length (new row i is row i % new_rows of sequence i / new_rows).
    const uint key = at_in[i] + (pc.lengths != 0u ? length_of(i / pc.new_rows) : 0u);
    const int page = table[key >> pc.page_shift];
    at_out[i] = flag[0] != 0u || outside(page)
                    ? PAGED_ROW_NONE
                    : (uint(page) << pc.page_shift) | (key & ((1u << pc.page_shift) - 1u));
}
