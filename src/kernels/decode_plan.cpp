#include "kernels/decode_plan.hpp"

#include <algorithm>
#include <string>

#include "kernels/gemm_tiles.hpp"
#include "kernels/score_positions.hpp"
#include "qkv/vulkan/error.hpp"

namespace qkv::vulkan::detail {
namespace {

using namespace qkv::contract;

std::uint32_t ceil_div(std::uint64_t a, std::uint64_t b) { return static_cast<std::uint32_t>((a + b - 1) / b); }
bool power_of_two(std::uint32_t v) { return v != 0 && (v & (v - 1)) == 0; }
std::uint32_t next_power_of_two(std::uint32_t v) {
    std::uint32_t p = 1;
    while (p < v) p *= 2;
    return p;
}

// The cpu kernel unrolls every texel of rows up to this wide (E, Ev <= 128); wider rows take its
// wide form. LLVM's time to build the unrolled body grows faster than the body: at E = 1,024 with
// q8_0 K/V about a minute, at E = 4,096 more than ten (docs/devices.md).
constexpr std::uint32_t unrolled_texels_cpu = 32;

}  // namespace

contract::decode_spec decode_plan::spec(decode_values values, bool guard) const {
    const std::uint32_t careful = values == decode_values::finite      ? contract::DECODE_VALUES_FINITE
                                  : values == decode_values::nonfinite ? contract::DECODE_VALUES_NONFINITE
                                                                       : contract::DECODE_VALUES_GATED;
    return {wg, rpi, kps, e4, ev4, masks, subgroup ? 1u : 0u, careful, features, kv_format, tb, guard ? 1u : 0u};
}

decode_plan try_plan_decode(const device_info& info, const decode_request& r, const settings& set) {
    const sdpa_shape& s = r.shape;
    decode_plan p;
    const auto refuse = [&p](std::string why) {
        p.refusal = std::move(why);
        return p;
    };
    p.family = r.kernel != kernel_family::automatic ? r.kernel
               : info.type == device_type::cpu      ? kernel_family::row_tiles
                                                    : kernel_family::block_tiles;
    const std::uint64_t rows = std::uint64_t{s.q_heads / s.kv_heads} * s.q_len;
    const std::uint64_t groups = std::uint64_t{s.batch} * s.kv_heads;
    // Each limit its own message, naming the value that passed it.
    if (rows > 0xffffu)
        return refuse("the decode kernel takes at most 65,535 query rows per K/V head (G x q_len = " +
                      std::to_string(rows) + ")");
    if (groups * rows > 0xffffffu)
        return refuse(
            "the decode kernel takes at most 2^24 = 16,777,216 query rows in all (batch x kv_heads x "
            "G x q_len = " +
            std::to_string(groups * rows) + ")");
    if (s.d_qk > 4096 || s.d_v > 4096)
        return refuse("the decode kernel takes head widths of at most 4,096 (d_qk = " + std::to_string(s.d_qk) +
                      ", d_v = " + std::to_string(s.d_v) + ")");
    if (s.kv_len > 0x7fffffffu)
        return refuse("the decode kernel takes at most 2^31 keys (kv_len = " + std::to_string(s.kv_len) + ")");
    p.rows = static_cast<std::uint32_t>(rows);
    p.groups = static_cast<std::uint32_t>(groups);
    p.q_len = static_cast<std::uint32_t>(s.q_len);
    p.q_heads = static_cast<std::uint32_t>(s.q_heads);
    p.kv_len = static_cast<std::uint32_t>(s.kv_len);
    p.kv_stride = std::max(r.kv_stride, p.kv_len);
    p.d = static_cast<std::uint32_t>(s.d_qk);
    p.dv = static_cast<std::uint32_t>(s.d_v);
    p.e4 = ceil_div(s.d_qk, 4);
    p.ev4 = ceil_div(s.d_v, 4);
    p.masks = r.masks;
    p.features = r.features;
    p.kv_format = r.kv_format;
    // The vote only where it pays: on a GPU one instruction and at most one atomic per subgroup.
    // llvmpipe already skips a branch no lane takes, so its per-element flag costs no atomic
    // either, and its subgroupAny and subgroupElect cost more than they save (the 32-layer decode
    // token's recorded form, LP_NUM_THREADS=0: 3 % more process CPU time with the vote).
    p.vote = info.subgroup_vote && (info.type != device_type::cpu || set.decode_vote);
    p.kv_end = std::min(r.kv_end, p.kv_len);
    p.kv_first = std::min(r.kv_first, p.kv_end);
    const std::uint32_t max_wg = std::max<std::uint32_t>(info.max_workgroup_invocations, 1);
    const std::uint32_t widest = std::max(p.e4, p.ev4);

    std::uint32_t step = 0;            // keys per loop iteration
    std::uint32_t per_step_loops = 1;  // loop iterations per step
    std::uint32_t fixed_loops = 0;     // loop iterations before the first step
    std::uint32_t target = 0, min_chunk = 0;
    if (p.family == kernel_family::coopmat) {
        // The cooperative-matrix kernel in its split mode: one subgroup per workgroup, its m-row tiles
        // holding the group's rows (GQA packed into M), K and V tiles of coop.bc keys.
        if (r.coop.m == 0) return refuse("internal: a cooperative-matrix decode plan without its tiles");
        p.coop = r.coop;
        p.wg = p.coop.wg();
        p.kps = p.coop.bc;
        p.rpi = p.coop.rows();
        p.row_blocks = ceil_div(p.rows, p.coop.rows());
        step = p.coop.bc;
        per_step_loops =
            static_cast<std::uint32_t>(std::min<std::uint64_t>(coop_loops_per_tile(p.coop), decode_loop_budget));
        const bool cpu = info.type == device_type::cpu;
        target = cpu ? decode_target_groups_cpu : decode_target_groups_gpu;
        min_chunk = cpu ? decode_min_chunk_cpu : decode_min_chunk_gpu;
    } else if (p.family == kernel_family::row_tiles) {
        // One subgroup per workgroup (never assumed: 8 where the device reports none usable).
        p.wg = info.subgroup_size;
        if (!power_of_two(p.wg) || p.wg > max_wg) {
            p.wg = 8;
            while (p.wg > max_wg) p.wg /= 2;
        }
        const std::uint32_t unrolled = set.decode_unrolled_texels ? set.decode_unrolled_texels : unrolled_texels_cpu;
        if (widest <= unrolled) {
            // Rows per lane: enough for the group's rows in one block, within the unrolled body
            // that LLVM builds in a few seconds (rows x texels per row <= 32, as the fused cpu
            // family).
            p.rpi = 1;
            while (p.rpi * p.wg < p.rows && p.rpi * 2 * widest <= 32) p.rpi *= 2;
            p.kps = p.rpi <= 2 ? 8 : 4;
        } else {
            // The wide form: loops over E and Ev, tb texels an iteration (a whole block of
            // quantized K/V; for texels the most of 8, 4, 2, 1 that divides both widths, so that
            // no texel is read twice). Each texel costs a Q fetch and an accumulator load and
            // store per row, shared by the step's keys: rows x keys per step = 64, 1 x 64 up to a
            // lane's worth of rows, else 2 x 32 (by CPU time per call on lavapipe: 2 x 32 at 16
            // and 32 rows, 1 x 64 at 8, each 10-15 % under the next best; bench/RESULTS.md).
            p.tb = 8;
            if (r.kv_format == contract::DECODE_KV_TEXELS)
                while (p.e4 % p.tb != 0 || p.ev4 % p.tb != 0) p.tb /= 2;
            p.rpi = p.rows > p.wg ? 2 : 1;
            p.kps = 64 / p.rpi;
            per_step_loops = 1 + p.e4 / p.tb + p.ev4 / p.tb;
            fixed_loops = p.ev4 / p.tb;  // clearing the accumulators
        }
        if (set.decode_cpu_rows) p.rpi = set.decode_cpu_rows, p.kps = set.decode_cpu_keys;
        p.row_blocks = ceil_div(p.rows, std::uint64_t{p.wg} * p.rpi);
        p.shuffle = cpu_shuffle(info, p.wg, set);
        step = p.kps;
        target = decode_target_groups_cpu, min_chunk = decode_min_chunk_cpu;
    } else {
        p.wg = std::max<std::uint32_t>(64, power_of_two(info.subgroup_size) ? info.subgroup_size : 1);
        while (p.wg > max_wg) p.wg /= 2;
        p.subgroup = info.subgroup_arithmetic && power_of_two(info.subgroup_size);
        p.rpi = std::min<std::uint32_t>(8, next_power_of_two(p.rows));
        const std::uint32_t shared = std::max<std::uint32_t>(info.max_shared_memory, 16384);
        while (p.rpi > 1 && p.rpi * p.e4 * 16 + 2 * p.rpi * p.wg * 4 > shared) p.rpi /= 2;
        if (p.rpi * p.e4 * 16 + 2 * p.rpi * p.wg * 4 > shared)
            return refuse("the gpu decode kernel needs more shared memory than " + std::to_string(shared) +
                          " bytes for d_qk = " + std::to_string(s.d_qk));
        p.kps = p.wg;
        p.row_blocks = ceil_div(p.rows, p.rpi);
        step = p.wg;
        // Per tile: the value loop (wg keys per output the invocation owns), the maxima (rows x
        // subgroups, or log2 wg), the tile itself.
        const std::uint32_t outs = ceil_div(std::uint64_t{p.rpi} * p.ev4, p.wg);
        per_step_loops = outs * p.wg + p.rpi * p.wg + 32 + 1;
        if (p.e4 > DECODE_GPU_UNROLLED_TEXELS) per_step_loops += p.e4;  // the score loop over E
        target = decode_target_groups_gpu, min_chunk = decode_min_chunk_gpu;
    }

    // The split: P chunks of `chunk` keys over the keys some row may see.
    const std::uint32_t keys = std::max<std::uint32_t>(p.kv_end - p.kv_first, 1);
    const std::uint64_t max_chunk = std::max<std::uint64_t>(
        step, std::uint64_t{(decode_loop_budget - fixed_loops) / per_step_loops} * step);  // loop limit
    const std::uint64_t base = std::uint64_t{p.row_blocks} * p.groups;
    std::uint64_t want = r.max_chunks ? r.max_chunks : std::max<std::uint64_t>(1, (target + base - 1) / base);
    want = std::min<std::uint64_t>(want, r.max_chunks ? want : std::max<std::uint64_t>(1, keys / min_chunk));
    want = std::min<std::uint64_t>(want, decode_max_chunks_total);  // a cap above what the merge takes is no cap
    want = std::max<std::uint64_t>(want, (keys + max_chunk - 1) / max_chunk);
    std::uint64_t chunk = (keys + want - 1) / want;
    chunk = (chunk + step - 1) / step * step;
    p.chunk = static_cast<std::uint32_t>(chunk);
    p.chunks = ceil_div(keys, chunk);
    if (p.chunks > decode_max_chunks_total)
        return refuse("the decode kernel would split kv_len = " + std::to_string(p.kv_len) + " into " +
                      std::to_string(p.chunks) + " chunks; at most " + std::to_string(decode_max_chunks_total));
    p.max_loop = std::max<std::uint32_t>(fixed_loops + ceil_div(p.chunk, step) * per_step_loops, p.chunks);
    return p;
}

decode_plan plan_decode(const device_info& info, const decode_request& r, const settings& set) {
    decode_plan p = try_plan_decode(info, r, set);
    if (!p.refusal.empty()) throw limit_exceeded(p.refusal);
    return p;
}

bool decode_suits(const sdpa_shape& s, bool return_weights) {
    if (return_weights || s.kv_heads == 0) return false;
    const std::size_t rows = s.q_heads / s.kv_heads * s.q_len;
    return s.q_len <= 16 && rows <= 64 && s.kv_len >= 1024;
}

contract::decode_push decode_push_for(const decode_plan& plan, const sdpa_problem& problem, float v_scale) {
    decode_push c{};
    c.rows = plan.rows;
    c.q_len = plan.q_len;
    c.kv_len = plan.kv_len;
    c.kv_stride = plan.kv_stride;
    c.chunk = plan.chunk;
    c.chunks = plan.chunks;
    c.row_blocks = plan.row_blocks;
    c.scale = problem.options.scale ? *problem.options.scale : default_scale(problem.shape);
    c.causal_offset = positions_of(problem).offset;
    c.q_heads = static_cast<std::uint32_t>(problem.shape.q_heads);
    c.kv_heads = static_cast<std::uint32_t>(problem.shape.kv_heads);
    c.v_scale = v_scale;
    c.kv_first = plan.kv_first;
    c.kv_end = plan.kv_end;
    if (!problem.mask.empty() || !problem.additive_mask.empty()) {
        const mask_strides m = broadcast_strides(problem.mask_shape, problem.shape);
        c.mask_b = static_cast<std::uint32_t>(m.batch);
        c.mask_h = static_cast<std::uint32_t>(m.head);
        c.mask_i = static_cast<std::uint32_t>(m.row);
        c.mask_j = static_cast<std::uint32_t>(m.col);
    }
    return c;
}

}  // namespace qkv::vulkan::detail
