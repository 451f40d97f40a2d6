#include "plan/sdpa_plan.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>

#include "contract/score.h"
#include "plan/attention_plan.hpp"
#include "qkv/dropout.hpp"
#include "qkv/vulkan/error.hpp"

namespace qkv::vulkan::detail {
namespace {

std::uint32_t u32(std::uint64_t v) { return static_cast<std::uint32_t>(v); }

/// Why a count cannot be indexed by the kernels' 32-bit indices (empty: it can).
std::string beyond_u32(const char* what, std::uint64_t count, const std::string& device) {
    if (count < (std::uint64_t{1} << 32)) return {};
    return std::string(what) + " has " + std::to_string(count) + " elements; the kernels on " + device +
           " index at most 2^32 - 1 (split the batch or the heads into several calls)";
}

/// Why one binding of `bytes` does not fit the device (empty: it does).
std::string beyond_range(const char* what, std::uint64_t bytes, const device_info& info) {
    if (bytes <= info.max_storage_buffer_range) return {};
    return std::string(what) + " needs " + std::to_string(bytes) +
           " bytes in one binding, more than maxStorageBufferRange (" + std::to_string(info.max_storage_buffer_range) +
           ") of " + info.name + "; split the batch or the heads into several calls";
}

void refuse_if(const std::string& why) {
    if (!why.empty()) throw limit_exceeded("sdpa: " + why);
}

/// The checks and facts both routes share.
void plan_common(sdpa_plan& p, const sdpa_problem& problem, const device_desc& desc) {
    const device_info& info = desc.info;
    const sdpa_shape& s = problem.shape;
    const sdpa_options& opt = problem.options;
    p.out_count = std::uint64_t{s.batch} * s.q_heads * s.q_len * s.d_v;
    p.weights_count = opt.return_weights ? std::uint64_t{s.batch} * s.q_heads * s.q_len * s.kv_len : 0;
    const std::uint64_t mask_count =
        !problem.mask.empty() ? problem.mask.size() : problem.additive_mask.size();  // the masks share a shape
    refuse_if(beyond_u32("q", std::uint64_t{s.batch} * s.q_heads * s.q_len * s.d_qk, info.name));
    refuse_if(beyond_u32("k", std::uint64_t{s.batch} * s.kv_heads * s.kv_len * s.d_qk, info.name));
    refuse_if(beyond_u32("v", std::uint64_t{s.batch} * s.kv_heads * s.kv_len * s.d_v, info.name));
    refuse_if(beyond_u32("the output", p.out_count, info.name));
    refuse_if(beyond_u32("the weights", p.weights_count, info.name));
    refuse_if(beyond_u32("the mask", mask_count, info.name));
    refuse_if(beyond_u32("the softmax statistics", 2 * std::uint64_t{s.batch} * s.q_heads * s.q_len, info.name));
    if (s.q_len > 0x7fffffffu || s.kv_len > 0x7fffffffu)
        throw limit_exceeded("sdpa: q_len and kv_len must be below 2^31 on the device");
    // One convention on every route (README, "fp16"): precision fp16 stores Q as float16, and K and
    // V too unless kv_type says otherwise.
    p.q_fp16 = opt.precision == precision::fp16;
    p.kv_type = stored_kv_type(opt);
    p.kv_fp16 = p.kv_type == element_type::f16;
    if (p.q_fp16 && !info.fp16_storage)
        throw unavailable("sdpa: fp16 precision needs 16-bit storage buffers (storageBuffer16BitAccess): " +
                          lacks(info) + "; use fp32");
    p.features = score_features(problem);
    // Positions are 32-bit in the kernels: the offset (any |off| <= 2^62) and the window's sides
    // (any size) are reduced to values that keep every rule's answer (kernels/score_positions.hpp),
    // which holds while q_len + kv_len <= 2^30.
    if ((opt.causal || (p.features & (contract::SCORE_WINDOW | contract::SCORE_ALIBI)) != 0) &&
        std::uint64_t{s.q_len} + s.kv_len > std::uint64_t{contract::SCORE_POSITION_LIMIT})
        throw limit_exceeded("sdpa: with the causal rule, a window or ALiBi, q_len + kv_len (" +
                             std::to_string(std::uint64_t{s.q_len} + s.kv_len) +
                             ") must be at most 2^30 on the device (its positions are 32-bit)");
    p.scale = opt.scale ? *opt.scale : default_scale(s);
    p.lse_count = opt.return_lse ? std::uint64_t{s.batch} * s.q_heads * s.q_len : 0;
    refuse_if(beyond_range("the output", p.out_count * 4, info));
    refuse_if(beyond_range("the weights", p.weights_count * 4, info));
    refuse_if(beyond_range("the additive mask", problem.additive_mask.size() * 4, info));
}

/// Places the masks and the score params after `at` in the inputs buffer; returns the end.
std::uint64_t place_masks(sdpa_plan& p, const sdpa_problem& problem, std::uint64_t at, std::uint64_t align) {
    p.mask_bits = {align_up(at, align), problem.mask.empty() ? 0 : mask_bits_bytes(problem.mask.size())};
    p.additive = {align_up(p.mask_bits.at + p.mask_bits.bytes, align), problem.additive_mask.size() * 4};
    p.params = {align_up(p.additive.at + p.additive.bytes, align), score_params_bytes(problem.shape)};
    return p.params.at + p.params.bytes;
}

/// The output (and the lse after it, where asked) in role::out; their downloads after `others`.
void place_outputs(sdpa_plan& p, std::vector<download> others) {
    const std::uint64_t out_bytes = p.out_count * 4;
    p.lse_at = align_up(out_bytes, 16);
    p.buffers.need(role::out, p.lse_count ? p.lse_at + p.lse_count * 4 : out_bytes);
    p.downloads = {{role::out, 0, out_bytes}};
    for (const download& d : others) p.downloads.push_back(d);
    if (p.lse_count) p.downloads.push_back({role::out, p.lse_at, p.lse_count * 4});
}

std::uint32_t mask_kinds(const sdpa_problem& problem) {
    return (problem.options.causal ? contract::MASK_FLAG_CAUSAL : 0u) |
           (problem.mask.empty() ? 0u : contract::MASK_FLAG_BOOLEAN) |
           (problem.additive_mask.empty() ? 0u : contract::MASK_FLAG_ADDITIVE);
}

/// The fused route: [q | k | v] as elements of one binding (the kernels' Q|K|V), then the masks.
void plan_fused(sdpa_plan& p, const sdpa_problem& problem, const device_desc& desc, const settings& set) {
    const device_info& info = desc.info;
    const sdpa_shape& s = problem.shape;
    p.route = sdpa_route::fused;
    if (s.d_qk > fused_max_head || s.d_v > fused_max_head)
        throw limit_exceeded("sdpa: the fused kernels take head widths up to " + std::to_string(fused_max_head) +
                             " (d_qk = " + std::to_string(s.d_qk) + ", d_v = " + std::to_string(s.d_v) +
                             "); use the cpu backend for wider heads");
    // The binding holds one type: float16 where Q and K/V both are; otherwise float32, with Q
    // and K/V rounded on the host to what their types hold.
    const bool binding_f16 = p.q_fp16 && p.kv_type == element_type::f16;
    p.round_q = p.q_fp16 && !binding_f16;
    p.round_kv = p.kv_type != (binding_f16 ? element_type::f16 : element_type::f32);
    p.kv_fp16 = binding_f16;
    if (desc.max_push_bytes < sizeof(contract::flash_push))
        throw limit_exceeded("sdpa: the fused kernels push " + std::to_string(sizeof(contract::flash_push)) +
                             " bytes of constants; " + info.name + " takes " + std::to_string(desc.max_push_bytes));
    const std::uint64_t eb = binding_f16 ? 2 : 4;
    const std::uint64_t qn = std::uint64_t{s.batch} * s.q_heads * s.q_len * s.d_qk;
    const std::uint64_t kn = std::uint64_t{s.batch} * s.kv_heads * s.kv_len * s.d_qk;
    const std::uint64_t vn = std::uint64_t{s.batch} * s.kv_heads * s.kv_len * s.d_v;
    p.q = {0, qn * eb};
    p.k = {align_up(p.q.bytes, 16), kn * eb};
    p.v = {align_up(p.k.at + p.k.bytes, 16), vn * eb};
    const std::uint64_t qkv_bytes = p.v.at + p.v.bytes;
    refuse_if(beyond_range("q, k and v together", qkv_bytes, info));
    refuse_if(beyond_u32("q, k and v together", qkv_bytes / eb, info.name));
    const std::uint64_t inputs = place_masks(p, problem, qkv_bytes, desc.storage_alignment);

    flash_layout& l = p.layout;
    l.batch = u32(s.batch), l.heads = u32(s.q_heads), l.kv_heads = u32(s.kv_heads);
    l.q_len = u32(s.q_len), l.kv_len = u32(s.kv_len), l.d = u32(s.d_qk), l.dv = u32(s.d_v);
    l.q = {u32(s.q_heads * s.q_len * s.d_qk), u32(s.q_len * s.d_qk), u32(s.d_qk)};
    l.k = {u32(s.kv_heads * s.kv_len * s.d_qk), u32(s.kv_len * s.d_qk), u32(s.d_qk)};
    l.v = {u32(s.kv_heads * s.kv_len * s.d_v), u32(s.kv_len * s.d_v), u32(s.d_v)};
    l.o = {u32(s.q_heads * s.q_len * s.d_v), u32(s.q_len * s.d_v), u32(s.d_v)};
    l.k_off = u32(p.k.at / eb), l.v_off = u32(p.v.at / eb);
    if (!problem.mask.empty() || !problem.additive_mask.empty()) {
        const mask_strides m = broadcast_strides(problem.mask_shape, s);
        l.m_bs = u32(m.batch), l.m_hs = u32(m.head), l.m_rs = u32(m.row), l.m_cs = u32(m.col);
        l.a_bs = l.m_bs;
    }
    l.mask = !problem.mask.empty(), l.additive = !problem.additive_mask.empty();
    l.causal = problem.options.causal;
    l.causal_offset = positions_of(problem).offset;
    l.scale = p.scale;
    l.fp16 = binding_f16;
    l.features = p.features;

    // The family (as for attention, plan.hpp: choose_family), and its plan.
    const kernel_family asked = set.fused_tiles_as && problem.options.kernel == kernel_family::automatic
                                    ? kernel_family::block_tiles  // the GPU-tile test hook is for the gpu family
                                    : problem.options.kernel;
    p.cpu = plan_flash_cpu(desc, l, set);
    const flash_cpu_refusal no = check_flash_cpu(desc, p.cpu);
    const family_refusal coop = coop_refusal(desc, l, set, p.coop);
    try {
        p.family = choose_family(asked, info.type, {no.why, no.limit}, coop);
    } catch (const limit_exceeded& e) {
        throw limit_exceeded(std::string("sdpa: ") + e.what());
    } catch (const unavailable& e) {
        throw unavailable(std::string("sdpa: ") + e.what());
    }
    if (p.family == kernel_family::block_tiles) p.gpu = plan_flash_gpu(desc, l, set);
    const std::uint32_t chunk = p.cpu_family()                       ? p.cpu.chunk_keys
                                : p.family == kernel_family::coopmat ? p.coop.chunk_keys
                                                                     : p.gpu.chunk_keys;
    const std::uint32_t dispatches = p.cpu_family()                       ? p.cpu.dispatches(l.kv_len)
                                     : p.family == kernel_family::coopmat ? p.coop.dispatches(l.kv_len)
                                                                          : p.gpu.dispatches(l.kv_len);
    if (dispatches > 1000)
        throw limit_exceeded("sdpa: the fused kernel would need " + std::to_string(dispatches) + " dispatches of " +
                             std::to_string(chunk) + " keys each for kv_len = " + std::to_string(l.kv_len) + " on " +
                             info.name + " (at most 1000 per call)");
    p.weights = p.weights_count > 0;
    const bool need_state = chunk < l.kv_len || p.weights;
    p.state_bytes = need_state ? 8 * std::uint64_t{l.q_batches()} * l.q_len : 0;
    refuse_if(beyond_range("the softmax statistics", p.state_bytes, info));

    p.buffers.need(role::inputs, inputs);
    p.buffers.need(role::scores, p.weights_count * 4);
    p.buffers.need(role::state, p.state_bytes);
    p.buffers.need(role::texels, p.cpu_family() ? p.cpu.bytes : 0);
    std::vector<download> weights;
    if (p.weights) weights.push_back({role::scores, 0, p.weights_count * 4});
    place_outputs(p, weights);
    refuse_if(beyond_range("the output and its log-sum-exp", p.buffers.of(role::out), info));
}

/// The decode route: Q (and K, V from the host) as rows of whole texels, then the masks. Returns
/// why the decode kernels cannot run the call here (empty: `p` is their plan): a limit, or (not
/// `limit`) a texel format the device lacks.
family_refusal plan_decode_route(sdpa_plan& p, const sdpa_problem& problem, const device_desc& desc,
                                 const settings& set, const cache_desc* cache) {
    const device_info& info = desc.info;
    const sdpa_shape& s = problem.shape;
    if (cache) p.kv_type = cache->kv_type, p.kv_fp16 = cache->kv_type == element_type::f16;
    decode_request r;
    r.shape = s;
    r.kv_stride = cache ? cache->capacity : u32(s.kv_len);
    r.masks = mask_kinds(problem);
    r.kernel = problem.options.kernel;
    r.max_chunks = set.max_decode_chunks;
    r.features = p.features;
    r.kv_format = p.kv_type == element_type::q8_0   ? contract::DECODE_KV_Q8_0
                  : p.kv_type == element_type::q4_0 ? contract::DECODE_KV_Q4_0
                                                    : contract::DECODE_KV_TEXELS;
    // The keys some row may see: from the first row's window start to the last row's end.
    const key_range first_row = visible_keys(s, problem.options, 0);
    const key_range last_row = visible_keys(s, problem.options, s.q_len - 1);
    r.kv_first = u32(std::min(first_row.first, last_row.first));
    r.kv_end = u32(std::max(first_row.end, last_row.end));
    if (r.kv_end <= r.kv_first) r.kv_first = r.kv_end = 0;  // no row sees a key: one empty chunk
    // The cooperative-matrix family (float16 Q, K and V rows; GQA packed into its M dimension):
    // where asked for, or where the automatic choice may take it (check_coop, its driver gates).
    flash_layout coop_view;
    coop_view.heads = u32(s.q_heads), coop_view.kv_heads = u32(s.kv_heads), coop_view.q_len = u32(s.q_len);
    coop_view.d = u32(s.d_qk), coop_view.dv = u32(s.d_v);
    coop_view.fp16 = p.q_fp16 && p.kv_fp16 && !p.kv_blocks() && !(cache && cache->texels_only);
    const coop_verdict coop = check_coop(desc, coop_view, true, set, r.coop);
    if (r.kernel == kernel_family::coopmat && !coop.why.empty()) return {coop.why, coop.limit};
    if (r.kernel == kernel_family::automatic && coop.why.empty() && coop.automatic && !set.fused_tiles_as)
        r.kernel = kernel_family::coopmat;
    device_info plan_info = info;
    if (set.fused_tiles_as)  // the test hook: plan as for that device (within this one)
        plan_info.subgroup_arithmetic = plan_info.subgroup_arithmetic && set.fused_tiles_as->subgroup_arithmetic;
    decode_plan d = try_plan_decode(plan_info, r, set);
    if (!d.refusal.empty()) return {d.refusal, true};
    const char* q_format = p.q_fp16 ? "R16G16B16A16_SFLOAT" : "R32G32B32A32_SFLOAT";
    const char* kv_format = p.kv_fp16 ? "R16G16B16A16_SFLOAT" : "R32G32B32A32_SFLOAT";
    // (The cooperative-matrix kernel reads the same rows as storage buffers; the route's texel views
    // of them are made all the same.)
    if (!desc.uniform_texels(p.q_fp16))
        return {std::string("the decode kernels read q through ") + q_format + " uniform texel buffers, which " +
                    info.name + " does not support",
                false};
    if (!p.kv_blocks() && !desc.uniform_texels(p.kv_fp16))
        return {std::string("the decode kernels read k and v through ") + kv_format + " uniform texel buffers, which " +
                    info.name + " does not support",
                false};
    const std::uint64_t q_tb = p.q_fp16 ? 8 : 16, kv_tb = p.kv_fp16 ? 8 : 16;
    // K and V from the host: texel rows, or rows of blocks (bytes_for: d_qk, d_v multiples of 32).
    std::uint64_t k_texels = 0, v_texels = 0, k_bytes = 0, v_bytes = 0;
    if (!cache && p.kv_blocks()) {
        k_bytes = std::uint64_t{d.groups} * d.kv_len * bytes_for(p.kv_type, s.d_qk);
        v_bytes = std::uint64_t{d.groups} * d.kv_len * bytes_for(p.kv_type, s.d_v);
    } else if (!cache) {
        k_texels = std::uint64_t{d.groups} * d.kv_len * d.e4, k_bytes = k_texels * kv_tb;
        v_texels = std::uint64_t{d.groups} * d.kv_len * d.ev4, v_bytes = v_texels * kv_tb;
    }
    for (const auto& [what, bytes] : {std::pair{"k", k_bytes}, std::pair{"v", v_bytes}})
        if (std::string why = beyond_range(what, bytes, info); !why.empty()) return {why, true};
    for (const auto& [what, texels] :
         {std::pair{"q", d.q_texels()}, std::pair{"k", k_texels}, std::pair{"v", v_texels}})
        if (texels > desc.max_texel_elements)
            return {std::string(what) + " needs " + std::to_string(texels) + " texels, more than " + info.name +
                        "'s maxTexelBufferElements of " + std::to_string(desc.max_texel_elements),
                    true};
    for (const auto& [what, bytes] :
         {std::pair{"the partial accumulators", d.acc_bytes()}, std::pair{"the partial statistics", d.stats_bytes()},
          std::pair{"the output", d.out_bytes()}})
        if (std::string why = beyond_range(what, bytes, info); !why.empty()) return {why, true};

    const std::uint64_t align = std::max(desc.texel_alignment, desc.storage_alignment);
    p.q = {0, d.q_texels() * q_tb};
    p.k = {align_up(p.q.bytes, align), k_bytes};
    p.v = {align_up(p.k.at + p.k.bytes, align), v_bytes};
    const std::uint64_t inputs = place_masks(p, problem, p.v.at + p.v.bytes, align);
    if (std::string why = beyond_range("the decode inputs", inputs, info); !why.empty()) return {why, true};

    p.route = sdpa_route::decode;
    p.decode = d;
    p.buffers = {};
    p.buffers.need(role::inputs, inputs);
    p.buffers.need(role::partial_stats, d.stats_bytes());
    p.buffers.need(role::partial_acc, d.acc_bytes());
    place_outputs(p, {});
    if (std::string why = beyond_range("the output and its log-sum-exp", p.buffers.of(role::out), info); !why.empty())
        return {why, true};
    return {};
}

}  // namespace

sdpa_plan plan_sdpa(const sdpa_problem& problem, const device_desc& desc, const settings& set) {
    sdpa_plan p;
    plan_common(p, problem, desc);
    // The test hooks of the fused kernels ask for them; dropout is theirs alone (training shapes).
    if (decode_suits(problem.shape, problem.options.return_weights) && !set.fused_hooks() &&
        problem.options.dropout_p == 0) {
        sdpa_plan d = p;
        if (plan_decode_route(d, problem, desc, set, nullptr).why.empty()) return d;
    }
    plan_fused(p, problem, desc, set);
    return p;
}

sdpa_plan plan_sdpa_fused(const sdpa_problem& problem, const device_desc& desc, const settings& set) {
    sdpa_plan p;
    plan_common(p, problem, desc);
    plan_fused(p, problem, desc, set);
    return p;
}

sdpa_plan plan_sdpa_cache(const sdpa_problem& problem, const cache_desc& cache, const device_desc& desc,
                          const settings& set) {
    sdpa_plan p;
    plan_common(p, problem, desc);
    if (const family_refusal no = plan_decode_route(p, problem, desc, set, &cache); !no.why.empty()) {
        if (no.limit) throw limit_exceeded("sdpa with a kv_cache: " + no.why);
        throw unavailable("sdpa with a kv_cache: " + no.why);
    }
    return p;
}

}  // namespace qkv::vulkan::detail

