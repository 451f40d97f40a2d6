#include "kernels/tensor_ops.hpp"

#include <string>

#include "contract/flash.h"
#include "plan/buffers.hpp"
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
                       binding dst, std::uint32_t dst_off, std::uint32_t dst_rs, std::uint32_t rows, std::uint32_t cols,
                       bool half) {
    const std::uint64_t count = std::uint64_t{rows} * cols;
    if (count >= (std::uint64_t{1} << 32)) throw limit_exceeded("a tensor copy of more than 2^32 - 1 elements");
    contract::tensor_copy_push push{};
    push.rows = rows, push.cols = cols, push.src_off = src_off, push.src_rs = src_rs, push.dst_off = dst_off,
    push.dst_rs = dst_rs;
    const std::uint32_t groups[3] = {
        ceil_div(count, std::uint64_t{contract::TENSOR_COPY_WORKGROUP} * contract::TENSOR_COPY_PER_INVOCATION), 1, 1};
    rec.dispatch(pipes.get(half ? shader_id::tensor_copy_16 : shader_id::tensor_copy), {src, dst}, &push, groups);
}

void record_tensor_widen(recorder& rec, pipeline_set& pipes, binding src, std::uint64_t src_byte, element_type type,
                         binding dst, std::uint64_t dst_off, std::uint64_t rows, std::uint64_t cols) {
    static_assert(contract::TENSOR_WIDEN_BINDING_SRC == 0 && contract::TENSOR_WIDEN_BINDING_DST == 1 &&
                  row_matches<contract::tensor_widen_push, no_spec>(shader_id::tensor_widen, "ss"));
    const std::uint64_t count = rows * cols;
    const std::uint64_t row_bytes = bytes_for(type, cols);
    if (count >= (std::uint64_t{1} << 32) || src_byte + rows * row_bytes >= (std::uint64_t{1} << 32) ||
        dst_off + count >= (std::uint64_t{1} << 32))
        throw limit_exceeded("a tensor read as float32 of more than 2^32 - 1 values or bytes (" +
                             std::to_string(count) + " values)");
    // The shader reads the source as 32-bit words, the word holding its last bytes included: a
    // binding that ends mid-word (a caller's buffer range that stops there) would make that a read
    // past the binding, which returns anything (robust access: zero) for the last values.
    const std::uint64_t end = align_up(src_byte + rows * row_bytes, 4);
    if (src.range != VK_WHOLE_SIZE && src.range < end)
        throw qkv::invalid_argument("a " + std::string(to_string(type)) + " tensor of " +
                                    std::to_string(rows * row_bytes) +
                                    " bytes that ends mid 32-bit word is read as whole words, and its buffer range "
                                    "stops " +
                                    std::to_string(end - src.range) +
                                    " byte(s) short of the word's end: wrap it with a range reaching the next "
                                    "multiple of 4 bytes");
    contract::tensor_widen_push push{};
    push.rows = static_cast<std::uint32_t>(rows), push.cols = static_cast<std::uint32_t>(cols);
    push.src_byte = static_cast<std::uint32_t>(src_byte), push.src_row_bytes = static_cast<std::uint32_t>(row_bytes);
    push.dst_off = static_cast<std::uint32_t>(dst_off);
    switch (type) {
        case element_type::f16:
            push.format = contract::WIDEN_F16;
            break;
        case element_type::q8_0:
            push.format = contract::WIDEN_Q8_0;
            break;
        case element_type::q4_0:
            push.format = contract::WIDEN_Q4_0;
            break;
        default:
            throw error("internal: tensor_widen reads f16, q8_0 or q4_0, not " + std::string(to_string(type)));
    }
    const std::uint32_t groups[3] = {ceil_div(count, contract::TENSOR_WIDEN_WORKGROUP), 1, 1};
    rec.dispatch(pipes.get(shader_id::tensor_widen), {src, dst}, &push, groups);
}

