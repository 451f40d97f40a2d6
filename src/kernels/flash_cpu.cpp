#include "kernels/flash_cpu.hpp"

#include <algorithm>
#include <string>

#include "kernels/gemm_tiles.hpp"
#include "qkv/vulkan/error.hpp"

namespace qkv::vulkan::detail {
namespace {

constexpr std::uint32_t pack_workgroup = 64;
// llvmpipe ends every loop of an invocation after 65,535 iterations in total. The key-step loop
// is the kernel's only loop (every other one has a constant trip count and is unrolled), so one
// dispatch may take this many steps, with a margin.
constexpr std::uint32_t max_steps_per_dispatch = 65535 - 1023;

std::uint64_t align_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }
std::uint32_t ceil_div(std::uint64_t a, std::uint64_t b) { return static_cast<std::uint32_t>((a + b - 1) / b); }
bool power_of_two(std::uint32_t v) { return v != 0 && (v & (v - 1)) == 0; }

}  // namespace

flash_cpu_plan plan_flash_cpu(const device_desc& desc, const flash_layout& l, const settings& set) {
    const device_info& info = desc.info;
    flash_cpu_plan p;
    // One subgroup per workgroup: the lanes of one SIMD vector on a CPU device. A device that
    // reports no usable subgroup size gets 8 (or fewer, if its workgroups are smaller).
    const std::uint32_t max_wg = desc.max_workgroup_x();
    p.wg = info.subgroup_size;
    if (!power_of_two(p.wg) || p.wg > max_wg) {
        p.wg = 8;
        while (p.wg > max_wg) p.wg /= 2;
    }
    p.d4 = ceil_div(std::max(l.d, 1u), 4);
    p.dv4 = ceil_div(std::max(l.dv, 1u), 4);
    // Each invocation keeps rpi rows of Q and of the accumulator in registers (spilled to the
    // stack beyond the CPU's vector registers), and every loop over them is unrolled. LLVM's
    // compile time grows faster than that unrolled body: measured on lavapipe with Mesa's shader
    // cache off (docs/devices.md), rows x texels-per-row of 32 compile in ~3.5 s, 64 in ~9 s and
    // 128 (8 rows of d = 64) in ~32 s for each new shape and mask. So the tile is capped at 32:
    // at d = 64 that is 2 rows x 8 keys, about 25 % slower per call than 8 x 4 but 8x faster to
    // build. settings::flash_cpu_rows/keys (QKV_FLASH_CPU_TILES=rows,keys) override it (e.g. 8,4
    // for long-running work).
    const std::uint32_t widest = std::max(p.d4, p.dv4);
    p.rpi = 8;
    while (p.rpi > 1 && p.rpi * widest > 32) p.rpi /= 2;
    p.kps = p.rpi <= 2 ? 8 : 4;
    if (set.flash_cpu_rows) p.rpi = set.flash_cpu_rows, p.kps = set.flash_cpu_keys;
    p.shuffle = cpu_shuffle(info, p.wg, set);
    p.npad_q = static_cast<std::uint32_t>(align_up(std::max(l.q_len, 1u), p.block()));
    p.npad_kv = static_cast<std::uint32_t>(align_up(std::max(l.kv_len, 1u), p.kps));
    std::uint64_t chunk = std::uint64_t{max_steps_per_dispatch} * p.kps;
    if (const std::uint32_t at_most = set.max_fused_keys)
        chunk = std::min<std::uint64_t>(chunk, std::max<std::uint64_t>(p.kps, at_most / p.kps * p.kps));
    p.chunk_keys = static_cast<std::uint32_t>(std::min<std::uint64_t>(chunk, p.npad_kv));

    p.half = l.fp16;
    p.format = texel_format(l.fp16);
    const std::uint64_t align = std::max(desc.texel_alignment, desc.storage_alignment);
    p.q_texels = std::uint64_t{l.q_batches()} * p.npad_q * p.d4;
    p.k_texels = std::uint64_t{l.kv_batches()} * p.npad_kv * p.d4;
    p.v_texels = std::uint64_t{l.kv_batches()} * p.npad_kv * p.dv4;
    p.flags_bytes = std::uint64_t{l.kv_batches()} * 4;
    p.q_offset = align_up(p.flags_bytes, align);
    p.k_offset = align_up(p.q_offset + p.q_texels * p.texel_bytes(), align);
    p.v_offset = align_up(p.k_offset + p.k_texels * p.texel_bytes(), align);
    p.bytes = p.v_offset + p.v_texels * p.texel_bytes();
    return p;
}

flash_cpu_refusal check_flash_cpu(const device_desc& desc, const flash_cpu_plan& p) {
    const device_info& info = desc.info;
    if (!desc.uniform_texels(p.half))
        return {std::string("the cpu kernel family needs ") + (p.half ? "R16G16B16A16_SFLOAT" : "R32G32B32A32_SFLOAT") +
                    " uniform texel buffers, which " + info.name + " does not support; use the gpu kernel family",
                false};
    const std::uint64_t max_texels = desc.max_texel_elements;
    const std::uint64_t texels = std::max({p.q_texels, p.k_texels, p.v_texels});
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
    v.q = buffer_view(dev, texels, p.format, p.q_offset, p.q_texels * tb);
    v.k = buffer_view(dev, texels, p.format, p.k_offset, p.k_texels * tb);
    v.v = buffer_view(dev, texels, p.format, p.v_offset, p.v_texels * tb);
    return v;
}

