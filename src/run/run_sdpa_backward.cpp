// run_sdpa_backward: the backward pass of scaled dot-product attention over host data, on the
// kernels of kernels/flash_backward.hpp, in the call skeleton's steps (runs.hpp). Where the caller
// gives no out or lse, the forward runs first (run_sdpa, with its lse) and supplies them.
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "kernels/flash_backward.hpp"
#include "plan/sdpa_backward_plan.hpp"
#include "qkv/vulkan/error.hpp"
#include "run/kv_storage.hpp"
#include "run/run.hpp"

namespace qkv::vulkan::detail {
namespace {

/// Whether every value is finite (-inf allowed where `minus_infinity_ok`).
bool all_finite(std::span<const float> values, bool minus_infinity_ok) {
    for (const float x : values)
        if (!std::isfinite(x) && !(minus_infinity_ok && x == -std::numeric_limits<float>::infinity())) return false;
    return true;
}

}  // namespace

run_result<sdpa_gradients> run_sdpa_backward(run_env& env, const sdpa_backward_problem& given) {
    sdpa_backward_problem problem = given;
    // The forward's out and lse, where they are not given (both from one run).
    sdpa_output forward;
    if (problem.out.empty() || problem.lse.empty()) {
        sdpa_problem f = problem.forward;
        f.options.return_lse = true;
        f.options.return_weights = false;
        forward = run_sdpa(env, f).output;
        problem.out = forward.output;
        problem.lse = forward.lse;
    }
    // plan
    const sdpa_backward_plan p = plan_sdpa_backward(problem, env.core.dev->desc(), env.set);
    const sdpa_plan& fp = p.forward;
    // Q, K, V and dO as their types store them, rounded here where the binding holds float32.
    sdpa_problem stored = problem.forward;
    std::vector<float> q_stored, k_stored, v_stored, d_out_stored;
    std::span<const float> d_out = problem.d_out;
    if (fp.round_q) q_stored = stored_values(element_type::f16, stored.q, "sdpa_backward: q"), stored.q = q_stored;
    if (fp.round_kv) {
        k_stored = stored_values(fp.kv_type, stored.k, "sdpa_backward: k"), stored.k = k_stored;
        v_stored = stored_values(fp.kv_type, stored.v, "sdpa_backward: v"), stored.v = v_stored;
    }
    if (p.d_out_fp16 && !fp.layout.fp16)
        d_out_stored = stored_values(element_type::f16, d_out, "sdpa_backward: d_out"), d_out = d_out_stored;
    // check: the overflow rule on the scores the kernels recompute; what is finite
    const sdpa_facts facts = scan_sdpa(stored);
    check_sdpa_scores(facts, stored.shape, fp.scale, fp.layout.fp16);
    const bool inputs_finite = facts.every_output_defined() && all_finite(d_out, false) &&
                               all_finite(problem.out, false) && all_finite(problem.lse, true);
    // prepare, write
    run_session s(env, p.buffers, p.downloads);
    std::byte* const in = s.inputs();
    write_fused_inputs(in, fp, stored, 1.0f);
    if (fp.layout.fp16)
        put_halves(in + p.d_out.at, d_out, "sdpa_backward: d_out");
    else
        put_floats(in + p.d_out.at, d_out);
    put_floats(in + p.out.at, problem.out);
    put_floats(in + p.lse.at, problem.lse);
    // record
    s.begin();
    const run_buffers& b = s.buffers();
    const buffer& inputs = b[role::inputs];
    flash_bwd_io io;
    io.qkv = b.bind(role::inputs, 0, fp.v.at + fp.v.bytes);
    io.d_out = b.bind(role::inputs, 0, p.d_out.at + p.d_out.bytes);
    io.d_out_element = static_cast<std::uint32_t>(p.d_out.at / (fp.layout.fp16 ? 2 : 4));
    io.out = b.bind(role::inputs, p.out.at, p.out.bytes);
    io.lse = b.bind(role::inputs, p.lse.at, p.lse.bytes);
    const mask_bindings masks = masks_in(fp, inputs);
    io.mask_bits = masks.bits, io.additive = masks.additive, io.params = masks.params;
    io.dq = b.bind(role::out, p.dq_at, p.dq_count * 4);
    io.dk = b.bind(role::out, p.dk_at, p.dk_count * 4);
    io.dv = b.bind(role::out, p.dv_at, p.dv_count * 4);
    if (p.d_sinks_count) io.d_sinks = b.bind(role::out, p.d_sinks_at, p.d_sinks_count * 4);
    if (p.d_mask_count) io.d_mask = b.bind(role::out, p.d_mask_at, p.d_mask_count * 4);
    io.verdict = b.bind(role::out, p.verdict_at, 4 * contract::BWD_VERDICT_WORDS);
    io.texels = b[role::texels].handle();
    io.scratch = b[role::state].handle();
    if (p.kernels.ds_bytes) io.ds = b.bind(role::scores, 0, p.kernels.ds_bytes);
    if (p.kernels.fused) io.dr = b.bind(role::scores, 0, p.kernels.fused_scratch_bytes());
    const flash_bwd_views views = make_flash_bwd_views(s.dev(), io.texels, io.scratch, p.kernels);
    record_flash_backward(s.rec(), s.pipes(), fp.layout, p.kernels, io, views, inputs_finite, true);
    s.mark();  // gradients done
    run_result<sdpa_gradients> run;
    run.times = s.submit();
    // marks: inputs on the device, the row statistics, dq, dk and dv, the gradients done
    if (const std::vector<double>& m = s.exec().marks_ms(); m.size() >= 5) {
        run.times.attention_ms = m[4] - m[0];
        const double first = m[2] - m[1], second = m[3] - m[2];  // dk/dv first in the fused order
        // The fused order in several chunks interleaves the two kernels: no split (0).
        if (p.kernels.fused_chunks(fp.layout).size() <= 1) {
            run.times.backward_dq_ms = p.kernels.fused ? second : first;
            run.times.backward_dkdv_ms = p.kernels.fused ? first : second;
        }
    }
    // read
    sdpa_gradients& g = run.output;
    g.shape = problem.forward.shape;
    g.device = s.dev().info().name;
    g.dq.resize(p.dq_count), g.dk.resize(p.dk_count), g.dv.resize(p.dv_count);
    g.d_sinks.resize(p.d_sinks_count), g.d_additive_mask.resize(p.d_mask_count);
    std::size_t at = 0;
    s.read(at++, g.dq.data());
    s.read(at++, g.dk.data());
    s.read(at++, g.dv.data());
    if (p.d_sinks_count) s.read(at++, g.d_sinks.data());
    if (p.d_mask_count) s.read(at++, g.d_additive_mask.data());
    std::uint32_t verdict[contract::BWD_VERDICT_WORDS] = {};
    s.read(at, verdict);
    check_backward_verdict(verdict[0], verdict[1], inputs_finite);
    return run;
}

}  // namespace qkv::vulkan::detail