namespace qkv::vulkan::detail {

std::uint32_t score_features(const sdpa_problem& problem) {
    const sdpa_options& o = problem.options;
    return (o.softcap > 0 ? contract::SCORE_SOFTCAP : 0u) |
           (o.alibi_max_bias > 0 || !problem.alibi_slopes.empty() ? contract::SCORE_ALIBI : 0u) |
           (o.window_left >= 0 || o.window_right >= 0 ? contract::SCORE_WINDOW : 0u) |
           (problem.sinks.empty() ? 0u : contract::SCORE_SINKS) | (o.return_lse ? contract::SCORE_LSE : 0u) |
           (o.dropout_p > 0 ? contract::SCORE_DROPOUT : 0u);
}

std::uint64_t score_params_bytes(const sdpa_shape& shape) {
    return contract::SCORE_PARAMS_HEAD_OFFSET + 8 * std::uint64_t{shape.q_heads};
}

void put_score_params(std::byte* at, const sdpa_problem& problem, std::uint32_t features) {
    const sdpa_shape& s = problem.shape;
    const sdpa_options& o = problem.options;
    // The reduced sides and ALiBi's far part depend on the offset and the sides alone, not on
    // kv_len: params written once serve a planned call against a growing cache.
    const score_positions pos = positions_of(problem);
    contract::score_params sp{};
    sp.window_left = pos.window_left;
    sp.window_right = pos.window_right;
    const contract::softcap_factors cap = contract::softcap_factors_of(o.softcap);
    sp.softcap = cap.c;
    sp.softcap_prescale = cap.prescale;
    sp.softcap_inverse = cap.inverse;
    sp.alibi_far = static_cast<float>(pos.alibi_far);
    sp.features = features;
    sp.dropout_seed_lo = static_cast<std::uint32_t>(o.dropout_seed);
    sp.dropout_seed_hi = static_cast<std::uint32_t>(o.dropout_seed >> 32);
    sp.dropout_offset_lo = static_cast<std::uint32_t>(o.dropout_offset);
    sp.dropout_offset_hi = static_cast<std::uint32_t>(o.dropout_offset >> 32);
    sp.dropout_scale = 1.0f;
    if (o.dropout_p > 0) {  // a float p < 1 has a threshold below 2^32 (qkv/dropout.hpp)
        sp.dropout_threshold = static_cast<std::uint32_t>(dropout_threshold(static_cast<double>(o.dropout_p)));
        sp.dropout_scale = static_cast<float>(1.0 / (1.0 - static_cast<double>(o.dropout_p)));
    }
    std::memcpy(at, &sp, sizeof sp);
    std::vector<float> heads(2 * s.q_heads);
    for (std::size_t h = 0; h < s.q_heads; ++h) {
        heads[2 * h] = problem.alibi_slopes.empty() ? static_cast<float>(alibi_slope(o.alibi_max_bias, s.q_heads, h))
                                                    : problem.alibi_slopes[h];
        heads[2 * h + 1] = problem.sinks.empty() ? -std::numeric_limits<float>::infinity() : problem.sinks[h];
    }
    std::memcpy(at + contract::SCORE_PARAMS_HEAD_OFFSET, heads.data(), heads.size() * sizeof(float));
}

}  // namespace qkv::vulkan::detail