void record_flash_cpu(recorder& exec, pipeline_set& pipes, const flash_layout& l, const flash_cpu_plan& plan,
                      const flash_io& io, const flash_cpu_texels& tx, bool stats, bool v_finite) {
    // 1. Q, K, V into whole texels; the V flags zeroed first.
    exec.fill(tx.texels, 0, plan.flags_bytes, 0);
    exec.barrier(VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                 VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT);
    static_assert(
        contract::FLASH_PACK_BINDINGS == 3 &&
        row_matches<contract::flash_pack_push, contract::flash_pack_spec>(shader_id::flash_cpu_pack, "sss") &&
        row_matches<contract::flash_pack_push, contract::flash_pack_spec>(shader_id::flash_cpu_pack_f16, "sss"));
    const pipeline& pack = pipes.get(l.fp16 ? shader_id::flash_cpu_pack_f16 : shader_id::flash_cpu_pack,
                                     contract::flash_pack_spec{pack_workgroup, plan.half ? 1u : 0u});
    const std::uint64_t tb = plan.texel_bytes();
    struct tensor {
        std::uint32_t rows, npad, width, w4, off, heads;
        tensor_strides strides;
        std::uint64_t offset;
        bool v;
    };
    const tensor tensors[3] = {
        {l.q_len, plan.npad_q, l.d, plan.d4, 0, l.heads, l.q, plan.q_offset, false},
        {l.kv_len, plan.npad_kv, l.d, plan.d4, l.k_off, l.kv_heads, l.k, plan.k_offset, false},
        {l.kv_len, plan.npad_kv, l.dv, plan.dv4, l.v_off, l.kv_heads, l.v, plan.v_offset, true},
    };
    for (const tensor& t : tensors) {
        // Disjoint regions, but the same bindings: a barrier keeps synchronisation validation exact.
        if (&t != tensors) exec.compute_barrier();
        contract::flash_pack_push pk{};
        pk.rows = t.rows, pk.npad = t.npad, pk.width = t.width, pk.w4 = t.w4;
        pk.bs = t.strides.bs, pk.hs = t.strides.hs, pk.rs = t.strides.rs, pk.off = t.off;
        pk.heads = t.heads;
        pk.at = static_cast<std::uint32_t>(t.offset / tb);
        pk.mark_nonfinite = t.v ? 1u : 0u;
        pk.stride = t.npad;
        const std::uint32_t groups[3] = {ceil_div(std::uint64_t{t.npad} * t.w4, pack_workgroup), 1, l.batch * t.heads};
        exec.dispatch(pack, {io.qkv, binding{tx.texels, 0, plan.bytes}, binding{tx.texels, 0, plan.flags_bytes}}, &pk,
                      groups);
    }
    exec.compute_barrier();

    // 2. The kernel, one dispatch pair per key chunk.
    // Q, K, V as uniform texel buffers, then five storage buffers (contract/flash.h's order).
    static_assert(
        contract::FLASH_CPU_BINDINGS == 10 && contract::FLASH_CPU_BINDING_V == 2 &&
        contract::FLASH_CPU_BINDING_PARAMS == 8 && contract::FLASH_CPU_BINDING_LSE == 9 &&
        row_matches<contract::flash_cpu_push, contract::flash_cpu_spec>(shader_id::flash_cpu, "tttsssssss") &&
        row_matches<contract::flash_cpu_push, contract::flash_cpu_spec>(shader_id::flash_cpu_shuffle, "tttsssssss"));
    const shader_id kernel = plan.shuffle ? shader_id::flash_cpu_shuffle : shader_id::flash_cpu;
    const pipeline& plain = pipes.get(kernel, plan.spec(l.mask_flags(), false, l.features));
    const pipeline* careful = v_finite ? nullptr : &pipes.get(kernel, plan.spec(l.mask_flags(), true, l.features));
    const std::uint32_t blocks = ceil_div(l.q_len, plan.block());
    const std::uint32_t groups[3] = {blocks, 1, l.q_batches()};
    contract::flash_cpu_push push{};
    push.q_len = l.q_len, push.kv_len = l.kv_len;
    push.npad_q = plan.npad_q, push.npad_kv = plan.npad_kv;
    push.dv = l.dv, push.heads = l.heads, push.group = l.group();
    push.o_hs = l.o.hs, push.o_rs = l.o.rs;  // o.bs is heads·L·Ev (flash_layout::output_contiguous_per_batch)
    push.a_bs = l.a_bs;
    push.causal_offset = l.causal_offset;
    push.m_bs = l.m_bs, push.m_hs = l.m_hs, push.m_rs = l.m_rs, push.m_cs = l.m_cs;
    push.scale = l.scale;
    push.blocks = blocks;
    for_each_key_chunk(push, l.kv_len, plan.chunk_keys, stats, [&](const contract::flash_cpu_push& part, bool first) {
        // The (batch, head)s without, then those with, a NaN or Inf in V (see flash_cpu.comp).
        for (const pipeline* p : {&plain, careful}) {
            if (!p) continue;
            if (!first || p == careful) exec.compute_barrier();
            exec.dispatch(*p,
                          {texel(tx.q), texel(tx.k), texel(tx.v), io.mask_bits, io.additive, io.out, io.state,
                           binding{tx.texels, 0, plan.flags_bytes}, io.params_or_any(), io.lse_or_any()},
                          &part, groups);
        }
    });
}

}  // namespace qkv::vulkan::detail
