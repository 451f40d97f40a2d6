#include "kernels/sdpa_decode.hpp"

#include <algorithm>
#include <string>

#include "kernels/gemm_tiles.hpp"
#include "qkv/vulkan/error.hpp"

namespace qkv::vulkan::detail {
namespace {

using namespace qkv::contract;

std::uint32_t ceil_div(std::uint64_t a, std::uint64_t b) { return static_cast<std::uint32_t>((a + b - 1) / b); }

}  // namespace

void record_decode(recorder& exec, pipeline_set& pipes, const decode_plan& plan, const decode_io& io,
                   const contract::decode_push& push, decode_values values) {
    const bool blocks = plan.kv_format != DECODE_KV_TEXELS;
    const shader_id id = plan.family != kernel_family::row_tiles
                             ? (blocks ? shader_id::sdpa_decode_gpu_blocks : shader_id::sdpa_decode_gpu)
                         : plan.shuffle
                             ? (blocks ? shader_id::sdpa_decode_cpu_shuffle_blocks : shader_id::sdpa_decode_cpu_shuffle)
                             : (blocks ? shader_id::sdpa_decode_cpu_blocks : shader_id::sdpa_decode_cpu);
    const binding gate = io.gate.buffer ? io.gate : io.params;  // read only when gated
    static_assert(DECODE_BINDING_Q == 0 && DECODE_BINDING_K == 1 && DECODE_BINDING_V == 2 && DECODE_BINDING_MASK == 3 &&
                      DECODE_BINDING_ADDITIVE == 4 && DECODE_BINDING_STATS == 5 && DECODE_BINDING_ACC == 6 &&
                      DECODE_BINDING_PARAMS == 7 && DECODE_BINDING_GATE == 8 && DECODE_BINDINGS == 9,
                  "the binding lists below follow the contract's order");
    static_assert(row_matches<decode_push, decode_spec>(shader_id::sdpa_decode_cpu, "tttssssss") &&
                      row_matches<decode_push, decode_spec>(shader_id::sdpa_decode_cpu_shuffle, "tttssssss") &&
                      row_matches<decode_push, decode_spec>(shader_id::sdpa_decode_gpu, "tttssssss"),
                  "Q, K and V are uniform texel buffers, the rest storage buffers");
    static_assert(row_matches<decode_push, decode_spec>(shader_id::sdpa_decode_cpu_blocks, "tssssssss") &&
                      row_matches<decode_push, decode_spec>(shader_id::sdpa_decode_cpu_shuffle_blocks, "tssssssss") &&
                      row_matches<decode_push, decode_spec>(shader_id::sdpa_decode_gpu_blocks, "tssssssss"),
                  "Q is a uniform texel buffer, K and V blocks in storage buffers");
    const std::uint32_t groups[3] = {plan.row_blocks * plan.chunks, 1, plan.groups};
    if (values == decode_values::gated && !io.gate.buffer)
        throw error("internal: a gated decode without its gate word");
    const pipeline& kernel = pipes.get(id, plan.spec(values));
    if (blocks)
        exec.dispatch(kernel,
                      {texel(io.q), io.k_blocks, io.v_blocks, io.mask, io.additive, io.stats, io.acc, io.params, gate},
                      &push, groups);
    else
        exec.dispatch(kernel,
                      {texel(io.q), texel(io.k), texel(io.v), io.mask, io.additive, io.stats, io.acc, io.params, gate},
                      &push, groups);
    exec.compute_barrier();

    decode_merge_push m{};
    m.rows = plan.rows;
    m.q_len = plan.q_len;
    m.chunks = plan.chunks;
    m.dv = plan.dv;
    m.dv_stride = plan.ev4 * 4;
    m.groups = plan.groups;
    m.q_heads = plan.q_heads;
    m.causal_offset = push.causal_offset;
    m.kv_len = push.kv_len;
    static_assert(MERGE_BINDING_STATS == 0 && MERGE_BINDING_ACC == 1 && MERGE_BINDING_OUT == 2 &&
                  MERGE_BINDING_PARAMS == 3 && MERGE_BINDING_LSE == 4 && MERGE_BINDINGS == 5 &&
                  row_matches<decode_merge_push, no_spec>(shader_id::sdpa_merge, "sssss"));
    const pipeline& merge = pipes.get(shader_id::sdpa_merge);
    const std::uint32_t merge_groups[3] = {ceil_div(std::uint64_t{plan.groups} * plan.rows * plan.dv, MERGE_WORKGROUP),
                                           1, 1};
    const binding lse = io.lse.buffer != VK_NULL_HANDLE ? io.lse : io.out;  // written with SCORE_LSE only
    exec.dispatch(merge, {io.stats, io.acc, io.out, io.params, lse}, &m, merge_groups);
}

}  // namespace qkv::vulkan::detail
