// Contract: the mask flags shared by every attention kernel that applies masks (scores.comp,
// aggregate.comp, and the fused kernels), in the `flags` member of their push blocks. See common.h.
#ifndef QKV_CONTRACT_MASK_H
#define QKV_CONTRACT_MASK_H
#include "common.h"

QKV_CONTRACT_BEGIN
QKV_CONST uint MASK_FLAG_CAUSAL = 1u;    // key j > query i is masked
QKV_CONST uint MASK_FLAG_BOOLEAN = 2u;   // a boolean mask (1 = may attend), a bit per element
QKV_CONST uint MASK_FLAG_ADDITIVE = 4u;  // a float mask added to the scaled scores
QKV_CONTRACT_END

#endif
