#include "kernels/sdpa_decode.hpp"

#include <algorithm>
#include <string>

#include "kernels/gemm_tiles.hpp"
#include "qkv/vulkan/error.hpp"

namespace qkv::vulkan::detail {
namespace {

using namespace qkv::contract;

std::uint32_t ceil_div(std::uint64_t a, std::uint64_t b) { return static_cast<std::uint32_t>((a + b - 1) / b); }

/// Whether the decode kernel runs the guard's rows pass over q (merge_guard::q_texels).
bool rows_in_kernel(const decode_plan& plan, const decode_io& io) {
    return io.guard && io.guard->q_rows == std::uint64_t{plan.groups} * plan.rows && io.guard->q_texels &&
           plan.family != kernel_family::coopmat;
}

void record_decode_kernel(recorder& exec, pipeline_set& pipes, const decode_plan& plan, const decode_io& io,
                          const contract::decode_push& push, decode_values values, bool blocks) {
    const shader_id id = plan.family != kernel_family::row_tiles
                             ? (blocks ? shader_id::sdpa_decode_gpu_blocks : shader_id::sdpa_decode_gpu)
                         : plan.shuffle
                             ? (blocks ? shader_id::sdpa_decode_cpu_shuffle_blocks : shader_id::sdpa_decode_cpu_shuffle)
                             : (blocks ? shader_id::sdpa_decode_cpu_blocks : shader_id::sdpa_decode_cpu);
    const binding gate = io.gate.buffer ? io.gate : io.params;  // read only when gated
    const bool guard = rows_in_kernel(plan, io);
    const binding words = guard ? io.guard->result : io.params;  // read only with the guard
    static_assert(DECODE_BINDING_Q == 0 && DECODE_BINDING_K == 1 && DECODE_BINDING_V == 2 && DECODE_BINDING_MASK == 3 &&
                      DECODE_BINDING_ADDITIVE == 4 && DECODE_BINDING_STATS == 5 && DECODE_BINDING_ACC == 6 &&
                      DECODE_BINDING_PARAMS == 7 && DECODE_BINDING_GATE == 8 && DECODE_BINDING_GUARD == 9 &&
                      DECODE_GUARD_BINDINGS == 10,
                  "the binding lists below follow the contract's order");
    static_assert(row_matches<decode_push, decode_spec>(shader_id::sdpa_decode_cpu, "tttsssssss") &&
                      row_matches<decode_push, decode_spec>(shader_id::sdpa_decode_cpu_shuffle, "tttsssssss") &&
                      row_matches<decode_push, decode_spec>(shader_id::sdpa_decode_gpu, "tttsssssss"),
                  "Q, K and V are uniform texel buffers, the rest storage buffers");
    static_assert(row_matches<decode_push, decode_spec>(shader_id::sdpa_decode_cpu_blocks, "tsssssssss") &&
                      row_matches<decode_push, decode_spec>(shader_id::sdpa_decode_cpu_shuffle_blocks, "tsssssssss") &&
                      row_matches<decode_push, decode_spec>(shader_id::sdpa_decode_gpu_blocks, "tsssssssss"),
                  "Q is a uniform texel buffer, K and V blocks in storage buffers");
    const std::uint32_t groups[3] = {plan.row_blocks * plan.chunks, 1, plan.groups};
    if (values == decode_values::gated && !io.gate.buffer)
        throw error("internal: a gated decode without its gate word");
    const pipeline& kernel = pipes.get(id, plan.spec(values, guard));
    if (blocks)
        exec.dispatch(
            kernel,
            {texel(io.q), io.k_blocks, io.v_blocks, io.mask, io.additive, io.stats, io.acc, io.params, gate, words},
            &push, groups);
    else
        exec.dispatch(
            kernel,
            {texel(io.q), texel(io.k), texel(io.v), io.mask, io.additive, io.stats, io.acc, io.params, gate, words},
            &push, groups);
}

void record_merge(recorder& exec, pipeline_set& pipes, const decode_plan& plan, const decode_io& io,
                  const contract::decode_push& push) {
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
                  MERGE_BINDING_PARAMS == 3 && MERGE_BINDING_LSE == 4 && MERGE_BINDINGS == 5 && MERGE_BINDING_Q == 5 &&
                  MERGE_BINDING_RESULT == 6 && MERGE_GUARD_BINDINGS == 7 &&
                  row_matches<decode_merge_push, no_spec>(shader_id::sdpa_merge, "sssss") &&
                  row_matches<decode_merge_guard_push, no_spec>(shader_id::sdpa_merge_guard, "sssssss") &&
                  row_matches<decode_merge_guard_push, no_spec>(shader_id::sdpa_merge_guard_f16, "sssssss") &&
                  row_matches<decode_merge_guard_push, no_spec>(shader_id::sdpa_merge_guard_vote, "sssssss") &&
                  row_matches<decode_merge_guard_push, no_spec>(shader_id::sdpa_merge_guard_vote_f16, "sssssss"));
    const std::uint32_t merge_groups[3] = {ceil_div(std::uint64_t{plan.groups} * plan.rows * plan.dv, MERGE_WORKGROUP),
                                           1, 1};
    const binding lse = io.lse.buffer != VK_NULL_HANDLE ? io.lse : io.out;  // written with SCORE_LSE only
    if (const merge_guard* g = io.guard) {
        // Its rows pass (where the kernel did not run it) within the merge's invocations: one per
        // row of q at most.
        if (g->q_rows > std::uint64_t{plan.groups} * plan.rows)
            throw error("internal: a merge guard over more rows of q than the merge has outputs");
        decode_merge_guard_push gp{};
        gp.merge = m;
        gp.q_rows = rows_in_kernel(plan, io) ? 0u : g->q_rows, gp.d = g->d, gp.q_off = g->q_off;
        const shader_id id = plan.vote
                                 ? (g->half ? shader_id::sdpa_merge_guard_vote_f16 : shader_id::sdpa_merge_guard_vote)
                                 : (g->half ? shader_id::sdpa_merge_guard_f16 : shader_id::sdpa_merge_guard);
        const pipeline& merge = pipes.get(id);
        exec.dispatch(merge, {io.stats, io.acc, io.out, io.params, lse, g->q, g->result}, &gp, merge_groups);
        return;
    }
    const pipeline& merge = pipes.get(shader_id::sdpa_merge);
    exec.dispatch(merge, {io.stats, io.acc, io.out, io.params, lse}, &m, merge_groups);
}

/// The cooperative-matrix kernel's view of the decode route's float16 rows: Q rows of e4·4 halves,
/// row z·R + r being (batch, head, row) of q; K and V rows kv_stride per group (the cache's
/// capacity); the masks, scale and causal offset of the push block.
flash_layout coop_decode_layout(const decode_plan& plan, const decode_push& push) {
    flash_layout l;
    const std::uint32_t w = plan.e4 * 4, wv = plan.ev4 * 4;
    l.kv_heads = push.kv_heads, l.heads = push.q_heads, l.batch = plan.groups / push.kv_heads;
    l.q_len = plan.q_len, l.kv_len = plan.kv_len, l.d = plan.d, l.dv = plan.dv;
    l.q = {push.q_heads * plan.q_len * w, plan.q_len * w, w};
    l.k = {push.kv_heads * plan.kv_stride * w, plan.kv_stride * w, w};
    l.v = {push.kv_heads * plan.kv_stride * wv, plan.kv_stride * wv, wv};
    l.m_bs = l.a_bs = push.mask_b, l.m_hs = push.mask_h, l.m_rs = push.mask_i, l.m_cs = push.mask_j;
    l.causal = (plan.masks & MASK_FLAG_CAUSAL) != 0, l.mask = (plan.masks & MASK_FLAG_BOOLEAN) != 0;
    l.additive = (plan.masks & MASK_FLAG_ADDITIVE) != 0;
    l.causal_offset = push.causal_offset;
    l.scale = push.scale;
    l.fp16 = true;
    l.features = plan.features;
    return l;
}

}  // namespace

void record_decode(recorder& exec, pipeline_set& pipes, const decode_plan& plan, const decode_io& io,
                   const contract::decode_push& push, decode_values values) {
    const bool blocks = plan.kv_format != DECODE_KV_TEXELS;
    if (plan.family == kernel_family::coopmat) {
        if (!io.rows.q.buffer || !io.rows.k.buffer || !io.rows.v.buffer || push.v_scale != 1.0f)
            throw error("internal: a cooperative-matrix decode without its float16 rows, or with scaled values");
        coop_decode_io c;
        c.q = io.rows.q, c.k = io.rows.k, c.v = io.rows.v;
        c.q_off = io.rows.q_off, c.k_off = io.rows.k_off, c.v_off = io.rows.v_off;
        c.mask = io.mask, c.additive = io.additive, c.params = io.params, c.stats = io.stats, c.acc = io.acc;
        record_coop_decode(exec, pipes, coop_decode_layout(plan, push), plan.coop, plan.kv_first, plan.kv_end,
                           plan.chunk, plan.chunks, c, values == decode_values::finite);
    } else {
        record_decode_kernel(exec, pipes, plan, io, push, values, blocks);
    }
    record_merge(exec, pipes, plan, io, push);
}

}  // namespace qkv::vulkan::detail
