#include "kernels/flash_cpu.hpp"

#include <algorithm>
#include <string>

#include "contract/score.h"
#include "kernels/gemm_tiles.hpp"
#include "qkv/vulkan/error.hpp"

namespace qkv::vulkan::detail {
namespace {

constexpr std::uint32_t pack_workgroup = 64;
std::uint32_t ceil_div(std::uint64_t a, std::uint64_t b) { return static_cast<std::uint32_t>((a + b - 1) / b); }

}  // namespace

flash_cpu_views make_flash_cpu_views(const device& dev, const buffer& texels, const flash_cpu_plan& p) {
    flash_cpu_views v;
    const std::uint64_t tb = p.texel_bytes();
    v.q = buffer_view(dev, texels, texel_format(p.half), p.q_offset, p.q_texels * tb);
    v.k = buffer_view(dev, texels, texel_format(p.half), p.k_offset, p.k_texels * tb);
    v.v = buffer_view(dev, texels, texel_format(p.half), p.v_offset, p.v_texels * tb);
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
