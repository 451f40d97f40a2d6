#include "plan/sdpa_backward_plan.hpp"

#include <algorithm>
#include <cstdint>
#include <string>

#include "qkv/vulkan/error.hpp"

namespace qkv::vulkan::detail {
namespace {

/// Positions the backward kernels form in 32 bits (backward.glsl: visible_rows) stay there.
constexpr std::int64_t position_limit = std::int64_t{1} << 30;

/// The largest ALiBi drop (slope · a row's distance to its nearest key) the backward takes. The
/// kernels' scores are relative to each row's nearest key (score_rules.glsl: rule_score), and
/// the forward's lse is the absolute one, a float32 lower by the drop: the backward raises it by
/// the drop again, so the lse's rounding, |drop|·2^-24, becomes P's relative error. Up to 16 that
/// is at most 2^-20, as float32 scores of magnitude 16 have; beyond, the gradient would be
/// silently less precise than the forward, so it is refused.
constexpr double max_alibi_drop = 16.0;

/// The largest slope · nearest-key distance over the problem's heads and rows (0 without ALiBi).
double largest_alibi_drop(const sdpa_problem& fp, std::int64_t off) {
    const sdpa_shape& s = fp.shape;
    double slope = 0;
    if (!fp.alibi_slopes.empty()) {
        for (const float m : fp.alibi_slopes) slope = std::max(slope, static_cast<double>(m));
    } else if (fp.options.alibi_max_bias > 0) {
        for (std::size_t h = 0; h < s.q_heads; ++h)
            slope = std::max(slope, alibi_slope(fp.options.alibi_max_bias, s.q_heads, h));
    }
    if (slope == 0) return 0;
    // Rows sit at i + off, i in [0, q_len); the nearest key of [0, kv_len) is farthest from the
    // first row (before the keys) or the last (past them).
    const std::int64_t before = -off,
                       past = static_cast<std::int64_t>(s.q_len) - 1 + off - (static_cast<std::int64_t>(s.kv_len) - 1);
    return slope * static_cast<double>(std::max<std::int64_t>({0, before, past}));
}

void refuse_beyond(const char* what, std::uint64_t count, std::uint64_t bytes, const device_info& info) {
    if (count >= (std::uint64_t{1} << 32))
        throw limit_exceeded(std::string("sdpa_backward: ") + what + " has " + std::to_string(count) +
                             " elements; the kernels on " + info.name +
                             " index at most 2^32 - 1 (split the batch or the heads into several calls)");
    if (bytes > info.max_storage_buffer_range)
        throw limit_exceeded(std::string("sdpa_backward: ") + what + " needs " + std::to_string(bytes) +
                             " bytes in one binding, more than maxStorageBufferRange (" +
                             std::to_string(info.max_storage_buffer_range) + ") of " + info.name +
                             "; split the batch or the heads into several calls");
}

}  // namespace

sdpa_backward_plan plan_sdpa_backward(const sdpa_backward_problem& problem, const device_desc& desc,
                                      const settings& set) {
    const device_info& info = desc.info;
    const sdpa_problem& fp = problem.forward;
    const sdpa_shape& s = fp.shape;
    sdpa_backward_plan p;
    // The forward's fused layout, without what only the forward returns.
    sdpa_problem forward = fp;
    forward.options.return_weights = false;
    forward.options.return_lse = false;
    p.forward = plan_sdpa_fused(forward, desc, set);
    const std::int64_t off = causal_offset(s, fp.options);
    if (s.q_len >= position_limit || s.kv_len >= position_limit || off >= position_limit || off <= -position_limit)
        throw limit_exceeded(
            "sdpa_backward: q_len, kv_len and the causal offset (position_offset, or kv_len - q_len "
            "with the bottom_right alignment) must be below 2^30 on the device");
    if (const double drop = largest_alibi_drop(fp, off); drop > max_alibi_drop)
        throw limit_exceeded(
            "sdpa_backward: ALiBi (alibi_max_bias or alibi_slopes) lowers the lse of rows far from "
            "their nearest key (position_offset, alignment) by slope·distance, here up to " +
            std::to_string(drop) +
            ", more than 16 on the device: the float32 lse no longer holds the precision to "
            "recompute the probabilities; use the CPU backend (float64) or rows nearer the keys");

    flash_bwd_request r;
    r.d_sinks = !fp.sinks.empty();
    r.d_mask = problem.return_d_additive_mask;
    r.coop = set.backward_coop || fp.options.kernel == kernel_family::coopmat;
    if (r.d_mask) {
        // The mask's dimensions, outermost first, as (b, h, l, s); missing leading ones are 1.
        const std::vector<std::size_t> dims =
            fp.mask_shape.empty() ? std::vector<std::size_t>{s.q_len, s.kv_len} : fp.mask_shape;
        for (std::size_t d = 0; d < dims.size(); ++d)
            r.mask_dims[4 - dims.size() + d] = static_cast<std::uint32_t>(dims[d]);
    }
    const flash_layout& l = p.forward.layout;
    p.kernels = plan_flash_backward(desc, l, r, set);
    if (const flash_bwd_refusal no = check_flash_backward(desc, p.kernels); !no.why.empty()) {
        if (no.limit) throw limit_exceeded("sdpa_backward: " + no.why);
        throw unavailable("sdpa_backward: " + no.why);
    }
    if (const std::uint32_t n = p.kernels.dispatches(l); n > 1000)
        throw limit_exceeded("sdpa_backward: the kernels would need " + std::to_string(n) + " dispatches on " +
                             info.name + " (at most 1000 per call)");

    p.dq_count = std::uint64_t{s.batch} * s.q_heads * s.q_len * s.d_qk;
    p.dk_count = std::uint64_t{s.batch} * s.kv_heads * s.kv_len * s.d_qk;
    p.dv_count = std::uint64_t{s.batch} * s.kv_heads * s.kv_len * s.d_v;
    p.d_sinks_count = r.d_sinks ? s.q_heads : 0;
    p.d_mask_count = r.d_mask ? fp.additive_mask.size() : 0;
    const std::uint64_t out_count = std::uint64_t{s.batch} * s.q_heads * s.q_len * s.d_v;
    refuse_beyond("d_out", out_count, out_count * 4, info);
    refuse_beyond("the dS scratch of the additive mask's gradient", p.kernels.ds_bytes / 4, p.kernels.ds_bytes, info);

    // role::inputs: the forward's, then dO (as Q is stored), out and lse (float32).
    const std::uint64_t align = desc.storage_alignment;
    const std::uint64_t eb = l.fp16 ? 2 : 4;
    p.d_out_fp16 = p.forward.q_fp16;
    p.d_out = {align_up(p.forward.params.at + p.forward.params.bytes, align), out_count * eb};
    p.out = {align_up(p.d_out.at + p.d_out.bytes, align), out_count * 4};
    p.lse = {align_up(p.out.at + p.out.bytes, align), std::uint64_t{s.batch} * s.q_heads * s.q_len * 4};
    const std::uint64_t inputs = p.lse.at + p.lse.bytes;
    refuse_beyond("the backward's inputs", inputs / 4, inputs, info);
    // dO's first element in its binding (the whole inputs buffer, of Q's element type).
    if (p.d_out.at % eb != 0) throw error("internal: sdpa_backward: d_out misaligned");

    // role::out: the gradients, then the verdict.
    p.dq_at = 0;
    p.dk_at = align_up(p.dq_count * 4, align);
    p.dv_at = align_up(p.dk_at + p.dk_count * 4, align);
    p.d_sinks_at = align_up(p.dv_at + p.dv_count * 4, align);
    p.d_mask_at = align_up(p.d_sinks_at + p.d_sinks_count * 4, align);
    p.verdict_at = align_up(p.d_mask_at + p.d_mask_count * 4, align);
    const std::uint64_t outputs = p.verdict_at + 4 * contract::BWD_VERDICT_WORDS;
    refuse_beyond("the gradients", outputs / 4, outputs, info);

    p.buffers.need(role::inputs, inputs);
    p.buffers.need(role::out, outputs);
    p.buffers.need(role::texels, p.kernels.texel_bytes_total);
    p.buffers.need(role::state, p.kernels.scratch_bytes);
    p.buffers.need(role::scores, std::max(p.kernels.ds_bytes, p.kernels.fused_scratch_bytes()));
    p.downloads = {{role::out, p.dq_at, p.dq_count * 4},
                   {role::out, p.dk_at, p.dk_count * 4},
                   {role::out, p.dv_at, p.dv_count * 4}};
    if (p.d_sinks_count) p.downloads.push_back({role::out, p.d_sinks_at, p.d_sinks_count * 4});
    if (p.d_mask_count) p.downloads.push_back({role::out, p.d_mask_at, p.d_mask_count * 4});
    p.downloads.push_back({role::out, p.verdict_at, 4 * contract::BWD_VERDICT_WORDS});
    return p;
}

}  // namespace qkv::vulkan::detail
