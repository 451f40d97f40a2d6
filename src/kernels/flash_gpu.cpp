#include "kernels/flash_gpu.hpp"

#include <algorithm>
#include <string>

#include "qkv/vulkan/error.hpp"

namespace qkv::vulkan::detail {
namespace {

std::uint32_t ceil_div(std::uint64_t a, std::uint64_t b) { return static_cast<std::uint32_t>((a + b - 1) / b); }

}  // namespace

void record_flash_gpu(recorder& exec, pipeline_set& pipes, const flash_layout& l, const flash_gpu_plan& plan,
                      const flash_io& io, bool stats) {
    const flash_tiles& t = plan.tiles;
    const shader_id shader = t.subgroup ? (l.fp16 ? shader_id::flash_subgroup_f16 : shader_id::flash_subgroup)
                                        : (l.fp16 ? shader_id::flash_f16 : shader_id::flash);
    static_assert(contract::FLASH_BINDINGS == 7 && contract::FLASH_BINDING_PARAMS == 5 &&
                  contract::FLASH_BINDING_LSE == 6 &&
                  row_matches<contract::flash_push, contract::flash_spec>(shader_id::flash, "sssssss") &&
                  row_matches<contract::flash_push, contract::flash_spec>(shader_id::flash_f16, "sssssss") &&
                  row_matches<contract::flash_push, contract::flash_spec>(shader_id::flash_subgroup, "sssssss") &&
                  row_matches<contract::flash_push, contract::flash_spec>(shader_id::flash_subgroup_f16, "sssssss"));
    const pipeline& p = pipes.get(shader, t.spec(l.features), t.required_subgroup);
    const std::uint32_t groups[3] = {ceil_div(l.q_len, t.br), 1, l.q_batches()};
    const contract::flash_push push = l.push();
    for_each_key_chunk(push, l.kv_len, plan.chunk_keys, stats, [&](const contract::flash_push& part, bool first) {
        if (!first) exec.compute_barrier();
        exec.dispatch(p, {io.qkv, io.mask_bits, io.additive, io.out, io.state, io.params_or_any(), io.lse_or_any()},
                      &part, groups);
    });
}

void record_flash_weights(recorder& exec, pipeline_set& pipes, const flash_layout& l, const flash_io& io,
                          binding weights) {
    // One loop of E iterations per invocation: far below llvmpipe's 65,535 for any head the fused
    // kernels take (fused_max_head).
    if (l.d > 4096)
        throw limit_exceeded(
            "the attention weights kernel takes heads of at most 4096 columns (d_qk = " + std::to_string(l.d) + ")");
    static_assert(contract::FLASH_WEIGHTS_BINDINGS == 6 && contract::FLASH_WEIGHTS_BINDING_PARAMS == 5 &&
                  row_matches<contract::flash_push, no_spec>(shader_id::flash_weights, "ssssss") &&
                  row_matches<contract::flash_push, no_spec>(shader_id::flash_weights_f16, "ssssss"));
    const pipeline& p = pipes.get(l.fp16 ? shader_id::flash_weights_f16 : shader_id::flash_weights);
    const std::uint32_t groups[3] = {ceil_div(l.kv_len, contract::FLASH_WEIGHTS_WORKGROUP), l.q_len, l.q_batches()};
    const contract::flash_push push = l.push();
    // The params buffer is read whatever the features (flash_weights.comp reads them at run time).
    if (io.params.buffer == VK_NULL_HANDLE) throw error("the attention weights kernel needs the score params");
    exec.dispatch(p, {io.qkv, io.mask_bits, io.additive, io.state, weights, io.params}, &push, groups);
}

}  // namespace qkv::vulkan::detail
