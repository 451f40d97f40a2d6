#include "kernels/tensor_ops.hpp"

#include "contract/flash.h"
#include "qkv/vulkan/error.hpp"

namespace qkv::vulkan::detail {
namespace {

std::uint32_t ceil_div(std::uint64_t a, std::uint64_t b) { return static_cast<std::uint32_t>((a + b - 1) / b); }

}  // namespace

void record_tensor_copy(recorder& rec, pipeline_set& pipes, binding src, std::uint32_t src_off, binding dst,
                        std::uint32_t dst_off, std::uint32_t count, bool half) {
    static_assert(contract::TENSOR_COPY_BINDING_SRC == 0 && contract::TENSOR_COPY_BINDING_DST == 1 &&
                  row_matches<contract::tensor_copy_push, no_spec>(shader_id::tensor_copy, "ss") &&
                  row_matches<contract::tensor_copy_push, no_spec>(shader_id::tensor_copy_16, "ss"));
    contract::tensor_copy_push push{};
    push.rows = 1, push.cols = count, push.src_off = src_off, push.src_rs = count, push.dst_off = dst_off,
    push.dst_rs = count;
    const std::uint32_t groups[3] = {
        ceil_div(count, std::uint64_t{contract::TENSOR_COPY_WORKGROUP} * contract::TENSOR_COPY_PER_INVOCATION), 1, 1};
    rec.dispatch(pipes.get(half ? shader_id::tensor_copy_16 : shader_id::tensor_copy), {src, dst}, &push, groups);
}

void record_block_copy(recorder& rec, pipeline_set& pipes, binding src, std::uint32_t src_off, std::uint32_t src_rs,
                       binding dst, std::uint32_t dst_off, std::uint32_t dst_rs, std::uint32_t rows,
                       std::uint32_t cols) {
    const std::uint64_t count = std::uint64_t{rows} * cols;
    if (count >= (std::uint64_t{1} << 32)) throw limit_exceeded("a tensor copy of more than 2^32 - 1 elements");
    contract::tensor_copy_push push{};
    push.rows = rows, push.cols = cols, push.src_off = src_off, push.src_rs = src_rs, push.dst_off = dst_off,
    push.dst_rs = dst_rs;
    const std::uint32_t groups[3] = {
        ceil_div(count, std::uint64_t{contract::TENSOR_COPY_WORKGROUP} * contract::TENSOR_COPY_PER_INVOCATION), 1, 1};
    rec.dispatch(pipes.get(shader_id::tensor_copy), {src, dst}, &push, groups);
}

void record_texel_pack(recorder& rec, pipeline_set& pipes, binding src, binding dst, binding flags,
                       const texel_pack& t) {
    static_assert(
        row_matches<contract::flash_pack_push, contract::flash_pack_spec>(shader_id::flash_cpu_pack, "sss") &&
        row_matches<contract::flash_pack_push, contract::flash_pack_spec>(shader_id::flash_cpu_pack_f16, "sss"));
    constexpr std::uint32_t workgroup = 64;
    contract::flash_pack_push pk{};
    pk.rows = t.rows, pk.npad = t.rows, pk.width = t.width, pk.w4 = t.w4;
    pk.bs = 0, pk.hs = t.rows * t.width, pk.rs = t.width, pk.off = t.src_off;  // groups as "heads" of one batch
    pk.heads = t.groups;
    pk.at = t.at;
    pk.mark_nonfinite = 0;
    pk.stride = t.stride;
    const std::uint32_t groups[3] = {ceil_div(std::uint64_t{t.rows} * t.w4, workgroup), 1, t.groups};
    const pipeline& p = pipes.get(t.half ? shader_id::flash_cpu_pack_f16 : shader_id::flash_cpu_pack,
                                  contract::flash_pack_spec{workgroup, t.half ? 1u : 0u});
    rec.dispatch(p, {src, dst, flags}, &pk, groups);
}

void record_guard_rows(recorder& rec, pipeline_set& pipes, binding q, binding k, binding v, binding result,
                       const guard_rows& r) {
    static_assert(contract::SDPA_GUARD_BINDING_RESULT == 4 &&
                  row_matches<contract::sdpa_guard_push, no_spec>(shader_id::sdpa_guard, "sssss") &&
                  row_matches<contract::sdpa_guard_push, no_spec>(shader_id::sdpa_guard_f16, "sssss"));
    if (r.d > 4096 || r.dv > 4096)
        throw limit_exceeded("the overflow guard reads rows of at most 4096 values (d = " + std::to_string(r.d) +
                             ", dv = " + std::to_string(r.dv) + ")");
    contract::sdpa_guard_push push{};
    push.pass = contract::GUARD_PASS_ROWS;
    push.q_rows = r.q_rows, push.k_rows = r.k_rows, push.q_len = r.q_len, push.kv_len = r.kv_len;
    push.d = r.d, push.dv = r.dv;
    push.q_off = r.q_off, push.k_off = r.k_off, push.v_off = r.v_off;
    const std::uint64_t rows = std::uint64_t{r.q_rows} + 2ull * r.k_rows;
    const std::uint32_t groups[3] = {ceil_div(rows, contract::SDPA_GUARD_WORKGROUP), 1, 1};
    rec.dispatch(pipes.get(r.half ? shader_id::sdpa_guard_f16 : shader_id::sdpa_guard), {q, k, v, result, result},
                 &push, groups);
}

void record_guard_output(recorder& rec, pipeline_set& pipes, binding out, std::uint32_t out_off, std::uint32_t count,
                         binding result) {
    contract::sdpa_guard_push push{};
    push.pass = contract::GUARD_PASS_OUTPUT;
    push.q_len = push.kv_len = 1;
    push.out_count = count, push.out_off = out_off;
    const std::uint32_t groups[3] = {ceil_div(count, contract::SDPA_GUARD_WORKGROUP), 1, 1};
    rec.dispatch(pipes.get(shader_id::sdpa_guard), {result, result, result, out, result}, &push, groups);
}

}  // namespace qkv::vulkan::detail