void record_texel_pack(recorder& rec, pipeline_set& pipes, binding src, binding dst, binding flags,
                       const texel_pack& t) {
    static_assert(
        row_matches<contract::flash_pack_push, contract::flash_pack_spec>(shader_id::flash_cpu_pack, "sss") &&
        row_matches<contract::flash_pack_push, contract::flash_pack_spec>(shader_id::flash_cpu_pack_f16, "sss"));
    constexpr std::uint32_t workgroup = 64;
    contract::flash_pack_push pk{};
    pk.rows = t.rows, pk.npad = t.rows, pk.width = t.width, pk.w4 = t.w4;
    pk.bs = 0, pk.off = t.src_off;  // groups as "heads" of one batch
    pk.hs = t.group_stride ? t.group_stride : t.rows * t.width;
    pk.rs = t.row_stride ? t.row_stride : t.width;
    pk.heads = t.groups;
    pk.at = t.at;
    pk.mark_nonfinite = 0;
    pk.stride = t.stride;
    const std::uint32_t groups[3] = {ceil_div(std::uint64_t{t.rows} * t.w4, workgroup), 1, t.groups};
    const pipeline& p = pipes.get(t.half ? shader_id::flash_cpu_pack_f16 : shader_id::flash_cpu_pack,
                                  contract::flash_pack_spec{workgroup, t.texels_half ? 1u : 0u});
    rec.dispatch(p, {src, dst, flags}, &pk, groups);
}

void record_guard(recorder& rec, pipeline_set& pipes, binding q, binding k, binding v, binding result,
                  const guard_rows* rows, const guard_output* output) {
    static_assert(contract::SDPA_GUARD_BINDING_Q == 0 && contract::SDPA_GUARD_BINDING_K == 1 &&
                  contract::SDPA_GUARD_BINDING_V == 2 && contract::SDPA_GUARD_BINDING_OUT == 3 &&
                  contract::SDPA_GUARD_BINDING_RESULT == 4 &&
                  row_matches<contract::sdpa_guard_push, no_spec>(shader_id::sdpa_guard, "sssss") &&
                  row_matches<contract::sdpa_guard_push, no_spec>(shader_id::sdpa_guard_f16, "sssss"));
    if (!rows && !output) return;
    contract::sdpa_guard_push push{};
    push.q_len = push.kv_len = 1;
    std::uint64_t invocations = 0;
    bool half = false;
    if (rows) {
        const guard_rows& r = *rows;
        if (r.d > 4096 || r.dv > 4096)
            throw limit_exceeded("the overflow guard reads rows of at most 4096 values (d = " + std::to_string(r.d) +
                                 ", dv = " + std::to_string(r.dv) + ")");
        push.pass |= contract::GUARD_PASS_ROWS;
        push.q_rows = r.q_rows, push.k_rows = r.k_rows, push.q_len = r.q_len, push.kv_len = r.kv_len;
        push.d = r.d, push.dv = r.dv;
        push.q_off = r.q_off, push.k_off = r.k_off, push.v_off = r.v_off;
        invocations += std::uint64_t{r.q_rows} + 2ull * r.k_rows;
        half = r.half;
    }
    binding out = result;
    if (output) {
        push.pass |= contract::GUARD_PASS_OUTPUT;
        push.out_count = output->count, push.out_off = output->off;
        invocations += ceil_div(output->count, contract::GUARD_OUTPUTS_PER_INVOCATION);
        out = output->out;
    }
    // The shader indexes its invocations in 32 bits (rows first, then output elements).
    if (invocations + contract::SDPA_GUARD_WORKGROUP > 0xffffffffull ||
        (output && std::uint64_t{output->count} + 2ull * contract::GUARD_OUTPUTS_PER_INVOCATION > 0xffffffffull))
        throw limit_exceeded("the overflow guard covers at most 2^32 - 65 rows and output elements (" +
                             std::to_string(invocations) + " asked)");
    const std::uint32_t groups[3] = {ceil_div(invocations, contract::SDPA_GUARD_WORKGROUP), 1, 1};
    rec.dispatch(pipes.get(half ? shader_id::sdpa_guard_f16 : shader_id::sdpa_guard), {q, k, v, out, result}, &push,
                 groups);
}

void record_guard_rows(recorder& rec, pipeline_set& pipes, binding q, binding k, binding v, binding result,
                       const guard_rows& rows) {
    record_guard(rec, pipes, q, k, v, result, &rows, nullptr);
}

void record_guard_output(recorder& rec, pipeline_set& pipes, binding out, std::uint32_t out_off, std::uint32_t count,
                         binding result) {
    const guard_output o{out, out_off, count};
    record_guard(rec, pipes, result, result, result, result, nullptr, &o);
}

}  // namespace qkv::vulkan::detail
