// The range guard: what keeps the Vulkan backend from returning zeros or NaN for finite inputs
// that are too large for float32 (or for float16 storage of Q, K, V).
//
// The rule (README, Guarantees): with every input finite, a call either returns the answer or
// throws numeric_overflow. The device checks, after the projection and before the attention,
//   1. that every element of Q, K and V is finite (a finite input made inf by the projection's
//      float32 sums, or a value beyond 65,504 stored as float16);
//   2. that every score cannot leave float32: max(1, |scale|) · max_i ||q_i|| · max_j ||k_j||
//      (per batch element and head; it bounds every partial sum of every dot product and the
//      scaled score) is at most 2^127, and that plus the largest finite |additive mask entry| is
//      at most FLT_MAX; and max(1, |scale|) · max ||q_i|| (and ||k_j||) is at most 2^127, for
//      kernels that scale Q or K before the dot products;
//   3. that the value sums cannot leave float32: seq · max |v| is at most 2^127 (the online
//      softmax adds up to seq values weighted by at most 1).
// The 2^127 leaves a factor 2 of headroom for the kernels (differences of scores, exp2 with a
// log2(e) factor). A second line of defence on the host: a non-finite output element where every
// input is finite (and no additive mask entry is NaN or +inf) is reported too.
// Where the inputs themselves hold NaN or inf the documented NaN rules apply and check 1 and the
// output check are skipped; checks 2 and 3 use the finite elements only. -inf mask entries are
// always legal.
//
// Most calls never need the device: from one host pass over the inputs (which the finiteness
// check makes anyway) the host bounds every projected element and row norm by Cauchy-Schwarz,
// |q_ij| <= ||x_i||·||Wq[:, j]|| + |bq_j| and ||q_i (head h)|| <= ||x_i||·||Wq_h||_F + ||bq_h||,
// with a margin for the float32 sums; where those bounds already pass checks 1-3, the guard is not
// recorded (range_proven_on_host). Only inputs near the limits, or holding NaN or inf, pay for the
// device pass, and those get its exact verdicts and messages as before.
#pragma once

#include <cstdint>

#include "kernels/range_proof.hpp"
#include "plan/attention_plan.hpp"
#include "qkv/runtime/problem.hpp"
#include "vk/executor.hpp"
#include "vk/memory.hpp"
#include "vk/pipelines.hpp"

namespace qkv::vulkan::detail {

/// The guard's buffers, kept between calls in the dispatcher's buffer cache.
struct range_guard_buffers {
    buffer device, host;  // the result on the device, and its host-visible copy (init and readback)
};

/// Allocates (or reuses) the guard's buffers for `p`; throws out_of_memory.
void prepare_range_guard(allocator& alloc, range_guard_buffers& bufs, const plan& p);

/// Records the guard after the projection (whose writes must already be visible to compute
/// reads): an init copy, one dispatch over every (row, head, Q/K/V chunk), and the readback.
void record_range_guard(recorder& exec, pipeline_set& pipes, const range_guard_buffers& bufs, const plan& p,
                        binding qkv);

/// After the submit: throws numeric_overflow when the guard found a problem (see above).
/// `problem`: the host inputs, for the exact value in a message (null for device tensors).
void check_range_guard(const range_guard_buffers& bufs, const plan& p, const attention_problem* problem,
                       const input_facts& facts);

}  // namespace qkv::vulkan::detail
