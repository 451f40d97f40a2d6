// run_sdpa: scaled dot-product attention over Q, K and V from the host, on the route plan_sdpa
// chose; and the fused route itself. Also the run session every run shares (run/run.hpp).
#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "kernels/flash_coop.hpp"
#include "kernels/flash_cpu.hpp"
#include "kernels/flash_gpu.hpp"
#include "run/kv_storage.hpp"
#include "run/run.hpp"

namespace qkv::vulkan::detail {

run_session::run_session(run_env& env, const buffer_plan& buffers, std::span<const download> downloads)
    : core_(env.core), rec_(*env.core.exec), buffers_(env.buffers), plan_(buffers), downloads_(downloads) {
    env.buffers.prepare(*env.core.alloc, buffers, downloads,
                        env.set.force_staging ? host_io::staged : host_io::automatic);
}

run_session::run_session(run_env& env, run_buffers& buffers, const buffer_plan& plan,
                         std::span<const download> downloads, shared_command_buffer)
    : core_(env.core), rec_(*env.core.exec), buffers_(buffers), plan_(plan), downloads_(downloads), part_(true) {
    buffers.prepare(*env.core.alloc, plan, downloads, env.set.force_staging ? host_io::staged : host_io::automatic);
}

run_session::run_session(device_core& core, recorder& rec, run_buffers& buffers, const buffer_plan& plan)
    : core_(core), rec_(rec), buffers_(buffers), plan_(plan) {
    buffers.prepare(*core.alloc, plan, {}, host_io::none);
}

executor& run_session::exec() const {
    if (recording()) throw error("internal: a recording has no executor");
    return *core_.exec;
}

void run_session::begin() {
    if (!part_) exec().begin();
    buffers_.record_upload(exec(), plan_.of(role::inputs));
    if (!part_) exec().mark();  // inputs on the device
}

void run_session::finish() { buffers_.record_download(exec(), downloads_); }

phase_times run_session::submit() {
    if (part_) throw error("internal: a part of a shared command buffer is submitted by its caller");
    finish();
    phase_times t;
    t.device_ms = exec().submit_and_wait();
    return t;
}

void write_fused_inputs(std::byte* in, const sdpa_plan& p, const sdpa_problem& problem, float v_scale) {
    if (p.layout.fp16) {
        put_halves(in + p.q.at, problem.q, "sdpa: q");
        put_halves(in + p.k.at, problem.k, "sdpa: k");
        put_halves(in + p.v.at, problem.v, "sdpa: v", v_scale);
    } else {
        put_floats(in + p.q.at, problem.q);
        put_floats(in + p.k.at, problem.k);
        put_floats(in + p.v.at, problem.v, v_scale);
    }
    if (p.mask_bits.bytes) put_mask_bits(in + p.mask_bits.at, problem.mask);
    if (p.additive.bytes) put_floats(in + p.additive.at, problem.additive_mask);
    put_score_params(in + p.params.at, problem, p.features);
}

mask_bindings masks_in(const sdpa_plan& p, const buffer& b) {
    mask_bindings m;
    if (p.mask_bits.bytes) m.bits = {b.handle(), p.mask_bits.at, p.mask_bits.bytes};
    if (p.additive.bytes) m.additive = {b.handle(), p.additive.at, p.additive.bytes};
    m.params = {b.handle(), p.params.at, p.params.bytes};
    return m;
}

void record_fused_sdpa(const run_session& s, const sdpa_plan& p, const mask_bindings& masks, flash_cpu_views& views,
                       bool v_finite) {
    const run_buffers& b = s.buffers();
    const binding qkv = b.bind(role::inputs, 0, p.v.at + p.v.bytes);
    flash_io io;
    io.qkv = qkv;  // unused bindings alias it
    io.mask_bits = masks.bits.buffer ? masks.bits : qkv;
    io.additive = masks.additive.buffer ? masks.additive : qkv;
    io.out = b.bind(role::out, 0, p.out_count * 4);
    io.state = p.state_bytes ? b.bind(role::state, 0, p.state_bytes) : qkv;
    if (!masks.params.buffer) throw error("sdpa: the fused kernels need the score params");
    io.params = masks.params;
    if (p.lse_count) io.lse = b.bind(role::out, p.lse_at, p.lse_count * 4);
    if (p.cpu_family()) {
        views = make_flash_cpu_views(s.dev(), b[role::texels], p.cpu);
        const flash_cpu_texels tx{b[role::texels].handle(), views.q.handle(), views.k.handle(), views.v.handle()};
        record_flash_cpu(s.rec(), s.pipes(), p.layout, p.cpu, io, tx, p.weights, v_finite);
    } else if (p.family == kernel_family::coopmat) {
        record_flash_coop(s.rec(), s.pipes(), p.layout, p.coop, io, p.weights, v_finite);
    } else {
        record_flash_gpu(s.rec(), s.pipes(), p.layout, p.gpu, io, p.weights);
    }
    if (p.weights) {
        s.rec().compute_barrier();
        record_flash_weights(s.rec(), s.pipes(), p.layout, io, b.bind(role::scores, 0, p.weights_count * 4));
    }
}

namespace {

sdpa_output new_output(const sdpa_plan& p, const sdpa_problem& problem, const device& dev) {
    sdpa_output out;
    out.shape = problem.shape;
    out.kernel = p.kernel();
    out.device = dev.info().name;
    out.output.resize(p.out_count);
    out.weights.resize(p.weights_count);
    out.lse.resize(p.lse_count);
    return out;
}

}  // namespace

sdpa_prepared prepare_fused(const sdpa_plan& p, const sdpa_problem& problem) {
    // Q, K and V as their types store them, rounded here where the binding holds float32.
    sdpa_prepared prep;
    if (p.round_q) prep.q = stored_values(element_type::f16, problem.q, "sdpa: q");
    if (p.round_kv) {
        prep.k = stored_values(p.kv_type, problem.k, "sdpa: k");
        prep.v = stored_values(p.kv_type, problem.v, "sdpa: v");
    }
    // check: the overflow rule on the host's exact norms (of the stored values); the values' scale
    prep.facts = scan_sdpa(prep.stored(problem));
    check_sdpa_scores(prep.facts, problem.shape, p.scale, p.layout.fp16);
    prep.v_scale = value_scale(prep.facts, problem.shape.kv_len);
    return prep;
}

void record_fused_part(run_session& s, const sdpa_plan& p, const sdpa_problem& problem, const sdpa_prepared& prep,
                       sdpa_views& views) {
    write_fused_inputs(s.inputs(), p, prep.stored(problem), prep.v_scale);
    s.begin();
    record_fused_sdpa(s, p, masks_in(p, s.buffers()[role::inputs]), views.flash, prep.facts.inputs_finite);
}

sdpa_output read_fused_part(const run_session& s, const sdpa_plan& p, const sdpa_problem& problem,
                            const sdpa_prepared& prep) {
    sdpa_output out = new_output(p, problem, s.dev());
    s.read(0, out.output.data());
    if (p.weights) s.read(1, out.weights.data());
    if (p.lse_count) s.read(p.lse_download(), out.lse.data());
    finish_sdpa_output(out.output, prep.facts, prep.v_scale, problem.shape);
    return out;
}

run_result<sdpa_output> run_fused_sdpa(run_env& env, const sdpa_plan& p, const sdpa_problem& problem) {
    const sdpa_prepared prep = prepare_fused(p, problem);
    // prepare, write, record
    run_session s(env, p.buffers, p.downloads);
    sdpa_views views;
    record_fused_part(s, p, problem, prep, views);
    s.mark();  // attention done
    run_result<sdpa_output> run;
    run.times = s.submit();
    if (const std::vector<double>& m = s.exec().marks_ms(); m.size() >= 2) run.times.attention_ms = m[1] - m[0];
    // read
    run.output = read_fused_part(s, p, problem, prep);
    return run;
}

run_result<sdpa_output> run_sdpa(run_env& env, const sdpa_problem& problem) {
    const sdpa_plan p = plan_sdpa(problem, env.core.dev->desc(), env.set);
    return p.fused() ? run_fused_sdpa(env, p, problem) : run_decode(env, p, problem, nullptr);
}

run_result<std::vector<sdpa_output>> run_sdpa_batch(run_env& env, std::span<const sdpa_problem> problems,
                                                    std::vector<run_buffers>& parts) {
    // plan and check every problem before anything is recorded: a refusal leaves nothing begun
    std::vector<sdpa_plan> plans;
    std::vector<sdpa_prepared> preps;
    plans.reserve(problems.size());
    preps.reserve(problems.size());
    for (const sdpa_problem& problem : problems) {
        plans.push_back(plan_sdpa(problem, env.core.dev->desc(), env.set));
        const sdpa_plan& p = plans.back();
        preps.push_back(p.fused() ? prepare_fused(p, problem) : prepare_decode(p, problem, nullptr));
    }
    run_result<std::vector<sdpa_output>> run;
    run.output.reserve(problems.size());
    // max_batch_parts problems per command buffer, so that the buffers held (and the device memory
    // allocations: drivers may allow as few as 4,096) stay bounded whatever the batch
    for (std::size_t first = 0; first < problems.size(); first += max_batch_parts) {
        const std::size_t n = std::min(max_batch_parts, problems.size() - first);
        if (parts.size() < n) parts.resize(n);
        // prepare each part's buffers (its own: the parts run without barriers between them)
        std::vector<std::unique_ptr<run_session>> sessions;
        sessions.reserve(n);
        for (std::size_t i = 0; i < n; ++i) {
            const sdpa_plan& p = plans[first + i];
            sessions.push_back(
                std::make_unique<run_session>(env, parts[i], p.buffers, p.downloads, shared_command_buffer{}));
        }
        // write and record each part into one command buffer, one submit
        std::vector<sdpa_views> views(n);
        env.core.exec->begin();
        for (std::size_t i = 0; i < n; ++i) {
            const std::size_t at = first + i;
            if (plans[at].fused())
                record_fused_part(*sessions[i], plans[at], problems[at], preps[at], views[i]);
            else
                record_decode_part(*sessions[i], plans[at], problems[at], preps[at], nullptr, views[i]);
            sessions[i]->finish();
        }
        run.times.device_ms += env.core.exec->submit_and_wait();
        // read
        for (std::size_t i = 0; i < n; ++i) {
            const std::size_t at = first + i;
            run.output.push_back(plans[at].fused()
                                     ? read_fused_part(*sessions[i], plans[at], problems[at], preps[at])
                                     : read_decode_part(*sessions[i], plans[at], problems[at], preps[at]));
        }
    }
    run.times.attention_ms = run.times.device_ms;
    return run;
}

}  // namespace qkv::vulkan::detail
