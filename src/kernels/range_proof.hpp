// The host's side of the range guard (range_guard.hpp has the rule): the facts one pass over a
// call's host inputs gives, the proof from them that the device guard need not run, and the
// verdicts the host gives by itself. Pure functions of the plan and the host data (part of
// qkv_plan: no Vulkan; tests/range_proof_test.cpp).
#pragma once

#include <cstdint>

#include "plan/attention_plan.hpp"
#include "qkv/runtime/problem.hpp"

namespace qkv::vulkan::detail {

/// What the host knows about a call's inputs, from one pass over them.
struct input_facts {
    bool projection_inputs_finite = true;  ///< x, wq, wk, wv and their biases
    double x_row_norm = 0;                 ///< the largest Euclidean norm of a row of x (inf if not finite)
    bool output_inputs_finite = true;      ///< wo and bo
    bool additive_nan_or_pos_inf = false;  ///< an additive-mask entry that makes its row NaN
    double additive_max = 0;               ///< largest |finite additive-mask entry|
    [[nodiscard]] bool every_output_defined() const {
        return projection_inputs_finite && output_inputs_finite && !additive_nan_or_pos_inf;
    }
};

input_facts scan_inputs(const attention_problem& problem);

/// Whether the host's bounds (see above) prove that every check of the guard passes for this call,
/// so that the device guard need not run. False where they cannot: inputs that are not all
/// finite, bounds beyond a limit (the exact values may still be within it), or a projection split
/// over several dispatches in float16 (each rounds its partial sums).
[[nodiscard]] bool range_proven_on_host(const plan& p, const attention_problem& problem, const input_facts& facts);

/// After the readback: throws numeric_overflow for a non-finite output (or weight) where every
/// input was finite.
void check_outputs(const attention_output& result, const plan& p, const input_facts& facts);

/// What to do about an overflow of `p`, for messages ("use precision fp32 instead of fp16, ...").
const char* advice(const plan& p);

/// Throws numeric_overflow for the projected element `index` (of the Q|K|V rows) that the device
/// found not finite: with its exact float64 value where the host inputs are known (`problem`).
[[noreturn]] void nonfinite_projection(const plan& p, const attention_problem* problem, std::uint32_t index);

}  // namespace qkv::vulkan::detail
