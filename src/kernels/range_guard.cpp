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

bool all_finite(std::span<const float> values) {
    // Branch-free over the bits, so the compiler can vectorise it: exponent all ones = inf or NaN.
    std::uint32_t bad = 0;
    for (const float f : values) {
        const auto u = std::bit_cast<std::uint32_t>(f);
        bad |= static_cast<std::uint32_t>((u & 0x7f800000u) == 0x7f800000u);
    }
    return bad == 0;
}

/// The largest Euclidean norm of the rows of a row-major matrix `cols` wide, in float64: +inf or
/// NaN where an element is not finite (a float's square cannot overflow a double).
double largest_row_norm(std::span<const float> m, std::size_t cols) {
    double largest = 0.0;
    for (std::size_t at = 0; cols > 0 && at + cols <= m.size(); at += cols) {
        double s[4] = {0.0, 0.0, 0.0, 0.0};  // four independent sums, so the loop vectorises
        std::size_t k = 0;
        for (; k + 4 <= cols; k += 4)
            for (std::size_t j = 0; j < 4; ++j) s[j] += static_cast<double>(m[at + k + j]) * m[at + k + j];
        for (; k < cols; ++k) s[0] += static_cast<double>(m[at + k]) * m[at + k];
        const double row = (s[0] + s[1]) + (s[2] + s[3]);
        if (!std::isfinite(row)) return row;  // inf or NaN: some element is not finite
        largest = std::max(largest, row);
    }
    return std::sqrt(largest);
}

/// The squared Euclidean norm of each column of a row-major matrix `cols` wide, in float64.
std::vector<double> column_squares(std::span<const float> m, std::size_t cols) {
    std::vector<double> s(cols, 0.0);
    for (std::size_t at = 0; cols > 0 && at + cols <= m.size(); at += cols)
        for (std::size_t c = 0; c < cols; ++c) s[c] += static_cast<double>(m[at + c]) * m[at + c];
    return s;
}

const char* advice(const plan& p) {
    return p.fp16 ? "use precision fp32 instead of fp16, scale the inputs down, or use the float64 cpu backend "
                    "(qkv::cpu::attention; qkv attention --backend cpu)"
                  : "scale the inputs down, or use the float64 cpu backend (qkv::cpu::attention; qkv attention "
                    "--backend cpu)";
}

/// The exact (float64) value of element `col` of projected row `row`: Q, K or V.
double exact_projection(const attention_problem& problem, std::size_t row, std::size_t col) {
    const attention_shape& s = problem.shape;
    std::span<const float> w = problem.wq, b = problem.bq;
    std::size_t width = s.d_k;
    if (col >= 2 * s.d_k) {
        col -= 2 * s.d_k;
        w = problem.wv, b = problem.bv, width = s.d_v;
    } else if (col >= s.d_k) {
        col -= s.d_k;
        w = problem.wk, b = problem.bk;
    }
    double sum = b.empty() ? 0.0 : static_cast<double>(b[col]);
    for (std::size_t k = 0; k < s.d_in; ++k)
        sum += static_cast<double>(problem.x[row * s.d_in + k]) * static_cast<double>(w[k * width + col]);
    return sum;
}

[[noreturn]] void nonfinite_projection(const plan& p, const attention_problem* problem, std::uint32_t index) {
    const std::size_t row = index / p.ld, col = index % p.ld;
    const std::size_t b = row / p.seq, i = row % p.seq;
    const char* which = col < p.d_k ? "Q" : col < 2ull * p.d_k ? "K" : "V";
    const std::size_t c = col < p.d_k ? col : col < 2ull * p.d_k ? col - p.d_k : col - 2ull * p.d_k;
    const std::string where = std::string("numeric overflow in the Q|K|V projection: ") + which + "[batch " +
                              std::to_string(b) + ", position " + std::to_string(i) + ", column " + std::to_string(c) +
                              "]";
    if (!problem)  // device tensors: the host never saw the inputs
        throw numeric_overflow(where + " is not finite in " + (p.fp16 ? "float16" : "float32") +
                               " though every input is finite; " + advice(p));
    const double exact = exact_projection(*problem, row, col);
    const double limit = p.fp16 ? 65504.0 : float_max;
    std::string message = where + " is " + format_number(exact) + " (computed in float64)";
    if (std::fabs(exact) > limit)
        message += p.fp16 ? ", beyond float16's largest value 65504, so it cannot be stored in fp16"
                          : ", beyond float32's largest value " + format_number(float_max);
    else
        message += ", but its float32 sum over d_in overflowed on the way (a partial sum beyond " +
                   format_number(float_max) + ")";
    throw numeric_overflow(message + "; every input is finite; " + advice(p));
}

}  // namespace

