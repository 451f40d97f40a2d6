#include "kernels/flash_coop_backward_plan.hpp"

#include <algorithm>
#include <numeric>
#include <string>

#include "contract/backward.h"
#include "contract/coop.h"
#include "kernels/flash_backward_plan.hpp"
#include "qkv/vulkan/error.hpp"

namespace qkv::vulkan::detail {
namespace {

using namespace qkv::contract;

std::uint64_t ceil_div(std::uint64_t a, std::uint64_t b) { return (a + b - 1) / b; }
std::uint32_t round_up(std::uint32_t v, std::uint32_t to) { return static_cast<std::uint32_t>(ceil_div(v, to) * to); }

// llvmpipe ends every loop of an invocation after 65,535 iterations in total: a dispatch of either
// kernel takes as many steps as fit that, with a margin for the block's loads and stores.
constexpr std::uint64_t loop_budget = 65535 - 4096;

/// The loop iterations of one invocation per step of each kernel and outside its step loop,
/// counting every loop as if llvmpipe did not unroll it (an upper bound: element loops over a
/// tile shared by the workgroup's invocations, one per matrix product's K and N tiles).
struct bwd_loops {
    std::uint64_t per_step = 0, fixed = 0;
};

bwd_loops dkdv_loops(const coop_bwd_tiles& t) {
    const std::uint64_t keys = t.dkdv_keys(), rows = t.dkdv_rows, wg = t.wg(), widths = t.d_pad + t.dv_pad;
    bwd_loops c;
    c.per_step = 1 + ceil_div(rows * widths, wg) + ceil_div(rows, wg)  // the step loop, Q and dO, lse' and D
                 + rows / t.n * (widths / t.k)                         // Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ
                 + 2 * ceil_div(keys * rows, wg)                       // Pᵀ, dSᵀ element by element
                 + widths / t.n * (rows / t.k)                         // dV += Pᵀ·dO, dK += dSᵀ·Q
                 + 2 * (rows / t.n);                                   // Sᵀ and dPᵀ to shared memory
    c.fixed = 2 * ceil_div(keys * widths, wg) + 2 * (widths / t.n) * ceil_div(t.m * t.n, t.lanes);
    return c;
}

bwd_loops dq_loops(const coop_bwd_tiles& t) {
    const std::uint64_t rows = t.dq_rows(), keys = t.dq_keys, wg = t.wg(), widths = t.d_pad + t.dv_pad;
    bwd_loops c;
    c.per_step = 1 + ceil_div(keys * widths, wg)  // the step loop, K and V
                 + keys / t.n * (widths / t.k)    // S = Q·Kᵀ, dP = dO·Vᵀ
                 + 2 * ceil_div(rows * keys, wg)  // P, dS element by element
                 + t.d_pad / t.n * (keys / t.k)   // dQ += dS·K
                 + 2 * (keys / t.n);              // S and dP to shared memory
    c.fixed = ceil_div(rows * widths, wg) + ceil_div(rows, wg) + (t.d_pad / t.n) * ceil_div(t.m * t.n, t.lanes);
    return c;
}

/// Items per dispatch: whole steps of `step` items within the loop budget (0: not one step fits).
std::uint64_t chunk_of(const bwd_loops& c, std::uint32_t step) {
    const std::uint64_t room = loop_budget > c.fixed ? loop_budget - c.fixed : 0;
    return room / c.per_step * step;
}

}  // namespace

std::uint32_t coop_bwd_tiles::dkdv_shared_bytes() const {
    const std::uint32_t keys = dkdv_keys(), rows = dkdv_rows;
    return 2 * keys * (d_pad + COOP_PAD_HALVES) + 2 * keys * (dv_pad + COOP_PAD_HALVES) +
           2 * rows * (d_pad + COOP_PAD_HALVES) + 2 * rows * (dv_pad + COOP_PAD_HALVES) +
           2 * 4 * keys * (rows + COOP_PAD_FLOATS) + 2 * 2 * keys * (rows + COOP_PAD_HALVES) + 8 * rows +
           4 * subgroups * m * (n + COOP_PAD_FLOATS);
}

std::uint32_t coop_bwd_tiles::dq_shared_bytes() const {
    const std::uint32_t rows = dq_rows(), keys = dq_keys;
    return 2 * rows * (d_pad + COOP_PAD_HALVES) + 2 * rows * (dv_pad + COOP_PAD_HALVES) +
           2 * keys * (d_pad + COOP_PAD_HALVES) + 2 * keys * (dv_pad + COOP_PAD_HALVES) +
           2 * 4 * rows * (keys + COOP_PAD_FLOATS) + 2 * rows * (keys + COOP_PAD_HALVES) + (8 + 16) * rows +
           4 * subgroups * m * (n + COOP_PAD_FLOATS);
}

std::uint32_t flash_coop_bwd_plan::dispatches(const flash_layout& l) const {
    const std::uint64_t dq = l.kv_len == 0 ? 1 : ceil_div(l.kv_len, dq_chunk);
    const std::uint64_t dkdv = ceil_div(std::uint64_t{l.group()} * npad_q, dkdv_chunk);
    return static_cast<std::uint32_t>(dq + dkdv);
}

coop_verdict check_coop_backward(const device_desc& desc, const flash_layout& l, const flash_bwd_request& r,
                                 const settings& set, flash_coop_bwd_plan& p) {
    const device_info& info = desc.info;
    p = {};
    // The forward's checks and its shape: the same device, build, gates and storage rules.
    coop_tiles fwd;
    coop_verdict v = check_coop(desc, l, false, set, fwd);
    if (!v.why.empty()) return v;
    if (r.d_mask)
        return {
            "the cooperative-matrix backward does not write the additive mask's gradient "
            "(return_d_additive_mask); kernel automatic, row_tiles or block_tiles computes it",
            false};
    coop_bwd_tiles& t = p.tiles;
    t.lanes = fwd.lanes, t.required_subgroup = fwd.required_subgroup;
    t.m = fwd.m, t.n = fwd.n, t.k = fwd.k;
    // A head width is the K of one product and the N of another (Sᵀ = K·Qᵀ, dK += dSᵀ·Q).
    const std::uint32_t width_step = std::lcm(std::lcm(t.k, t.n), 8u);
    t.d_pad = round_up(std::max(l.d, 1u), width_step);
    t.dv_pad = round_up(std::max(l.dv, 1u), width_step);
    // A step's rows (dk/dv) or keys (dq) are the N of one product and the K of the next.
    const std::uint32_t step = std::lcm(t.n, t.k);
    // A CPU device: one subgroup and the shortest steps (every unrolled product is straight-line
    // code for LLVM), as the forward. A GPU: four subgroups share each step's tiles, 32 rows or
    // keys a step where shared memory allows (not measured on a GPU here).
    const bool cpu = info.type == device_type::cpu;
    const std::uint32_t max_wg = desc.max_workgroup_x();
    t.subgroups = cpu ? 1 : 4;
    while (t.subgroups > 1 &&
           (t.wg() > max_wg || (desc.subgroups.max_subgroups && t.subgroups > desc.subgroups.max_subgroups)))
        t.subgroups /= 2;
    t.dkdv_rows = t.dq_keys = cpu ? step : std::max(step, 32u);
    const auto fits = [&] {
        return t.dkdv_shared_bytes() <= info.max_shared_memory && t.dq_shared_bytes() <= info.max_shared_memory &&
               t.wg() <= max_wg;
    };
    while (!fits()) {
        if (t.dkdv_rows > step)
            t.dkdv_rows = t.dq_keys = std::max(step, t.dkdv_rows / 2);
        else if (t.subgroups > 1)
            t.subgroups /= 2;
        else
            break;
    }
    if (!fits())
        return {"the cooperative-matrix backward needs " +
                    std::to_string(std::max(t.dkdv_shared_bytes(), t.dq_shared_bytes())) +
                    " bytes of shared memory and " + std::to_string(t.wg()) + " invocations for head widths " +
                    std::to_string(l.d) + " / " + std::to_string(l.dv) + "; " + info.name + " has " +
                    std::to_string(info.max_shared_memory) + " bytes and " + std::to_string(max_wg),
                true};

    p.automatic = v.automatic;
    p.npad_q = round_up(std::max(l.q_len, 1u), std::lcm(t.dq_rows(), t.dkdv_rows));
    p.npad_kv = round_up(std::max(l.kv_len, 1u), std::lcm(t.dkdv_keys(), t.dq_keys));
    std::uint64_t slots = std::uint64_t{l.group()} * p.npad_q, keys = p.npad_kv;
    if (cpu) {
        const std::uint64_t dkdv = chunk_of(dkdv_loops(t), t.dkdv_rows), dq = chunk_of(dq_loops(t), t.dq_keys);
        if (dkdv == 0 || dq == 0)
            return {"the cooperative-matrix backward's steps for head widths " + std::to_string(l.d) + " / " +
                        std::to_string(l.dv) + " would run more than the 65,535 loop iterations " + info.name +
                        " allows an invocation",
                    true};
        slots = std::min(slots, dkdv);
        keys = std::min(keys, dq);
    }
    if (const std::uint32_t at_most = set.max_fused_keys) {
        slots =
            std::min<std::uint64_t>(slots, std::max<std::uint64_t>(t.dkdv_rows, at_most / t.dkdv_rows * t.dkdv_rows));
        keys = std::min<std::uint64_t>(keys, std::max<std::uint64_t>(t.dq_keys, at_most / t.dq_keys * t.dq_keys));
    }
    p.dkdv_chunk = static_cast<std::uint32_t>(slots);
    p.dq_chunk = static_cast<std::uint32_t>(keys);
    p.extras = r.check ? BWD_CHECK : 0u;
    p.half = true;
    return v;
}

flash_coop_bwd_plan plan_flash_coop_backward(const device_desc& desc, const flash_layout& l, const flash_bwd_request& r,
                                             const settings& set) {
    flash_coop_bwd_plan p;
    const coop_verdict v = check_coop_backward(desc, l, r, set, p);
    if (!v.why.empty()) {
        if (v.limit) throw limit_exceeded("sdpa_backward: " + v.why);
        throw unavailable("sdpa_backward: " + v.why);
    }
    return p;
}

}  // namespace qkv::vulkan::detail
