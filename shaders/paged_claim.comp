#version 450
#extension GL_GOOGLE_include_directive : require
// Two appends into one pool row through a block table or lengths on the device (contract/paged.h:
// paged_claim_push), after paged_table.comp mapped the new rows to pool rows: PAGED_CLAIM_CLEAR
// zeroes the claim word of each new row's pool row, PAGED_CLAIM_TAKE swaps in the new row's number
// + 1 and raises PAGED_FLAG_SHARED_ROW (with the largest such row + 1 in flag[1]) where the word was
// already taken, PAGED_CLAIM_DROP unmaps every row once that flag is raised. A row at
// PAGED_ROW_NONE (a flagged entry or length) is skipped.
#include "contract/paged.h"

layout(local_size_x = PAGED_CLAIM_WORKGROUP, local_size_y = 1, local_size_z = 1) in;
layout(std430, binding = PAGED_CLAIM_BINDING_ROWS) buffer Rows { uint rows[]; };
layout(std430, binding = PAGED_CLAIM_BINDING_CLAIMS) buffer Claims { uint claims[]; };
layout(std430, binding = PAGED_CLAIM_BINDING_FLAG) buffer Flag { uint flag[]; };
layout(push_constant) uniform Push { paged_claim_push pc; };

void main() {
    const uint i = (gl_WorkGroupID.x + pc.group_x) * PAGED_CLAIM_WORKGROUP + gl_LocalInvocationID.x;
    if (i >= pc.count) return;
    if (pc.mode == PAGED_CLAIM_DROP) {
        if ((flag[0] & PAGED_FLAG_SHARED_ROW) != 0u) rows[i] = PAGED_ROW_NONE;
        return;
    }
    const uint row = rows[i];
    if (row == PAGED_ROW_NONE) return;
    if (pc.mode == PAGED_CLAIM_CLEAR) {
        atomicExchange(claims[row], 0u);  // several new rows of one pool row may clear it at once
        return;
    }
    if (atomicExchange(claims[row], i + 1u) != 0u) {
        atomicOr(flag[0], PAGED_FLAG_SHARED_ROW);
        atomicMax(flag[1], row + 1u);
    }
}