input_facts scan_inputs(const attention_problem& problem) {
    input_facts f;
    // One pass over x gives both its finiteness and the norm that range_proven_on_host needs.
    f.x_row_norm = largest_row_norm(problem.x, problem.shape.d_in);
    f.projection_inputs_finite = std::isfinite(f.x_row_norm) && all_finite(problem.wq) && all_finite(problem.wk) &&
                                 all_finite(problem.wv) && all_finite(problem.bq) && all_finite(problem.bk) &&
                                 all_finite(problem.bv);
    f.output_inputs_finite = all_finite(problem.wo) && all_finite(problem.bo);
    float largest = 0.0f;
    bool poison = false;
    for (const float a : problem.additive_mask) {
        const float m = std::fabs(a);
        if (m <= FLT_MAX) {
            largest = std::max(largest, m);
        } else if (!(a < 0.0f)) {
            poison = true;  // NaN or +inf (-inf masks)
        }
    }
    f.additive_max = largest;
    f.additive_nan_or_pos_inf = poison;
    return f;
}

bool range_proven_on_host(const plan& p, const attention_problem& problem, const input_facts& facts) {
    if (!facts.projection_inputs_finite) return false;  // the documented NaN rules: the device's verdicts
    // float16 rounds every partial sum of a split projection once more: leave those to the device.
    if (p.fp16 && p.project.chunk_k < p.d_in) return false;
    const double x = facts.x_row_norm;
    // The device's float32 sums differ from the exact ones by at most (d_in + 1)·2^-24 of the sum
    // of |terms| (plus the bias), which Cauchy-Schwarz bounds too; float16 storage rounds once more
    // (2^-11). The margin covers both, and the float64 arithmetic here, with room to spare.
    const double margin = (1.0 + (static_cast<double>(p.d_in) + 8.0) * 0x1p-23) * (p.fp16 ? 1.0 + 0x1p-10 : 1.0);
    double element = 0.0, q = 0.0, k = 0.0, v = 0.0;  // bounds on |element|, ||q_i||, ||k_j||, |v_jc|
    // One of Q, K, V: `w` d_in x width, `b` empty or width; heads of width / p.heads columns.
    const auto bound = [&](std::span<const float> w, std::span<const float> b, std::uint32_t width, double* norm) {
        const std::vector<double> cols = column_squares(w, width);
        const std::uint32_t head_width = width / p.heads;
        for (std::uint32_t h = 0; h < p.heads; ++h) {
            double w_sq = 0.0, b_sq = 0.0;
            for (std::uint32_t c = h * head_width; c < (h + 1) * head_width; ++c) {
                const double bias = b.empty() ? 0.0 : std::fabs(static_cast<double>(b[c]));
                const double e = x * std::sqrt(cols[c]) + bias;
                element = std::max(element, e);
                if (!norm) v = std::max(v, e);
                w_sq += cols[c];
                b_sq += bias * bias;
            }
            if (norm) *norm = std::max(*norm, x * std::sqrt(w_sq) + std::sqrt(b_sq));
        }
    };
    bound(problem.wq, problem.bq, p.d_k, &q);
    bound(problem.wk, problem.bk, p.d_k, &k);
    bound(problem.wv, problem.bv, p.d_v, nullptr);
    element *= margin, q *= margin, k *= margin, v *= margin;
    const double scale = std::max(1.0, std::fabs(static_cast<double>(p.scale)));
    const double scores = scale * q * k;
    const bool elements = element <= (p.fp16 ? 65504.0 : score_limit);  // check 1 (every partial sum too)
    const bool rows = scale * std::max(q, k) <= score_limit;            // check 2: Q or K scaled first,
    const bool dots = scores <= score_limit && scores + facts.additive_max <= sum_limit;  // and the scores
    const bool sums = static_cast<double>(p.seq) * v <= score_limit;                      // check 3
    return elements && rows && dots && sums;
}

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

void check_outputs(const attention_output& result, const plan& p, const input_facts& facts) {
    if (!facts.every_output_defined()) return;
    const auto bad = [](float f) { return !std::isfinite(f); };
    if (const auto it = std::find_if(result.output.begin(), result.output.end(), bad); it != result.output.end()) {
        const std::size_t index = static_cast<std::size_t>(it - result.output.begin());
        const std::size_t width = result.shape.out_width();
        throw numeric_overflow("numeric overflow: output[batch " + std::to_string(index / width / p.seq) +
                               ", position " + std::to_string(index / width % p.seq) + ", column " +
                               std::to_string(index % width) + "] is " + format_number(*it) +
                               " though every input is finite (" +
                               (p.d_out ? "the output projection or an earlier float32 sum" : "a float32 sum") +
                               " left float32's range); " + advice(p));
    }
    if (std::any_of(result.weights.begin(), result.weights.end(), bad))
        throw numeric_overflow(std::string("numeric overflow: a returned attention weight is not finite though every "
                                           "input is finite; ") +
                               advice(p));
}

}  // namespace qkv::vulkan::detail
