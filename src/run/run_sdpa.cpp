// run_sdpa: scaled dot-product attention over Q, K and V from the host, on the route plan_sdpa
// chose; and the fused route itself. Also the run session every run shares (run/run.hpp).
#include <cstring>

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

run_session::run_session(device_core& core, recorder& rec, run_buffers& buffers, const buffer_plan& plan)
    : core_(core), rec_(rec), buffers_(buffers), plan_(plan) {
    buffers.prepare(*core.alloc, plan, {}, host_io::none);
}

executor& run_session::exec() const {
    if (recording()) throw error("internal: a recording has no executor");
    return *core_.exec;
}

void run_session::begin() {
    exec().begin();
    buffers_.record_upload(exec(), plan_.of(role::inputs));
    exec().mark();  // inputs on the device
}

phase_times run_session::submit() {
    buffers_.record_download(exec(), downloads_);
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

run_result<sdpa_output> run_fused_sdpa(run_env& env, const sdpa_plan& p, const sdpa_problem& problem) {
    // Q, K and V as their types store them, rounded here where the binding holds float32.
    sdpa_problem stored = problem;
    std::vector<float> q_stored, k_stored, v_stored;
    if (p.round_q) q_stored = stored_values(element_type::f16, problem.q, "sdpa: q"), stored.q = q_stored;
    if (p.round_kv) {
        k_stored = stored_values(p.kv_type, problem.k, "sdpa: k"), stored.k = k_stored;
        v_stored = stored_values(p.kv_type, problem.v, "sdpa: v"), stored.v = v_stored;
    }
    // check: the overflow rule on the host's exact norms (of the stored values); the values' scale
    const sdpa_facts facts = scan_sdpa(stored);
    check_sdpa_scores(facts, problem.shape, p.scale, p.layout.fp16);
    const float v_scale = value_scale(facts, problem.shape.kv_len);
    // prepare, write
    run_session s(env, p.buffers, p.downloads);
    write_fused_inputs(s.inputs(), p, stored, v_scale);
    // record
    s.begin();
    flash_cpu_views views;
    record_fused_sdpa(s, p, masks_in(p, s.buffers()[role::inputs]), views, facts.inputs_finite);
    s.mark();  // attention done
    run_result<sdpa_output> run;
    run.times = s.submit();
    if (const std::vector<double>& m = s.exec().marks_ms(); m.size() >= 2) run.times.attention_ms = m[1] - m[0];
    // read
    run.output = new_output(p, problem, s.dev());
    s.read(0, run.output.output.data());
    if (p.weights) s.read(1, run.output.weights.data());
    if (p.lse_count) s.read(p.lse_download(), run.output.lse.data());
    finish_sdpa_output(run.output.output, facts, v_scale, problem.shape);
    return run;
}

run_result<sdpa_output> run_sdpa(run_env& env, const sdpa_problem& problem) {
    const sdpa_plan p = plan_sdpa(problem, env.core.dev->desc(), env.set);
    return p.fused() ? run_fused_sdpa(env, p, problem) : run_decode(env, p, problem, nullptr);
}

}  // namespace qkv::vulkan::detail
