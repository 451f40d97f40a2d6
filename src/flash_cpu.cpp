#include "flash_cpu.hpp"

#include <algorithm>
#include <cstdlib>

#include "qkv/vulkan/error.hpp"
#include "stages.hpp"

namespace qkv::vulkan::detail {
namespace {

/// Mirrors the push-constant block of shaders/flash_cpu_pack.comp.
struct flash_cpu_pack_push {
    group_offset offset;
    std::uint32_t seq = 0, npad = 0;
    std::uint32_t d = 0, dv = 0, d4 = 0, dv4 = 0;
    std::uint32_t ld = 0, heads = 1;
    std::uint32_t k_col = 0, v_col = 0;
    std::uint32_t q_at = 0, k_at = 0, v_at = 0;
};
static_assert(sizeof(flash_cpu_pack_push) <= 128);

constexpr std::uint32_t pack_workgroup = 64;
// llvmpipe ends every loop of an invocation after 65,535 iterations in total. The key-step loop
// is the kernel's only loop (every other one has a constant trip count and is unrolled), so one
// dispatch may take this many steps, with a margin.
constexpr std::uint32_t max_steps_per_dispatch = 65535 - 1023;

std::uint64_t align_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }
std::uint32_t ceil_div(std::uint64_t a, std::uint64_t b) { return static_cast<std::uint32_t>((a + b - 1) / b); }
bool power_of_two(std::uint32_t v) { return v != 0 && (v & (v - 1)) == 0; }

}  // namespace

flash_cpu_plan plan_flash_cpu(const device& dev, bool fp16, std::uint32_t batches, std::uint32_t heads,
                              std::uint32_t seq, std::uint32_t d, std::uint32_t dv, std::uint32_t at_most) {
    const device_info& info = dev.info();
    flash_cpu_plan p;
    // One subgroup per workgroup: the lanes of one SIMD vector on a CPU device. A device that
    // reports no usable subgroup size gets 8 (or fewer, if its workgroups are smaller).
    const std::uint32_t max_wg = std::min(info.max_workgroup_invocations, dev.limits().maxComputeWorkGroupSize[0]);
    p.wg = info.subgroup_size;
    if (!power_of_two(p.wg) || p.wg > max_wg) {
        p.wg = 8;
        while (p.wg > max_wg) p.wg /= 2;
    }
    p.seq = seq, p.d = d, p.dv = dv, p.heads = heads, p.batches = batches;
    p.d4 = ceil_div(d, 4);
    p.dv4 = ceil_div(dv, 4);
    // Each invocation keeps rpi rows of Q and of the accumulator in registers (spilled to the
    // stack beyond the CPU's vector registers), and every loop over them is unrolled. LLVM's
    // compile time grows faster than that unrolled body: measured on lavapipe with Mesa's shader
    // cache off (docs/devices.md), rows x texels-per-row of 32 compile in ~3.5 s, 64 in ~9 s and
    // 128 (8 rows of d = 64) in ~32 s for each new shape and mask. So the tile is capped at 32:
    // at d = 64 that is 2 rows x 8 keys, about 25 % slower per call than 8 x 4 but 8x faster to
    // build. QKV_FLASH_CPU_TILES=rows,keys overrides it (e.g. 8,4 for long-running work).
    const std::uint32_t widest = std::max(p.d4, p.dv4);
    p.rpi = 8;
    while (p.rpi > 1 && p.rpi * widest > 32) p.rpi /= 2;
    p.kps = p.rpi <= 2 ? 8 : 4;
    if (const char* t = std::getenv("QKV_FLASH_CPU_TILES"); t && *t) {  // tuning: "rpi,kps"
        char* end = nullptr;
        const unsigned long r = std::strtoul(t, &end, 10);
        const unsigned long k = (end && *end == ',') ? std::strtoul(end + 1, nullptr, 10) : 0;
        if (power_of_two(static_cast<std::uint32_t>(r)) && r <= 16) p.rpi = static_cast<std::uint32_t>(r);
        if (power_of_two(static_cast<std::uint32_t>(k)) && k <= 32) p.kps = static_cast<std::uint32_t>(k);
    }
    p.npad = static_cast<std::uint32_t>(align_up(seq, std::max(p.block(), p.kps)));  // both powers of two
    std::uint64_t chunk = std::uint64_t{max_steps_per_dispatch} * p.kps;
    if (at_most) chunk = std::min<std::uint64_t>(chunk, std::max<std::uint64_t>(p.kps, at_most / p.kps * p.kps));
    p.chunk_keys = static_cast<std::uint32_t>(std::min<std::uint64_t>(chunk, p.npad));

    p.half = fp16;
    p.format = fp16 ? VK_FORMAT_R16G16B16A16_SFLOAT : VK_FORMAT_R32G32B32A32_SFLOAT;
    const std::uint64_t align = std::max<std::uint64_t>(
        {16, dev.limits().minTexelBufferOffsetAlignment, dev.limits().minStorageBufferOffsetAlignment});
    p.qk_texels = std::uint64_t{batches} * p.npad * p.d4;
    p.v_texels = std::uint64_t{batches} * p.npad * p.dv4;
    p.flags_bytes = std::uint64_t{batches} * 4;
    p.q_offset = align_up(p.flags_bytes, align);
    p.k_offset = align_up(p.q_offset + p.qk_texels * p.texel_bytes(), align);
    p.v_offset = align_up(p.k_offset + p.qk_texels * p.texel_bytes(), align);
    p.bytes = p.v_offset + p.v_texels * p.texel_bytes();
    return p;
}

