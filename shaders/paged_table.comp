#version 450
#extension GL_GOOGLE_include_directive : require
// A block table on the device, checked and mapped there (contract/paged.h: paged_table_push):
// PAGED_TABLE_CHECK flags an entry a sequence reads or writes that is no page of the pool;
// PAGED_TABLE_MAP turns the new rows' table keys into pool rows, none at all once flagged.
#include "contract/paged.h"

layout(local_size_x = PAGED_TABLE_WORKGROUP, local_size_y = 1, local_size_z = 1) in;
layout(std430, binding = PAGED_TABLE_BINDING_TABLE) readonly buffer Table { int table[]; };
layout(std430, binding = PAGED_TABLE_BINDING_SPANS) readonly buffer Spans { uint spans[]; };
layout(std430, binding = PAGED_TABLE_BINDING_AT_IN) readonly buffer AtIn { uint at_in[]; };
layout(std430, binding = PAGED_TABLE_BINDING_AT_OUT) writeonly buffer AtOut { uint at_out[]; };
layout(std430, binding = PAGED_TABLE_BINDING_FLAG) buffer Flag { uint flag[]; };
layout(push_constant) uniform Push { paged_table_push pc; };

bool outside(int page) { return page < 0 || uint(page) >= pc.num_pages; }

void main() {
    const uint i = (gl_WorkGroupID.x + pc.group_x) * PAGED_TABLE_WORKGROUP + gl_LocalInvocationID.x;
    if (i >= pc.count) return;
    if (pc.mode == PAGED_TABLE_CHECK) {
        const uint b = i / pc.max_pages, c = i - b * pc.max_pages;
        if (c >= spans[2u * b] && c < spans[2u * b + 1u] && outside(table[i])) atomicOr(flag[0], 1u);
        return;
    }
    const uint key = at_in[i];
    const int page = table[key >> pc.page_shift];
    at_out[i] = flag[0] != 0u || outside(page)
                    ? PAGED_ROW_NONE
                    : (uint(page) << pc.page_shift) | (key & ((1u << pc.page_shift) - 1u));
}
