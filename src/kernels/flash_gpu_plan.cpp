#include "kernels/flash_gpu_plan.hpp"

#include <algorithm>
#include <initializer_list>
#include <string>

#include "qkv/vulkan/error.hpp"

namespace qkv::vulkan::detail {
namespace {

bool all_multiples_of_4(std::initializer_list<std::uint32_t> values) {
    return std::all_of(values.begin(), values.end(), [](std::uint32_t v) { return v % 4 == 0; });
}

}  // namespace

flash_gpu_plan plan_flash_gpu(const device_desc& desc, const flash_layout& l, const settings& set) {
    const device_info& info = desc.info;
    flash_gpu_plan plan;
    plan.tiles = choose_flash_tiles(flash_tiles_device(info, set.tiles_as()), l.q_len, l.d, l.dv, desc.subgroups);
    const flash_tiles& t = plan.tiles;
    if (t.shared_bytes() > info.max_shared_memory || t.wg > info.max_workgroup_invocations)
        throw limit_exceeded(
            "the fused kernel needs " + std::to_string(t.shared_bytes()) + " bytes of shared memory and " +
            std::to_string(t.wg) + " invocations per workgroup for head widths " + std::to_string(l.d) + " / " +
            std::to_string(l.dv) + "; " + info.name + " has " + std::to_string(info.max_shared_memory) + " bytes and " +
            std::to_string(info.max_workgroup_invocations) + " invocations");
    // vec4 loads need every element offset the shader forms to be a multiple of 4.
    plan.tiles.vec4 = all_multiples_of_4({l.d, l.dv, l.q.bs, l.q.hs, l.q.rs, l.k.bs, l.k.hs, l.k.rs, l.v.bs, l.v.hs,
                                          l.v.rs, l.k_off, l.v_off})
                          ? 1
                          : 0;
    plan.chunk_keys = std::max(1u, flash_chunk_keys(info, t, l.kv_len, set.max_fused_keys));
    return plan;
}

}  // namespace qkv::vulkan::detail
