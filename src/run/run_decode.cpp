// run_decode: the split-S decode route (kernels/sdpa_decode.hpp) of an sdpa call, with K and V
// from the host (packed into the call's inputs as texel rows) or from a kv_cache.
#include "kernels/sdpa_decode.hpp"
#include "run/kv_storage.hpp"
#include "run/run.hpp"

namespace qkv::vulkan::detail {
namespace {

/// Q (and K, V from the host) as rows of whole texels, row z·R + r being exactly q's row (K and V
/// as rows of blocks where quantized); the masks; the score params.
void write_decode_inputs(std::byte* in, const sdpa_plan& p, const sdpa_problem& problem, bool host_kv) {
    const decode_plan& d = p.decode;
    const sdpa_shape& s = problem.shape;
    put_texel_rows(in + p.q.at, problem.q.data(), std::size_t{d.groups} * d.rows, s.d_qk, d.e4, p.q_fp16, "sdpa: q");
    if (host_kv && p.kv_blocks()) {
        put_block_rows(in + p.k.at, p.kv_type, problem.k.data(), std::size_t{d.groups} * d.kv_len, s.d_qk, "sdpa: k");
        put_block_rows(in + p.v.at, p.kv_type, problem.v.data(), std::size_t{d.groups} * d.kv_len, s.d_v, "sdpa: v");
    } else if (host_kv) {
        put_texel_rows(in + p.k.at, problem.k.data(), std::size_t{d.groups} * d.kv_len, s.d_qk, d.e4, p.kv_fp16,
                       "sdpa: k");
        put_texel_rows(in + p.v.at, problem.v.data(), std::size_t{d.groups} * d.kv_len, s.d_v, d.ev4, p.kv_fp16,
                       "sdpa: v");
    }
    if (p.mask_bits.bytes) put_mask_bits(in + p.mask_bits.at, problem.mask);
    if (p.additive.bytes) put_floats(in + p.additive.at, problem.additive_mask);
    put_score_params(in + p.params.at, problem, p.features);
}

}  // namespace

void record_decode_sdpa(const run_session& s, const sdpa_plan& p, const sdpa_problem& problem, VkBufferView q,
                        VkBufferView k, VkBufferView v, const mask_bindings& masks, float v_scale, decode_values values,
                        binding k_blocks, binding v_blocks, binding gate, binding out, const decode_rows& rows,
                        const merge_guard* guard) {
    const run_buffers& b = s.buffers();
    const decode_plan& d = p.decode;
    decode_io io;
    io.q = q, io.k = k, io.v = v;
    io.k_blocks = k_blocks, io.v_blocks = v_blocks;
    if (p.kv_blocks() && (!k_blocks.buffer || !v_blocks.buffer))
        throw error("sdpa: the decode kernel's quantized K and V need their blocks' bindings");
    if (!masks.params.buffer) throw error("sdpa: the decode kernels need the score params");
    io.params = masks.params;
    if (p.lse_count) io.lse = b.bind(role::out, p.lse_at, p.lse_count * 4);
    const binding any = b.bind(role::partial_stats, 0, 16);  // bound where a kernel reads nothing
    io.mask = masks.bits.buffer ? masks.bits : any;
    io.additive = masks.additive.buffer ? masks.additive : any;
    io.stats = b.bind(role::partial_stats, 0, d.stats_bytes());
    io.acc = b.bind(role::partial_acc, 0, d.acc_bytes());
    io.out = out.buffer ? out : b.bind(role::out, 0, d.out_bytes());
    io.gate = gate;
    io.rows = rows;
    io.guard = guard;
    record_decode(s.rec(), s.pipes(), d, io, decode_push_for(d, problem, v_scale), values);
}

sdpa_prepared prepare_decode(const sdpa_plan& p, const sdpa_problem& problem, const cache_kv* cache) {
    const sdpa_shape& s = problem.shape;
    // check: the overflow rule on the host's norms (a cache's from its appends; quantized K and V
    // as they dequantize); the values' scale
    sdpa_prepared prep;
    if (cache) {
        prep.facts = scan_sdpa(problem, *cache->stats);
    } else if (p.kv_blocks()) {
        const std::vector<float> k = stored_values(p.kv_type, problem.k, "sdpa: k");
        const std::vector<float> v = stored_values(p.kv_type, problem.v, "sdpa: v");
        sdpa_problem stored = problem;
        stored.k = k, stored.v = v;
        prep.facts = scan_sdpa(stored);
    } else {
        prep.facts = scan_sdpa(problem);
    }
    check_sdpa_scores(prep.facts, s, p.scale, p.q_fp16 || p.kv_fp16);
    prep.v_scale = value_scale(prep.facts, s.kv_len);
    return prep;
}

void record_decode_part(run_session& session, const sdpa_plan& p, const sdpa_problem& problem,
                        const sdpa_prepared& prep, const cache_kv* cache, sdpa_views& views) {
    // write
    write_decode_inputs(session.inputs(), p, problem, cache == nullptr);
    // record
    const device& dev = session.dev();
    const buffer& inputs = session.buffers()[role::inputs];
    views.q = buffer_view(dev, inputs, texel_format(p.q_fp16), p.q.at, p.q.bytes);
    if (!cache && !p.kv_blocks()) {  // host K/V: views of the inputs
        views.k = buffer_view(dev, inputs, texel_format(p.kv_fp16), p.k.at, p.k.bytes);
        views.v = buffer_view(dev, inputs, texel_format(p.kv_fp16), p.v.at, p.v.bytes);
    }
    session.begin();
    binding k_blocks{}, v_blocks{};
    if (p.kv_blocks()) {
        k_blocks = cache ? cache->k_blocks : binding{inputs.handle(), p.k.at, p.k.bytes};
        v_blocks = cache ? cache->v_blocks : binding{inputs.handle(), p.v.at, p.v.bytes};
    }
    const decode_values values = prep.facts.inputs_finite ? decode_values::finite : decode_values::nonfinite;
    // The same rows as float16 storage, for the cooperative-matrix family (whose plan needs fp16 Q, K, V).
    decode_rows rows = cache ? cache->rows : decode_rows{};
    rows.q = rows_binding(inputs.handle(), p.q.at, p.q.bytes), rows.q_off = static_cast<std::uint32_t>(p.q.at / 2);
    if (!cache) {
        rows.k = rows_binding(inputs.handle(), p.k.at, p.k.bytes), rows.k_off = static_cast<std::uint32_t>(p.k.at / 2);
        rows.v = rows_binding(inputs.handle(), p.v.at, p.v.bytes), rows.v_off = static_cast<std::uint32_t>(p.v.at / 2);
    }
    record_decode_sdpa(session, p, problem, views.q.handle(), cache ? cache->k : views.k.handle(),
                       cache ? cache->v : views.v.handle(), masks_in(p, inputs), prep.v_scale, values, k_blocks,
                       v_blocks, {}, {}, rows);
}

sdpa_output read_decode_part(const run_session& session, const sdpa_plan& p, const sdpa_problem& problem,
                             const sdpa_prepared& prep) {
    sdpa_output out;
    out.shape = problem.shape;
    out.kernel = p.decode.family;
    out.device = session.dev().info().name;
    out.output.resize(p.out_count);
    session.read(0, out.output.data());
    out.lse.resize(p.lse_count);
    if (p.lse_count) session.read(p.lse_download(), out.lse.data());
    finish_sdpa_output(out.output, prep.facts, prep.v_scale, problem.shape);
    return out;
}

run_result<sdpa_output> run_decode(run_env& env, const sdpa_plan& p, const sdpa_problem& problem,
                                   const cache_kv* cache) {
    const sdpa_prepared prep = prepare_decode(p, problem, cache);
    // prepare, write, record
    run_session session(env, p.buffers, p.downloads);
    sdpa_views views;
    record_decode_part(session, p, problem, prep, cache, views);
    session.mark();  // attention done
    run_result<sdpa_output> run;
    run.times = session.submit();
    if (const std::vector<double>& m = session.exec().marks_ms(); m.size() >= 2) run.times.attention_ms = m[1] - m[0];
    // read
    run.output = read_decode_part(session, p, problem, prep);
    return run;
}

}  // namespace qkv::vulkan::detail
