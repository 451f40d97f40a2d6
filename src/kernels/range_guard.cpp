#include "kernels/range_guard.hpp"

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "kernels/range_rule.hpp"
#include "qkv/vulkan/error.hpp"

namespace qkv::vulkan::detail {
namespace {

using contract::range_guard_push;  // shaders/contract/range_guard.h

constexpr std::uint32_t chunk_columns = 4096;  // 2 x 4096 loop iterations per row at most
constexpr std::uint64_t loop_budget = 60000;   // loop iterations per invocation (llvmpipe: 65,535)
constexpr std::uint64_t rows_target = 512;     // invocations per (batch, segment) the rows are spread over
constexpr std::uint32_t workgroup = contract::RANGE_GUARD_WORKGROUP;
constexpr std::uint32_t header_words = contract::RANGE_GUARD_HEADER_WORDS;
constexpr std::uint32_t no_index = contract::RANGE_GUARD_NO_INDEX;
constexpr double two_to_32 = 4294967296.0;

std::uint32_t ceil_div(std::uint64_t a, std::uint64_t b) { return static_cast<std::uint32_t>((a + b - 1) / b); }

std::uint64_t result_bytes(const plan& p) { return 4 * (header_words + 3ull * p.batch * p.heads); }

}  // namespace

void prepare_range_guard(allocator& alloc, range_guard_buffers& bufs, const plan& p) {
    const std::uint64_t bytes = result_bytes(p);
    alloc.ensure(bufs.device, bytes, memory_use::device, "range guard result");
    alloc.ensure(bufs.host, bytes, memory_use::readback, "range guard readback");
}

void record_range_guard(recorder& exec, pipeline_set& pipes, const range_guard_buffers& bufs, const plan& p,
                        binding qkv) {
    const std::uint64_t bytes = result_bytes(p);
    auto* words = reinterpret_cast<std::uint32_t*>(bufs.host.mapped());
    std::fill(words, words + bytes / 4, 0u);
    words[0] = no_index;
    bufs.host.flush();

    range_guard_push push{};
    push.rows = p.batch * p.seq;
    push.seq = p.seq;
    push.ld = p.ld;
    push.heads = p.heads;
    push.d_k = p.d_k;
    push.dh = p.d_k / p.heads;
    push.dvh = p.d_v / p.heads;
    push.chunk = chunk_columns;
    push.chunks_k = ceil_div(push.dh, chunk_columns);
    push.chunks_v = ceil_div(push.dvh, chunk_columns);
    const std::uint64_t segments = std::uint64_t{p.heads} * (2ull * push.chunks_k + push.chunks_v);
    if (segments > 0xffffffffull) throw limit_exceeded("range guard: too many heads and chunks in one call");
    // Four elements per load where every row, head and column offset is a multiple of 4 (the
    // chunk, 4096, is one too).
    const bool vec4 = p.ld % 4 == 0 && p.d_k % 4 == 0 && push.dh % 4 == 0 && push.dvh % 4 == 0;
    // Rows per invocation: about rows_target invocations per (batch, segment), so that few of
    // them meet at the same result word, within the per-invocation loop budget.
    const std::uint64_t widest = std::min<std::uint64_t>(std::max(push.dh, push.dvh), chunk_columns);
    const std::uint64_t per_row = 2 * ((widest + (vec4 ? 3 : 0)) / (vec4 ? 4 : 1)) + 2;
    const std::uint64_t budget = std::max<std::uint64_t>(1, loop_budget / per_row);
    push.rows_per_invocation = static_cast<std::uint32_t>(
        std::clamp<std::uint64_t>((std::uint64_t{p.seq} + rows_target - 1) / rows_target, 1, budget));

    exec.copy(bufs.host.handle(), 0, bufs.device.handle(), 0, bytes);
    exec.barrier(VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                 VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT);
    static_assert(
        row_matches<contract::range_guard_push, contract::range_guard_spec>(shader_id::range_guard, "ss") &&
        row_matches<contract::range_guard_push, contract::range_guard_spec>(shader_id::range_guard_f16, "ss") &&
        row_matches<contract::range_guard_push, contract::range_guard_spec>(shader_id::range_guard_subgroup, "ss") &&
        row_matches<contract::range_guard_push, contract::range_guard_spec>(shader_id::range_guard_subgroup_f16, "ss"));
    const pipeline& pipe = pipes.get(p.range_guard, contract::range_guard_spec{vec4 ? 1u : 0u});
    const std::uint32_t groups[3] = {ceil_div(ceil_div(p.seq, push.rows_per_invocation), workgroup),
                                     static_cast<std::uint32_t>(segments), p.batch};
    exec.dispatch(pipe, {qkv, {bufs.device.handle(), 0, bytes}}, &push, groups);
    exec.barrier(VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT,
                 VK_ACCESS_TRANSFER_READ_BIT);
    exec.copy(bufs.device.handle(), 0, bufs.host.handle(), 0, bytes);
    exec.barrier(VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT, VK_PIPELINE_STAGE_HOST_BIT,
                 VK_ACCESS_HOST_READ_BIT);
}

void check_range_guard(const range_guard_buffers& bufs, const plan& p, const attention_problem* problem,
                       const input_facts& facts) {
    bufs.host.invalidate();
    const auto* words = reinterpret_cast<const std::uint32_t*>(bufs.host.mapped());
    if (words[0] != no_index && facts.projection_inputs_finite) nonfinite_projection(p, problem, words[0]);

    const std::uint32_t dh = p.d_k / p.heads;
    const double chunks = std::ceil(static_cast<double>(dh) / chunk_columns);
    // Rounding in the guard's own float32 norms (and in the kernels' sums): a relative margin.
    const double margin = 1.0 + (2.0 * std::min(dh, chunk_columns) + 16.0) * 0x1p-24;
    const double scale = std::max(1.0, std::fabs(static_cast<double>(p.scale)));
    const auto value_of = [&](std::size_t word) { return static_cast<double>(std::bit_cast<float>(words[word])); };
    for (std::uint32_t b = 0; b < p.batch; ++b)
        for (std::uint32_t h = 0; h < p.heads; ++h) {
            const std::size_t at = header_words + 3ull * (std::size_t{b} * p.heads + h);
            const double q = value_of(at) * two_to_32, k = value_of(at + 1) * two_to_32, v = value_of(at + 2);
            const double scores = scale * q * k * chunks * margin;
            // Kernels may multiply Q (or K) by the scale before the dot products.
            const double scaled_rows = scale * std::max(q, k) * std::sqrt(chunks) * margin;
            const std::string where = "batch " + std::to_string(b) + ", head " + std::to_string(h);
            if (std::string why = score_verdict({q, k, scaled_rows, scores}, p.scale, facts.additive_max, where);
                !why.empty())
                throw numeric_overflow(why + "; every input is finite; " + advice(p));
            const double values = static_cast<double>(p.seq) * v * margin;
            if (std::string why = value_verdict(p.seq, v, values, where); !why.empty())
                throw numeric_overflow(why + "; " + advice(p));
        }
}

}  // namespace qkv::vulkan::detail