flash_cpu_refusal check_flash_cpu(const device& dev, const flash_cpu_plan& p) {
    const device_info& info = dev.info();
    if (!dev.uniform_texel_format(p.format))
        return {std::string("the cpu kernel family needs ") + (p.half ? "R16G16B16A16_SFLOAT" : "R32G32B32A32_SFLOAT") +
                    " uniform texel buffers, which " + info.name + " does not support; use the gpu kernel family",
                false};
    const std::uint64_t max_texels = dev.limits().maxTexelBufferElements;
    const std::uint64_t texels = std::max(p.qk_texels, p.v_texels);
    if (texels > max_texels)
        return {"the cpu kernel family would read " + std::to_string(texels) +
                    " texels through one texel buffer, more than this device's maxTexelBufferElements of " +
                    std::to_string(max_texels) + "; split the batch into several calls or use the gpu kernel family",
                true};
    if (p.bytes > info.max_storage_buffer_range || p.bytes / 4 > 0xffffffffu)
        return {"the cpu kernel family's texel buffer needs " + std::to_string(p.bytes) +
                    " bytes, more than this device's maxStorageBufferRange of " +
                    std::to_string(info.max_storage_buffer_range) + "; split the batch into several calls",
                true};
    return {};
}

flash_cpu_views make_flash_cpu_views(const device& dev, const buffer& texels, const flash_cpu_plan& p) {
    flash_cpu_views v;
    const std::uint64_t tb = p.texel_bytes();
    v.q = buffer_view(dev, texels, p.format, p.q_offset, p.qk_texels * tb);
    v.k = buffer_view(dev, texels, p.format, p.k_offset, p.qk_texels * tb);
    v.v = buffer_view(dev, texels, p.format, p.v_offset, p.v_texels * tb);
    return v;
}

void record_flash_cpu(executor& exec, pipeline_set& pipes, const flash_cpu_plan& plan, const flash_cpu_io& io,
                      const flash_cpu_push& push, std::uint32_t ld, std::uint32_t k_col, std::uint32_t v_col) {
    // 1. Q, K, V into whole texels; the V flags zeroed first.
    exec.fill(io.texels, 0, plan.flags_bytes, 0);
    exec.barrier(VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                 VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT);
    flash_cpu_pack_push pk;
    pk.seq = plan.seq, pk.npad = plan.npad;
    pk.d = plan.d, pk.dv = plan.dv, pk.d4 = plan.d4, pk.dv4 = plan.dv4;
    pk.ld = ld, pk.heads = plan.heads, pk.k_col = k_col, pk.v_col = v_col;
    const std::uint64_t tb = plan.texel_bytes();
    pk.q_at = static_cast<std::uint32_t>(plan.q_offset / tb);
    pk.k_at = static_cast<std::uint32_t>(plan.k_offset / tb);
    pk.v_at = static_cast<std::uint32_t>(plan.v_offset / tb);
    const pipeline& pack = pipes.get(io.qkv_fp16 ? shader_id::flash_cpu_pack_f16 : shader_id::flash_cpu_pack, 3,
                                     sizeof pk, {pack_workgroup, plan.half ? 1u : 0u});
    const std::uint32_t pack_groups[3] = {ceil_div(std::uint64_t{plan.npad} * (2 * plan.d4 + plan.dv4), pack_workgroup),
                                          1, plan.batches};
    exec.dispatch(pack, {io.qkv, binding{io.texels, 0, plan.bytes}, binding{io.texels, 0, plan.flags_bytes}}, &pk,
                  pack_groups);
    exec.compute_barrier();

    // 2. The kernel, one dispatch per key chunk.
    const std::vector<VkDescriptorType> types = {
        VK_DESCRIPTOR_TYPE_UNIFORM_TEXEL_BUFFER, VK_DESCRIPTOR_TYPE_UNIFORM_TEXEL_BUFFER,
        VK_DESCRIPTOR_TYPE_UNIFORM_TEXEL_BUFFER, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
        VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,       VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
        VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,       VK_DESCRIPTOR_TYPE_STORAGE_BUFFER};
    const std::uint32_t masks = push.flags & (flag_causal | flag_mask | flag_additive);
    std::vector<std::uint32_t> spec = plan.spec();
    spec.push_back(masks);
    spec.push_back(0);
    const pipeline& plain = pipes.get(shader_id::flash_cpu, types, sizeof(flash_cpu_push), spec);
    spec.back() = 1;
    const pipeline& careful = pipes.get(shader_id::flash_cpu, types, sizeof(flash_cpu_push), spec);
    const std::uint32_t blocks = ceil_div(plan.seq, plan.block());
    const std::uint32_t groups[3] = {blocks, 1, plan.batches};
    for (std::uint32_t begin = 0; begin < plan.seq; begin += plan.chunk_keys) {
        flash_cpu_push part = push;
        part.flags &= ~masks;
        part.npad = plan.npad;
        part.blocks = blocks;
        part.kv_begin = begin;
        part.kv_stop = std::min(plan.seq, begin + plan.chunk_keys);
        if (begin > 0) part.flags |= flag_resume;
        if (part.kv_stop < plan.seq) part.flags |= flag_partial;
        // The (batch, head)s without, then those with, a NaN or Inf in V (see flash_cpu.comp).
        for (const pipeline* p : {&plain, &careful}) {
            if (begin > 0 || p == &careful) exec.compute_barrier();
            exec.dispatch(*p,
                          {texel(io.q), texel(io.k), texel(io.v), io.mask_bits, io.additive, io.out, io.state,
                           binding{io.texels, 0, plan.flags_bytes}},
                          &part, groups);
        }
    }
}

}  // namespace qkv::vulkan::detail
