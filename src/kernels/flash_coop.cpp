#include "kernels/flash_coop.hpp"

#include "vk/shaders.hpp"

namespace qkv::vulkan::detail {
namespace {

using namespace qkv::contract;

std::uint32_t ceil_div(std::uint64_t a, std::uint64_t b) { return static_cast<std::uint32_t>((a + b - 1) / b); }

}  // namespace

void record_flash_coop(recorder& exec, pipeline_set& pipes, const flash_layout& l, const flash_coop_plan& plan,
                       const flash_io& io, bool stats, bool v_finite) {
    static_assert(COOP_BINDINGS == 11 && COOP_BINDING_Q == 0 && COOP_BINDING_K == 1 && COOP_BINDING_V == 2 &&
                      COOP_BINDING_MASK == 3 && COOP_BINDING_ADDITIVE == 4 && COOP_BINDING_OUT == 5 &&
                      COOP_BINDING_STATE == 6 && COOP_BINDING_PARAMS == 7 && COOP_BINDING_LSE == 8 &&
                      COOP_BINDING_STATS == 9 && COOP_BINDING_ACC == 10 &&
                      row_matches<coop_push, coop_spec>(shader_id::flash_coop, "sssssssssss"),
                  "the binding list below follows the contract's order");
    const coop_tiles& t = plan.tiles;
    const pipeline& p = pipes.get(shader_id::flash_coop, t.spec(l.features, false, !v_finite), t.required_subgroup);
    const std::uint32_t rows = l.group() * l.q_len;
    const std::uint32_t groups[3] = {ceil_div(rows, t.rows()), 1, l.kv_batches()};
    coop_push push = coop_push_for(l);
    // Bound where the fused route reads nothing through them: the split-K partials.
    const binding unused = io.qkv;
    for_each_key_chunk(push, l.kv_len, plan.chunk_keys, stats, [&](const coop_push& part, bool first) {
        if (!first) exec.compute_barrier();
        exec.dispatch(p,
                      {io.qkv, io.qkv, io.qkv, io.mask_bits, io.additive, io.out, io.state, io.params_or_any(),
                       io.lse_or_any(), unused, unused},
                      &part, groups);
    });
}

void record_coop_decode(recorder& exec, pipeline_set& pipes, const flash_layout& l, const coop_tiles& t,
                        std::uint32_t kv_first, std::uint32_t kv_end, std::uint32_t chunk, std::uint32_t chunks,
                        const coop_decode_io& io, bool v_finite) {
    const pipeline& p = pipes.get(shader_id::flash_coop, t.spec(l.features, true, !v_finite), t.required_subgroup);
    const std::uint32_t rows = l.group() * l.q_len;
    const std::uint32_t groups[3] = {ceil_div(rows, t.rows()), chunks, l.kv_batches()};
    coop_push push = coop_push_for(l);
    push.q_off = io.q_off, push.k_off = io.k_off, push.v_off = io.v_off;
    push.kv_begin = kv_first, push.kv_stop = kv_end, push.chunk = chunk;
    // Bound where the split route reads nothing through them: the fused route's outputs.
    exec.dispatch(p, {io.q, io.k, io.v, io.mask, io.additive, io.acc, io.stats, io.params, io.stats, io.stats, io.acc},
                  &push, groups);
}

}  // namespace qkv::vulkan::detail
