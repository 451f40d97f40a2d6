#include "kernels/flash_tiles.hpp"

#include <algorithm>

namespace qkv::vulkan::detail {

namespace {
std::uint32_t round_up(std::uint32_t v, std::uint32_t m) { return (v + m - 1) / m * m; }
std::uint32_t pow2_at_least(std::uint32_t v) {
    std::uint32_t p = 1;
    while (p < v) p *= 2;
    return p;
}
std::uint32_t pow2_at_most(std::uint32_t v) {
    std::uint32_t p = 1;
    while (p * 2 <= v) p *= 2;
    return p;
}
}  // namespace

flash_tiles choose_flash_tiles(const device_info& info, std::uint32_t seq, std::uint32_t d, std::uint32_t dv,
                               const subgroup_control& control) {
    // Row teams of one subgroup each (FlashAttention-2: a warp owns its rows for the whole key
    // loop); the shader checks at run time that a subgroup really is one team and otherwise
    // reduces through shared memory, so a wrong guess costs speed, never correctness.
    const bool cpu = info.type == device_type::cpu, discrete = info.type == device_type::discrete_gpu;
    const std::uint32_t max_inv = std::max<std::uint32_t>(info.max_workgroup_invocations, 1);
    std::uint32_t team = info.subgroup_size ? pow2_at_most(info.subgroup_size) : 32;
    team = std::clamp<std::uint32_t>(team, 4, 64);
    // A GPU that lets a pipeline pick 32 (AMD RDNA: wave32 or wave64; Intel: SIMD8..32) gets 32,
    // as on NVIDIA: twice the teams, so twice the rows per workgroup share each K/V tile.
    if (!cpu && control.required_size && control.full_subgroups && control.min_size <= 32 && control.max_size >= 32)
        team = 32;
    team = std::min(team, pow2_at_most(max_inv));
    // Invocations: 256 on a discrete GPU (8 warps / 4 waves: enough to hide shared-memory latency
    // with two workgroups per SM/CU), 128 on an integrated GPU (fewer, smaller cores), 64 on a
    // CPU device (each workgroup is one thread's loop over SIMD vectors).
    std::uint32_t wg = discrete ? 256 : cpu ? 64 : 128;
    wg = std::max(wg, team);
    while (wg > team && wg > max_inv) wg /= 2;
    // Rows per team: 4 on GPUs (each K/V tile then serves 4·teams rows), 2 on a CPU device,
    // 1 for short sequences (more workgroups).
    std::uint32_t rpg = cpu ? 2 : 4;
    if (seq <= 256) rpg = 1;
    // Keys per tile: 64 on a discrete GPU, else 32, and at least one per lane of a team.
    std::uint32_t bc = std::max<std::uint32_t>(discrete ? 64 : 32, team);

    flash_tiles t;
    t.team = team;
    t.d_max = round_up(std::max<std::uint32_t>(d, 1), 4);
    std::uint32_t dv4 = (std::max<std::uint32_t>(dv, 1) + 3) / 4;
    dv4 = dv4 < team ? pow2_at_least(dv4) : round_up(dv4, team);  // the value lanes tile the team exactly
    t.dv_max = 4 * dv4;
    const bool sure = info.subgroup_arithmetic && control.required_size && control.full_subgroups &&
                      team >= control.min_size && team <= control.max_size;
    const auto shape = [&] {
        t.wg = wg;
        t.fallback = sure && wg / team <= control.max_subgroups ? 0 : 1;
        t.bc = bc;
        t.br = (wg / team) * rpg;
        t.q_regs = rpg * t.d_max <= 64 ? 1 : 0;  // up to 64 floats of queries per lane
        return t.shared_bytes() <= info.max_shared_memory;
    };
    // Shrink until the shared tiles fit: keys per tile to 32, rows to 1 per team, keys per tile
    // to 4, then fewer teams, then fewer keys per tile (down to 1, for the widest heads). The
    // smallest (one team of <= 64 lanes, 1 key) fits the 16 KiB every Vulkan device has for heads
    // up to fused_max_head (576: about 11 KiB with 2 keys; tests/flash_tiles_test.cpp).
    while (!shape()) {
        if (bc > 32)
            bc /= 2;
        else if (rpg > 1)
            rpg /= 2;
        else if (bc > 4)
            bc /= 2;
        else if (wg > team)
            wg /= 2;
        else if (bc > 1)
            bc /= 2;
        else
            break;  // plan_flash_gpu refuses it
    }
    t.subgroup = info.subgroup_arithmetic;
    t.required_subgroup = t.fallback ? 0 : team;
    return t;
}

device_info flash_tiles_device(const device_info& info, const device_info* as) {
    if (!as) return info;
    device_info d = *as;
    d.max_shared_memory = std::min(d.max_shared_memory, info.max_shared_memory);
    d.max_workgroup_invocations = std::min(d.max_workgroup_invocations, info.max_workgroup_invocations);
    d.subgroup_arithmetic = d.subgroup_arithmetic && info.subgroup_arithmetic;
    return d;
}

std::uint32_t flash_chunk_keys(const device_info& info, const subgroup_control& control, std::uint32_t seq,
                               std::uint32_t d, std::uint32_t dv, std::uint32_t at_most, const device_info* tiles_as) {
    return flash_chunk_keys(info, choose_flash_tiles(flash_tiles_device(info, tiles_as), seq, d, dv, control), seq,
                            at_most);
}

std::uint32_t flash_chunk_keys(const device_info& info, const flash_tiles& t, std::uint32_t kv_len,
                               std::uint32_t at_most) {
    const std::uint32_t cap = at_most ? std::min(kv_len, at_most) : kv_len;
    if (info.type != device_type::cpu) return cap;
    // Loop iterations of one invocation per K/V tile, counted as if no loop were unrolled (llvmpipe
    // unrolls the constant ones, so this is an upper bound): flash.comp's loops, in order.
    const std::uint64_t d4 = t.d_max / 4, dv4 = t.dv_max / 4, rpg = t.rows_per_team();
    const std::uint64_t kpl = (t.bc + t.team - 1) / t.team;
    const std::uint64_t o_lanes = std::min<std::uint64_t>(dv4, t.team), o_groups = t.team / o_lanes;
    const std::uint64_t o_rows = (rpg + o_groups - 1) / o_groups, o_cols = dv4 / o_lanes;
    const auto per = [&](std::uint64_t work) { return (work + t.wg - 1) / t.wg; };
    const std::uint64_t per_tile = 1                                               // the tile loop
                                   + 5 * (per(t.bc * d4) + per(t.bc * dv4))        // K, V loads (4 scalars each)
                                   + d4 * (1 + kpl + rpg * (1 + kpl))              // scores
                                   + 2 * rpg * (1 + kpl)                           // mask, probabilities
                                   + 2 * rpg * (1 + t.team) + rpg                  // reductions, sums
                                   + o_rows * (1 + o_cols)                         // rescale
                                   + t.bc * (1 + o_cols + o_rows * (1 + o_cols));  // values
    const std::uint64_t fixed = 5 * per(t.br * d4) + 5 * rpg * d4 + 2 * rpg + o_rows * o_cols * 5 +
                                o_rows * (rpg + 5 * o_cols);  // queries, set-up, resume, output
    constexpr std::uint64_t budget = 65535 - 4096;            // with a margin
    const std::uint64_t tiles = std::max<std::uint64_t>(1, (budget - std::min(budget - 1, fixed)) / per_tile);
    return static_cast<std::uint32_t>(std::min<std::uint64_t>(cap, tiles * t.bc));
}

}  // namespace qkv::vulkan::detail
